"""The kernel client of a recorded run: jupyter_client's AsyncKernelClient, except that `wait_for_ready`
ends when the kernel_info request's own `idle` status arrives on IOPub instead of after 0.2 s with no
IOPub message (a fixed 0.2 s per notebook, spent idle); and the kernel manager that starts warm kernels
(warm.py's `_kernel` stub) with that client. Imported by the notebook workers (and the warm process)."""
from __future__ import annotations

import sys
import time
from queue import Empty
from typing import Any, Callable

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

IOPUB_WAIT_S = 1.0  # for the kernel_info request's idle status; not seen: ask again (IOPub not yet connected)


def _is_idle_of(msg: dict[str, Any], msg_id: str) -> bool:
    """True for the `status: idle` IOPub message that closes request `msg_id`."""
    return (msg.get("msg_type") == "status" and (msg.get("content") or {}).get("execution_state") == "idle"
            and (msg.get("parent_header") or {}).get("msg_id") == msg_id)


class ReadyClient(AsyncKernelClient):
    """AsyncKernelClient whose ready check ends at its kernel_info request's idle status on IOPub."""

    @staticmethod
    async def _first(channel: Any, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """The first message on `channel` that `match`es within IOPUB_WAIT_S (others are passed over); else None."""
        deadline = time.monotonic() + IOPUB_WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await channel.get_msg(timeout=left)
            except Empty:
                return None
            if match(msg):
                return msg
        return None

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        """Ask for kernel_info until one request's idle status is seen on IOPub (so IOPub is connected,
        and the kernel answers), then take that request's reply from shell."""
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            msg_id = self.kernel_info()
            if await self._first(self.iopub_channel, lambda msg: _is_idle_of(msg, msg_id)) is not None:
                reply = await self._first(self.shell_channel,
                                          lambda msg: (msg.get("parent_header") or {}).get("msg_id") == msg_id)
                if reply is not None and reply["msg_type"] == "kernel_info_reply":
                    self._handle_kernel_info_reply(reply)
                    return
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")


class WarmKernelManager(AsyncKernelManager):
    """A jupyter KernelManager whose kernel command is warm.py's stub (`_kernel -f CONN`) and whose client is
    ReadyClient."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_factory = ReadyClient

    async def _async_finish_shutdown(self, waittime: float | None = None, pollinterval: float = 0.1,
                                     restart: bool = False) -> None:
        """jupyter_client's, looking for the kernel's exit every 10 ms rather than every 100 ms."""
        await super()._async_finish_shutdown(waittime, min(pollinterval, 0.01), restart)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return [sys.executable, "-m", "helpers.pipeline.run", "_kernel", "-f", self.connection_file]
