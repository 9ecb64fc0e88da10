"""Process control for the runner: the process tree from /proc, stopping processes and their groups,
and the SIGINT/SIGTERM handler that only notes the signal (the run loops act on it)."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _children() -> dict[int, list[int]]:
    """{ppid: [pid, ...]} from /proc (empty where there is no /proc)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else []:
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (kernels run in sessions of their own, so killpg alone misses them)."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat")
        return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")
    except (ProcessLookupError, PermissionError, OSError):
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
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-f" and args[i + 1].endswith(".json")]


class Stop:
    """SIGINT/SIGTERM handlers that only note the signal (the run loop acts on it)."""

    def __init__(self, forward: bool = False) -> None:
        self.signum: int | None = None
        self.forward = forward  # pass the signal on to this process's children (the matrix's run-alls)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Stop":
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._note)
        except ValueError:  # not the main thread: no handlers, no interrupts
            pass
        return self

    def _note(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            what = "no further release starts" if self.forward else "no further notebook starts"
            print(f"\n{signal.Signals(signum).name}: stopping; {what}", file=sys.stderr, flush=True)
        self.signum = self.signum or signum
        if self.forward:
            for pid in _children().get(os.getpid(), []):
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


