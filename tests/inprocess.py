"""One notebook executed in the test's own process into outputs/notebooks/ (no run record, no warm kernels): the
end-to-end tests' runner, the runner's own `_execute` (papermill, one retry of a kernel that died before replying)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from helpers.pipeline.paths import output_dir
from helpers.pipeline.run.execute import RunResult, _execute


def run_one(path: Path, parameters: dict[str, Any] | None = None) -> RunResult:
    """Execute one notebook in this process into outputs/notebooks/ (no run record); failures are returned."""
    out = output_dir("notebooks") / path.name
    start = time.perf_counter()
    error, retried = _execute(path, parameters or {}, out)
    return RunResult(path.stem, not error, round(time.perf_counter() - start, 2), str(out), error,
                     "failed" if error else "ok", retried=retried)
