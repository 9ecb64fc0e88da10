"""Notebook workers forked from one process that has imported papermill: each notebook's worker (`_exec`)
would otherwise start Python and import papermill, nbclient and jupyter_client again (about 0.35 s of
CPU per notebook). `_workers SOCKET` imports them, reads and writes one notebook (nbformat's validator is
built on first use), then forks a worker per request (forks.py). Off where warm kernels are off."""
from __future__ import annotations

import signal
from typing import Any


def _warm() -> None:
    """Import what a worker uses and build nbformat's validator (no kernel, no zmq context, no event loop)."""
    import IPython.paths  # noqa: F401 - jupyter_client's lookup of the python3 kernel imports these two
    import ipykernel.kernelspec  # noqa: F401
    import nbformat
    import papermill  # noqa: F401
    import psutil  # noqa: F401
    from jupyter_client.manager import AsyncKernelManager  # noqa: F401
    from jupyter_client.provisioning import KernelProvisionerFactory
    from nbclient import NotebookClient  # noqa: F401

    from . import execute, ready  # noqa: F401
    from .execute import notebooks

    KernelProvisionerFactory.instance()  # reads the provisioners' entry points once
    sources = notebooks()
    if sources:
        nbformat.writes(nbformat.read(str(sources[0]), as_version=4))


def _worker_child(request: dict[str, Any]) -> int:
    """In the forked child: the usual `_exec` entry with the request's arguments."""
    from .execute import _exec_main

    return _exec_main(request["argv"])


def _workers_main(argv: list[str]) -> int:
    """`_workers SOCKET`: import once, then fork one notebook worker per request until SIGTERM."""
    from .forks import serve

    serve(argv[0], _worker_child, signal.SIGTERM, ready=_warm)
