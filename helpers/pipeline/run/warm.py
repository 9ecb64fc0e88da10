"""Warm kernels: one process imports torch, transformers and the helpers once; each notebook's kernel is
forked from it (see the comment below). KVKIT_WARM_KERNELS=0 starts plain ipykernels instead."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .procs import _kill

# Every notebook's kernel would import torch, transformers and the helpers again (most of a tiny
# notebook's time). On Linux the runner starts one warm process (`_zygote`) that imports them once;
# a notebook's kernel command is then a stub (`_kernel -f CONN`) that asks the warm process to fork
# a kernel, passes it its stdio, cwd and environment, relays signals, and exits with the kernel's
# code. The forked kernel is the usual ipykernel, in a session of its own. Without the warm process
# (KVKIT_WARM_KERNELS=0, another platform, or a failure) the stub runs ipykernel itself.

WARM_MODULES = ("IPython", "ipykernel.kernelapp", "ipykernel.ipkernel", "matplotlib", "matplotlib.figure",
                "matplotlib.axes", "pandas", "torch", "transformers", "transformers.modeling_utils",
                "transformers.processing_utils", "transformers.image_processing_utils", "transformers.generation",
                "transformers.models.qwen3_vl.modeling_qwen3_vl", "transformers.models.qwen3_5.modeling_qwen3_5",
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
                "transformers.models.qwen2_vl.image_processing_qwen2_vl")
# Helpers that import pyplot are left to the kernel: the inline backend must meet a live shell.
WARM_SKIP = ("helpers.plots", "helpers.offload.plots", "helpers.pipeline")


def warm_enabled() -> bool:
    return (sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket_mod(), "send_fds")
            and os.environ.get("KVKIT_WARM_KERNELS", "1") != "0")


def socket_mod() -> Any:
    import socket

    return socket


def _warm_imports() -> None:
    """Import what the notebooks import (no torch op runs here: a forked child inherits no thread pool)."""
    import importlib
    import pkgutil
    import warnings

    import helpers

    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    names = [*WARM_MODULES, *(f"helpers.{m.name}" for m in pkgutil.iter_modules(helpers.__path__))]
    with warnings.catch_warnings():  # the filters themselves are left as a fresh kernel has them
        warnings.simplefilter("ignore")
        for name in names:
            if name.startswith(WARM_SKIP):
                continue
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module the kernel will import (and report) itself
                pass


def _serve_kernel(conn: Any, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become an ipykernel with the stub's stdio, cwd and environment."""
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
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"]]
    code = 0
    try:
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        sys.stdout.flush() if hasattr(sys.stdout, "flush") else None
    os._exit(code)


def _zygote_main(argv: list[str]) -> int:
    """`_zygote SOCKET`: import once, then fork one kernel per stub request until SIGTERM."""
    import select

    socket = socket_mod()
    path = argv[0]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm_imports()
    Path(path + ".ready").touch()
    kernels: dict[int, Any] = {}  # pid -> the stub's connection
    parent = os.getppid()
    while True:
        if os.getppid() != parent:  # the runner is gone (killed hard): so are its kernels
            _kill(list(kernels), signal.SIGKILL)
            os._exit(0)
        readable, _, _ = select.select([server, *kernels.values()], [], [], 0.1)
        for sock in readable:
            if sock is server:
                conn, _ = server.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    server.close()
                    for other in kernels.values():
                        other.close()
                    _serve_kernel(conn, json.loads(msg.decode()), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                kernels[pid] = conn
            else:  # the stub went away: its kernel goes too
                if not sock.recv(64):
                    for pid, conn in list(kernels.items()):
                        if conn is sock:
                            _kill([pid], signal.SIGKILL)
        while kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = kernels.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def _kernel_main(argv: list[str]) -> int:
    """`_kernel -f CONN`: a kernel forked by the warm process (else a plain ipykernel), signals relayed."""
    conn_file = argv[argv.index("-f") + 1]
    path = os.environ.get("KVKIT_ZYGOTE")
    socket = socket_mod()
    kernel: list[int] = []

    def relay(signum: int, _frame: Any) -> None:
        _kill(kernel, signum)
        if signum != signal.SIGINT:  # SIGINT interrupts the cell; the others end the kernel
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, relay)
    reader = None
    if path and os.path.exists(path):
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            request = {"connection_file": os.path.abspath(conn_file), "cwd": os.getcwd(), "env": dict(os.environ)}
            socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
            reader = sock.makefile("r")
            kernel.append(int(reader.readline()))
        except (OSError, ValueError):
            reader = None
    if reader is None:
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", conn_file])
    line = reader.readline()
    return int(line.split()[1]) if line.startswith("exit ") else 1


def _kernel_manager_class() -> Any:
    """A jupyter KernelManager whose kernel command is the stub above."""
    from jupyter_client.manager import AsyncKernelManager

    class WarmKernelManager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            return [sys.executable, "-m", "helpers.pipeline.run", "_kernel", "-f", self.connection_file]

    return WarmKernelManager
