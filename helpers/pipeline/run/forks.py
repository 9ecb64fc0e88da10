"""Fork servers: a process that has imported what its children need forks one child per request on a
Unix socket (the request's stdio, cwd and environment handed over), says the child's pid, then its exit
code. A client going away ends its child; the server's parent going away ends them all."""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

from .procs import _alive, _kill

MAX_REQUEST = 1 << 24  # bytes of one request (its JSON: argv or connection file, cwd, environment)
Child = Callable[[dict[str, Any]], int]  # runs in the forked child, with its request; returns the exit code


def _become(conn: socket.socket, request: dict[str, Any], fds: list[int], mask: set[int]) -> None:
    """In the forked child: a session of its own, the client's stdio, cwd and environment; then the signals
    held since before the fork (`mask` is the mask to restore) are let through to the child's own handlers."""
    os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    conn.close()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _run_child(child: Child, conn: socket.socket, request: dict[str, Any], fds: list[int],
               mask: set[int]) -> NoReturn:
    code = 1
    try:
        _become(conn, request, fds, mask)
        code = child(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Server:
    """The accept / fork / reap loop of one fork server."""

    def __init__(self, path: str, child: Child) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(16)
        self.child = child
        self.conns: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.pidfds: dict[int, int] = {}  # pidfd -> child pid (where the kernel has pidfds: exits wake the loop)
        self.parent_fd: int | None = None

    def _accept(self) -> None:
        """One request: fork its child (a malformed request, or a client already gone, is dropped)."""
        conn, _ = self.server.accept()
        fds: list[int] = []
        conn.settimeout(5.0)  # a client that stalls mid-request does not hold up the others
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            size = int.from_bytes(msg[:8], "big")
            if len(msg) < 8 or size > MAX_REQUEST:
                raise ValueError("not a request")
            with conn.makefile("rb") as rest:  # a stream: a long request may come in pieces
                msg += rest.read(max(0, 8 + size - len(msg)))
            if len(msg) < 8 + size:
                raise ValueError("request cut short")
            request = json.loads(msg[8:].decode())
            conn.settimeout(None)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        # A signal that reaches the child between fork() and its new handlers would be dropped (CPython
        # clears pending signals after a fork): the server's SIGTERM must not be lost, so it is held until then.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid: int | None = os.fork()
        except OSError:
            pid = None
        if pid == 0:
            self.server.close()
            for other in self.conns.values():
                other.close()
            for fd in [*self.pidfds, *([self.parent_fd] if self.parent_fd is not None else [])]:
                os.close(fd)  # the child's copies
            _run_child(self.child, conn, request, fds, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        if pid is None:  # no child: the client reads no pid (and starts its own process)
            conn.close()
            return
        self.conns[pid] = conn
        with contextlib.suppress(OSError):  # the client is gone: so is its child (at the next pass of the loop)
            conn.sendall(f"{pid}\n".encode())
        fd = _pidfd(pid)
        if fd is not None:
            self.pidfds[fd] = pid

    def _reap(self) -> None:
        """Tell each exited child's client its exit code."""
        while self.conns:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for fd in [fd for fd, p in self.pidfds.items() if p == pid]:
                del self.pidfds[fd]
                os.close(fd)
            conn = self.conns.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()

    def loop(self) -> NoReturn:
        parent = os.getppid()
        self.parent_fd = _pidfd(parent)  # readable once the parent has exited (else: polled)
        parent_fds = [self.parent_fd] if self.parent_fd is not None else []
        hung: set[socket.socket] = set()  # clients gone whose child is still stopping
        while True:
            if os.getppid() != parent:  # the runner is gone (killed hard): so are the children
                _kill(list(self.conns), signal.SIGTERM)
                os._exit(0)
            watched = [self.server, *(c for c in self.conns.values() if c not in hung), *self.pidfds]
            exact = bool(parent_fds) and len(self.pidfds) == len(self.conns)
            readable, _, _ = select.select(watched + parent_fds, [], [], None if exact else 0.1)
            for item in readable:
                if item is self.server:
                    self._accept()
                elif isinstance(item, socket.socket) and not item.recv(64):  # the client went away
                    hung.add(item)
                    _kill([pid for pid, conn in self.conns.items() if conn is item], signal.SIGTERM)
            self._reap()
            hung &= set(self.conns.values())


def serve(path: str, child: Child, ready: Callable[[], None] | None = None) -> NoReturn:
    """Listen on `path`, run `ready` (the imports), touch PATH.ready, then fork `child` per request until
    SIGTERM; a client that goes away, or the parent's exit, sends its child SIGTERM."""
    server = _Server(path, child)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if ready is not None:
        ready()
    Path(path + ".ready").touch()
    server.loop()


class Forked:
    """A child of a fork server, seen from its client: pid, poll(), wait(), returncode (like Popen)."""

    def __init__(self, path: str, request: dict[str, Any], fds: list[int]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        data = json.dumps(request).encode()
        socket.send_fds(self.sock, [len(data).to_bytes(8, "big") + data], fds)
        self.reader = self.sock.makefile("r")
        self.pid = int(self.reader.readline())
        self.returncode: int | None = None
        self.lost = False  # the server went away before saying the exit code

    def close(self) -> None:
        """Go away: the server sends the child SIGTERM."""
        self.reader.close()
        self.sock.close()

    def _read_exit(self) -> int | None:
        """The exit code the server sent; None where it went away without one (then the pid is watched)."""
        line = self.reader.readline()
        self.close()
        self.lost = not line.startswith("exit ")
        return None if self.lost else int(line.split()[1])

    def poll(self) -> int | None:
        """The exit code once the child has exited, else None (does not block)."""
        if self.returncode is None and not self.lost and select.select([self.sock], [], [], 0)[0]:
            self.returncode = self._read_exit()
        if self.returncode is None and self.lost and not _alive(self.pid):
            self.returncode = 1  # its server is gone, so its exit code is lost with it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until the child has exited (or `timeout` seconds: TimeoutError); its exit code."""
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} still running after {timeout}s")
            select.select([] if self.lost else [self.sock], [], [], 0.05)  # wakes when the server writes
        return self.returncode
