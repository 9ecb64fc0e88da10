"""Warm kernels: one process imports torch, transformers, the helpers and papermill once; each notebook's worker
and its kernel are forked from it (see the comment below). KVKIT_WARM_KERNELS=0 starts plain processes instead."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from .procs import _kill

# Every notebook's kernel would import torch, transformers and the helpers again (most of a tiny
# notebook's time). On Linux the runner starts one warm process (`_zygote`) that imports them once;
# a notebook's kernel command is then a stub (`_kernel -f CONN`) that asks the warm process to fork
# a kernel, passes it its stdio, cwd and environment, relays signals, and exits with the kernel's
# code. The forked kernel is the usual ipykernel, in a session of its own. Without the warm process
# (KVKIT_WARM_KERNELS=0, another platform, or a failure) the stub runs ipykernel itself. Each notebook's
# worker (`_exec`) would likewise start Python and import papermill, nbclient and jupyter_client again
# (about 0.35 s of CPU per notebook): the runner asks the same process to fork it.

WARM_MODULES = ("IPython", "IPython.paths", "ipykernel.kernelspec", "papermill", "nbclient", "jupyter_client.manager",
                "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger", "matplotlib", "matplotlib.figure",
                "matplotlib.axes", "pandas", "torch", "transformers", "transformers.modeling_utils",
                "transformers.processing_utils", "transformers.image_processing_utils", "transformers.generation",
                "transformers.models.qwen3_vl.modeling_qwen3_vl", "transformers.models.qwen3_5.modeling_qwen3_5",
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
                "transformers.models.qwen2_vl.image_processing_qwen2_vl")
# Helpers that import pyplot are left to the kernel: the inline backend must meet a live shell.
WARM_SKIP = ("helpers.plots", "helpers.offload.plots", "helpers.pipeline")


def warm_enabled() -> bool:
    """Warm kernels on: Linux (fork, and file descriptors passed over a Unix socket) unless KVKIT_WARM_KERNELS=0."""
    return sys.platform.startswith("linux") and os.environ.get("KVKIT_WARM_KERNELS", "1") != "0"


def _warm_imports() -> None:
    """Import what the notebooks and their workers import, and build nbformat's validator (no torch op runs
    here: a forked child inherits no thread pool; no kernel, no zmq context, no event loop)."""
    import importlib
    import pkgutil
    import warnings

    import nbformat
    from jupyter_client.provisioning import KernelProvisionerFactory

    import helpers
    from . import stub  # noqa: F401 - the workers' kernel manager
    from .execute import notebooks

    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    names = [*WARM_MODULES, *(f"helpers.{m.name}" for m in pkgutil.iter_modules(helpers.__path__))]
    with warnings.catch_warnings():  # the filters themselves are left as a fresh kernel has them
        warnings.simplefilter("ignore")
        for name in (n for n in names if not n.startswith(WARM_SKIP)):
            with contextlib.suppress(Exception):  # a module the kernel will import (and report) itself
                importlib.import_module(name)
    KernelProvisionerFactory.instance()  # reads the provisioners' entry points once
    if notebooks():
        nbformat.writes(nbformat.read(str(notebooks()[0]), as_version=4))


def _zygote_child(request: dict[str, Any]) -> int:
    """In the forked child: a notebook's worker (`_exec` with the request's argv), else an ipykernel on the
    stub's connection file; its exit code."""
    if "argv" in request:
        from .execute import _exec_main

        return _exec_main(request["argv"])
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"]]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()
    return 0


def _zygote_main(argv: list[str]) -> int:
    """`_zygote SOCKET`: import once, then fork one worker or kernel per request until SIGTERM."""
    from .forks import serve

    serve(argv[0], _zygote_child, ready=_warm_imports)


def _kernel_main(argv: list[str]) -> int:
    """`_kernel -f CONN`: a kernel forked by the warm process (else a plain ipykernel), signals relayed."""
    conn_file = argv[argv.index("-f") + 1]
    path = os.environ.get("KVKIT_ZYGOTE")
    kernel: list[int] = []

    def relay(signum: int, _frame: Any) -> None:
        _kill(kernel, signum)
        if signum != signal.SIGINT:  # SIGINT interrupts the cell; the others end the kernel
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, relay)
    forked = None
    if path and os.path.exists(path):
        from .forks import Forked

        with contextlib.suppress(OSError, ValueError):
            request = {"connection_file": os.path.abspath(conn_file), "cwd": os.getcwd(), "env": dict(os.environ)}
            forked = Forked(path, request, [0, 1, 2])
            kernel.append(forked.pid)
    if forked is None:
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", conn_file])
    return forked.wait()

