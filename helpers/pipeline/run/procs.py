"""Process control for the runner: the process tree (psutil), stopping processes and their groups,
and the SIGINT/SIGTERM handler that only notes the signal (the run loops act on it)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Any


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (kernels run in sessions of their own, so killpg alone misses them)."""
    import psutil  # here, not at the top: the kernel stub imports this module and never needs it
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill(pids: list[int], sig: int) -> None:
    """Send `sig` to each process (to its group where it leads one); the ones gone already are passed over."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, is not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_processes(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM (to their groups), then SIGKILL what is still alive after `grace` seconds."""
    _kill(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    _kill([p for p in pids if _alive(p)], signal.SIGKILL)


def _connection_files(pid: int) -> list[str]:
    """The `-f <connection file>` a kernel was started with."""
    import psutil
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return []
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-f" and args[i + 1].endswith(".json")]


class Stop:
    """SIGINT/SIGTERM handlers that only note the signal (the run loop acts on it)."""

    def __init__(self, forward: bool = False) -> None:
        self.signum: int | None = None
        self.forward = forward  # pass the signal on to this process's children (the matrix's run-alls)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Stop":
        with contextlib.suppress(ValueError):  # not the main thread: no handlers, no interrupts
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            what = "no further release starts" if self.forward else "no further notebook starts"
            print(f"\n{signal.Signals(signum).name}: stopping; {what}", file=sys.stderr, flush=True)
        self.signum = self.signum or signum
        if self.forward:
            import psutil
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    child.send_signal(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


