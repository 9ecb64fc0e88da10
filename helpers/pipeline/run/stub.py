"""The kernel manager of a recorded run's notebooks: jupyter_client's, its kernel command warm.py's stub
(`_kernel -f CONN`), which asks the warm process to fork the kernel. Imported by the notebook workers (and the
warm process), never by the runner: jupyter_client is theirs."""
from __future__ import annotations

import sys

from jupyter_client.manager import AsyncKernelManager


class WarmKernelManager(AsyncKernelManager):
    """A jupyter KernelManager whose kernel command is warm.py's stub (`_kernel -f CONN`)."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return [sys.executable, "-m", "helpers.pipeline.run", "_kernel", "-f", self.connection_file]
