"""`python -m helpers.pipeline.runner run-all | run NB | report | html | matrix`: the entry point, and the
names other modules import from here. The work is in procs.py (process control), warm.py (warm
kernels), execute.py (one notebook), run.py (a recorded run) and cli.py (the command line)."""
from __future__ import annotations

import sys

from .cli import _matrix, _recorded, main
from .execute import (RunResult, _execute, _exec_main, _stamp, failure_line, find_notebook, notebooks,
                      parse_parameters, phases, run_one, select)
from .procs import _Stop, _alive, _children, _connection_files, _kill, descendants, stop_processes
from .run import Run, _Job, _label, run_all, write_outputs
from .warm import (WARM_MODULES, WARM_SKIP, _kernel_main, _kernel_manager_class, _serve_kernel, _warm_imports,
                   _zygote_main, socket_mod, warm_enabled)

__all__ = ["RunResult", "Run", "descendants", "failure_line", "find_notebook", "main", "notebooks", "parse_parameters",
           "phases", "run_all", "run_one", "select", "stop_processes", "warm_enabled", "write_outputs", "WARM_MODULES",
           "WARM_SKIP", "_Job", "_Stop", "_alive", "_children", "_connection_files", "_exec_main", "_execute", "_kill",
           "_kernel_main", "_kernel_manager_class", "_label", "_matrix", "_recorded", "_serve_kernel", "_stamp",
           "_warm_imports", "_zygote_main", "socket_mod"]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before the run's own handlers were in place: nothing had started
        print("interrupted before the run started", file=sys.stderr)
        sys.exit(130)
