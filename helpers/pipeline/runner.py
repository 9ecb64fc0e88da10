"""Headless notebook runs: `run-all` (parallel, timed, never stops at a failure), `run` (one notebook),
`report` (outputs/SUMMARY.md), `html` (outputs/html/) and `matrix` (every notebook on several
transformers releases: outputs/matrix/<release>/ and outputs/matrix.md).

Every run-all / run / matrix is one recorded run (outputs/run.json, see record.py). A run-all first
removes the outputs of earlier runs; a run removes its notebook's. Parameters (`-p NAME VALUE`) are
checked against each notebook's `parameters` cell before any kernel starts (params.py). Each notebook
runs in a child process of its own (`_exec`, its own process group), so Ctrl-C or SIGTERM stops the
run within seconds: no further notebook starts, kernels are shut down, unfinished notebooks are
recorded as interrupted, and the summary says so. `--notebooks 01 02` (or NOTEBOOKS="01 02")
restricts a run-all. Kernels are forked from one warm process that imported torch, transformers and
the helpers once (see "warm kernels" below; KVKIT_WARM_KERNELS=0 starts plain ipykernels instead).
timings.json says where the time went: per notebook kernel_start_s (until the first cell ran: the
warm process's imports for the first notebooks), imports_s, model_build_s, experiments_s, html_s.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import params as params_mod
from . import record as rec
from .paths import output_dir, repo_root


@dataclass
class RunResult:
    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str = ""
    status: str = ""  # ok | failed | interrupted | not_started
    phases: dict[str, float] = field(default_factory=dict)


def notebooks(root: Path | None = None) -> list[Path]:
    """Every source notebook in notebooks/, in order."""
    return sorted((root or repo_root()).joinpath("notebooks").glob("[0-9]*.ipynb"))


def find_notebook(key: str) -> Path:
    """'02', '02_mask_position_matrix' or a path -> the notebook file."""
    path = Path(key)
    if path.suffix == ".ipynb" and path.exists():
        return path
    matches = [nb for nb in notebooks() if nb.stem == key or nb.stem.split("_")[0] == key.zfill(2) or nb.stem.startswith(key)]
    if len(matches) != 1:
        raise SystemExit(f"no single notebook matches {key!r}; have: {[nb.stem for nb in notebooks()]}")
    return matches[0]


def select(keys: list[str] | None) -> list[Path]:
    """The notebooks named by keys ('01', stems, paths; commas or spaces), else all of them."""
    names = [k for key in keys or [] for k in key.replace(",", " ").split()]
    return [find_notebook(k) for k in names] if names else notebooks()


def parse_parameters(pairs: list[list[str]] | None) -> dict[str, Any]:
    """papermill-style `-p name value` pairs; values parsed as JSON where they parse, else kept as text."""
    params: dict[str, Any] = {}
    for name, value in pairs or []:
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


# --------------------------------------------------------------------------- one notebook

def failure_line(exc: BaseException) -> str:
    """'Type: first line of the message' of the exception raised in the notebook (papermill's ename/evalue)."""
    name = getattr(exc, "ename", None) or type(exc).__name__
    text = str(getattr(exc, "evalue", None) if getattr(exc, "ename", None) else exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{name}: {first}"[:300] if first else name


def _stamp(value: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() if value else None
    except ValueError:
        return None


def phases(executed: Path, began: float, session: dict[str, float] | None) -> dict[str, float]:
    """Where one notebook's time went, from papermill's cell timings and session.start's report:
    kernel_start_s (until the first cell), imports_s (setup cell until session.start), model_build_s,
    experiments_s (every other cell)."""
    try:
        cells = [c for c in json.loads(executed.read_text())["cells"] if c.get("cell_type") == "code"]
    except (OSError, ValueError, KeyError):
        return {}
    times = [((c.get("metadata") or {}).get("papermill") or {}) for c in cells]
    starts = [_stamp(t.get("start_time")) for t in times]
    durations = [float(t.get("duration") or 0.0) for t in times]
    first = next((s for s in starts if s), None)
    out = {"kernel_start_s": round(first - began, 2)} if first else {}
    setup = next((i for i, c in enumerate(cells) if "session.start(" in "".join(c.get("source") or "")), None)
    if setup is None or not session or not starts[setup]:
        out["cells_s"] = round(sum(durations), 2)
        return out
    imports = max(0.0, session["entered"] - starts[setup])
    model = session.get("model_build_s", 0.0) + session.get("results_s", 0.0)
    out.update(imports_s=round(imports, 2), model_build_s=round(model, 2),
               experiments_s=round(sum(durations) - imports - model, 2))
    return out


def _execute(path: Path, parameters: dict[str, Any], out: Path) -> str:
    """papermill into `out`, quietly; '' or the one-line failure."""
    import papermill as pm

    extra = {"kernel_manager_class": _kernel_manager_class()} if os.environ.get("KVKIT_ZYGOTE") else {}
    try:
        pm.execute_notebook(str(path), str(out), parameters=parameters or {}, cwd=str(repo_root()),
                            kernel_name="python3", progress_bar=False, log_output=False,
                            request_save_on_cell_execute=True, **extra)
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported and the others still run
        return failure_line(exc)
    return ""


def run_one(path: Path, parameters: dict[str, Any] | None = None, quiet: bool = True) -> RunResult:
    """Execute one notebook in this process into outputs/notebooks/ (no run record); failures are returned."""
    out = output_dir("notebooks") / path.name
    start = time.perf_counter()
    error = _execute(path, parameters or {}, out)
    return RunResult(path.stem, not error, round(time.perf_counter() - start, 2), str(out), error,
                     "failed" if error else "ok")


# --------------------------------------------------------------------------- processes

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


def _exec_main(argv: list[str]) -> int:
    """Child entry (`runner _exec NB --out-json F --params JSON`): run one notebook, render its HTML,
    write {status, error, phases} to F. SIGTERM/SIGINT shut its kernel down and exit at once."""
    parser = argparse.ArgumentParser(prog="kvkit _exec")
    parser.add_argument("notebook")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--began", type=float, default=None)
    parser.add_argument("--no-html", action="store_true")
    args = parser.parse_args(argv)

    def stop(signum: int, _frame: Any) -> None:
        kids = descendants(os.getpid())
        files = [f for pid in kids for f in _connection_files(pid)]
        stop_processes(kids, grace=1.0)
        for conn in files:  # a kernel killed hard leaves its connection file behind
            Path(conn).unlink(missing_ok=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    began = args.began or time.time()
    path = Path(args.notebook)
    timing_file = Path(args.out_json).with_suffix(".session.json")
    os.environ["KVKIT_TIMINGS_FILE"] = str(timing_file)
    executed = output_dir("notebooks") / path.name
    error = _execute(path, json.loads(args.params), executed)
    try:
        session = json.loads(timing_file.read_text())
    except (OSError, ValueError):
        session = None
    result = {"status": "failed" if error else "ok", "error": error, "phases": phases(executed, began, session)}
    if not args.no_html and executed.exists():
        start = time.perf_counter()
        try:
            from . import report

            _, errors = report.write_html(stems=[path.stem])
            result["html_errors"] = errors
        except Exception as exc:  # noqa: BLE001 - the summary still lists the notebook
            result["html_errors"] = [failure_line(exc)]
        result["phases"]["html_s"] = round(time.perf_counter() - start, 2)
    Path(args.out_json).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- warm kernels
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
            return [sys.executable, "-m", "helpers.pipeline.runner", "_kernel", "-f", self.connection_file]

    return WarmKernelManager


# --------------------------------------------------------------------------- a recorded run

@dataclass
class _Job:
    path: Path
    proc: subprocess.Popen
    began: float
    result_file: Path
    log_file: Path


class _Stop:
    """SIGINT/SIGTERM handlers that only note the signal (the run loop acts on it)."""

    def __init__(self, forward: bool = False) -> None:
        self.signum: int | None = None
        self.forward = forward  # pass the signal on to this process's children (the matrix's run-alls)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Stop":
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


def _label() -> str:
    if os.environ.get("KVKIT_MATRIX_RUN_ID"):
        return f"transformers {rec._version('transformers')}"
    return "notebooks"


class Run:
    """One recorded run of `paths` with per-notebook parameters, `jobs` notebooks at a time."""

    def __init__(self, command: str, paths: list[Path], per_notebook: dict[str, dict[str, Any]],
                 parameters: dict[str, Any], jobs: int | None = None) -> None:
        self.command, self.paths, self.per_notebook = command, paths, per_notebook
        self.jobs = jobs or max(1, min(len(paths), os.cpu_count() or 1))
        self.out = output_dir()
        if command == "run-all":
            rec.clean_run_all(self.out)
        else:
            for nb in paths:
                rec.clean_notebook(self.out, nb.stem)
        self.record = rec.RunRecord(self.out, command, parameters, {nb.stem: per_notebook.get(nb.stem, {}) for nb in paths})
        self.record.write()
        self.results: dict[str, RunResult] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="kvkit-run-"))
        self.zygote: subprocess.Popen | None = None
        self.warm_s: float | None = None  # until the warm process had imported everything

    def _start_zygote(self) -> dict[str, str]:
        """The warm process the notebooks' kernels are forked from (see WARM_MODULES); {} when off."""
        if not warm_enabled():
            return {}
        path = self.tmp / "warm.sock"
        self.zygote = subprocess.Popen([sys.executable, "-m", "helpers.pipeline.runner", "_zygote", str(path)],
                                       cwd=str(repo_root()), env={**os.environ, "KVKIT_OUTPUT_DIR": str(self.out)},
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
        deadline = time.monotonic() + 5
        while not path.exists() and self.zygote.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"KVKIT_ZYGOTE": str(path)} if path.exists() else {}

    def _stop_zygote(self) -> None:
        if self.zygote is not None:
            pids = [self.zygote.pid, *descendants(self.zygote.pid)]
            stop_processes(pids, grace=1.0)
            self.zygote.wait()

    def _start(self, path: Path) -> _Job:
        result_file, log_file = self.tmp / f"{path.stem}.json", self.tmp / f"{path.stem}.log"
        env = {**os.environ, **self.record.env_vars(), **self.warm, "KVKIT_OUTPUT_DIR": str(self.out)}
        began = time.time()
        cmd = [sys.executable, "-m", "helpers.pipeline.runner", "_exec", str(path), "--out-json", str(result_file),
               "--params", json.dumps(self.per_notebook.get(path.stem, {})), "--began", str(began)]
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=str(repo_root()), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return _Job(path, proc, time.perf_counter(), result_file, log_file)

    def _finish(self, job: _Job) -> RunResult:
        seconds = round(time.perf_counter() - job.began, 2)
        try:
            data = json.loads(job.result_file.read_text())
        except (OSError, ValueError):
            tail = [ln for ln in job.log_file.read_text(errors="replace").splitlines() if ln.strip()][-1:] \
                if job.log_file.exists() else []
            data = {"status": "failed", "error": f"the notebook's worker exited with code {job.proc.returncode}"
                    + (f": {tail[0].strip()[:200]}" if tail else ""), "phases": {}}
        res = RunResult(job.path.stem, data["status"] == "ok", seconds, str(self.out / "notebooks" / job.path.name),
                        data.get("error") or "", data["status"], data.get("phases") or {})
        self.record.notebook(res.notebook, res.status, seconds, res.error)
        return res

    def _interrupt(self, running: list[_Job]) -> None:
        """Stop the running notebooks and their kernels; mark them interrupted."""
        kids = {job.path.stem: [job.proc.pid, *descendants(job.proc.pid)] for job in running}
        stop_processes([job.proc.pid for job in running], grace=2.5)
        stop_processes([p for pids in kids.values() for p in pids[1:] if _alive(p)], grace=0.5)
        for job in running:
            job.proc.wait()
            stem = job.path.stem
            marked = rec.mark_interrupted(self.out / "results" / f"{stem}.json", self.record.run_id)
            why = "interrupted" if marked else "interrupted before its results file was written"
            self.results[stem] = RunResult(stem, False, round(time.perf_counter() - job.began, 2),
                                           str(self.out / "notebooks" / job.path.name), why, "interrupted")
            self.record.notebook(stem, "interrupted", self.results[stem].seconds, why)

    def execute(self, report: bool = True) -> int | None:
        """Run the notebooks; returns the signal number that stopped the run, else None."""
        from tqdm import tqdm

        started = time.perf_counter()
        self.warm = self._start_zygote()
        ready = Path(self.warm["KVKIT_ZYGOTE"] + ".ready") if self.warm else None
        pending, running = list(self.paths), []
        with _Stop() as stop, tqdm(total=len(pending), desc=_label(), unit="nb", disable=None, file=sys.stderr,
                                   leave=False) as bar:
            tqdm.write(f"{self.command} {self.record.run_id}: {len(pending)} notebook(s), {self.jobs} at a time",
                       file=sys.stdout)
            while (pending or running) and stop.signum is None:
                while pending and len(running) < self.jobs:
                    running.append(self._start(pending.pop(0)))
                for job in [j for j in running if j.proc.poll() is not None]:
                    running.remove(job)
                    res = self.results[job.path.stem] = self._finish(job)
                    status = "ok" if res.ok else f"FAILED ({res.error})"
                    tqdm.write(f"  {res.notebook}: {status} in {res.seconds:.1f}s", file=sys.stdout)
                    bar.update(1)
                if ready is not None and self.warm_s is None and ready.exists():
                    self.warm_s = round(time.perf_counter() - started, 2)
                time.sleep(0.05)
            if stop.signum is not None:
                self._interrupt(running)
            self._stop_zygote()
            notebooks_s = time.perf_counter() - started
            for nb in pending:
                self.results[nb.stem] = RunResult(nb.stem, False, 0.0, "", "not started: the run was interrupted",
                                                  "not_started")
                self.record.notebook(nb.stem, "not_started", None, "not started: the run was interrupted")
            failed = any(not r.ok for r in self.results.values())
            status = "interrupted" if stop.signum is not None else "failed" if failed else "complete"
            self.record.finish(status, self._kernel_environment())
            report_s = self._write_summary() if report else None
            self._write_timings(time.perf_counter() - started, notebooks_s, report_s)
            for path in self.tmp.iterdir():
                path.unlink(missing_ok=True)
            self.tmp.rmdir()
            return stop.signum

    def _kernel_environment(self) -> dict[str, Any] | None:
        for stem in self.results:
            try:
                data = json.loads((self.out / "results" / f"{stem}.json").read_text())
            except (OSError, ValueError):
                continue
            if (data.get("run") or {}).get("run_id") == self.record.run_id and data.get("environment"):
                return data["environment"]
        return None

    def _write_summary(self) -> float:
        start = time.perf_counter()
        try:
            from . import report

            path = report.write_summary(self.out)
            print(f"summary: {path.relative_to(self.out.parent) if path.is_relative_to(self.out.parent) else path}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - the run record is already written
            print(f"summary failed: {failure_line(exc)}", file=sys.stderr)
        return round(time.perf_counter() - start, 2)

    def _write_timings(self, total: float, notebooks_s: float, report_s: float | None) -> None:
        rows = [self.results[nb.stem] for nb in self.paths if nb.stem in self.results]
        keys = sorted({k for r in rows for k in r.phases})
        timings = {
            "run_id": self.record.run_id, "command": self.command, "status": self.record.data["status"],
            "total_seconds": round(total, 2), "jobs": self.jobs, "cpu_count": os.cpu_count(),
            "run": {"warm_imports_s": self.warm_s, "notebooks_s": round(notebooks_s, 2), "summary_s": report_s},
            "phases_summed_over_notebooks": {k: round(sum(r.phases.get(k, 0.0) for r in rows), 2) for k in keys},
            "notebooks": [{"notebook": r.notebook, "status": r.status, "ok": r.ok, "seconds": r.seconds, "error": r.error,
                           "output": f"notebooks/{r.notebook}.ipynb" if r.output else None, "phases": r.phases}
                          for r in rows],
        }
        (self.out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
        print(f"{len(rows)} notebook(s) in {total:.1f}s ({self.record.data['status']})", flush=True)


def run_all(parameters: dict[str, Any] | None = None, jobs: int | None = None, paths: list[Path] | None = None,
            command: str = "run-all", report: bool = False) -> list[RunResult]:
    """A recorded run of every notebook (or `paths`): run.json, results, timings.json (and SUMMARY.md when
    `report`). Raises params.ParameterError before anything starts if a parameter is refused."""
    paths = list(paths or notebooks())
    given = parameters or {}
    run = Run(command, paths, params_mod.check(paths, given), given, jobs)
    run.execute(report=report)
    return [run.results[nb.stem] for nb in paths if nb.stem in run.results]


def write_outputs(stems: list[str] | None = None) -> bool:
    """outputs/html/ for the executed notebooks, then outputs/SUMMARY.md; False if any part failed."""
    from . import report

    ok = True
    try:
        written, errors = report.write_html(stems=stems)
        for err in errors:
            print(f"html: {err}", file=sys.stderr)
        ok = not errors
        print(f"html: {len(written)} file(s)", flush=True)
    except Exception as exc:  # noqa: BLE001 - the summary is still written
        print(f"html failed: {failure_line(exc)}", file=sys.stderr)
        ok = False
    try:
        path = report.write_summary()
        print(f"summary: {path.name} ({len(path.read_text()):,} chars)", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"summary failed: {failure_line(exc)}", file=sys.stderr)
        ok = False
    return ok


# --------------------------------------------------------------------------- command line

def _recorded(command: str, paths: list[Path], pairs: list[list[str]] | None, jobs: int | None,
              report: bool) -> int:
    """run-all / run: check parameters (one line, exit 2), run, summarise; 130/143 when interrupted."""
    given = parse_parameters(pairs)
    try:
        per_notebook = params_mod.check(paths, given)
    except params_mod.ParameterError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    run = Run(command, paths, per_notebook, given, jobs)
    signum = run.execute(report=report)
    if signum is not None:
        nbs = run.record.data["notebooks"].values()
        counts = {s: sum(1 for n in nbs if n["status"] == s) for s in rec.NB_STATUSES}
        print(f"interrupted: {counts['ok'] + counts['failed']} finished, {counts['interrupted']} interrupted, "
              f"{counts['not_started']} not started; run.json and SUMMARY.md say so", file=sys.stderr)
        return 128 + signum
    failed = [r.notebook for r in run.results.values() if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _matrix(releases: list[str], stems: list[str] | None, jobs: int | None) -> int:
    """Every release in turn, as one recorded run (outputs/matrix/run.json); each release's run-all
    records itself in outputs/matrix/<release>/run.json with this matrix's id as KVKIT_MATRIX_RUN_ID."""
    from tqdm import tqdm

    from . import release_matrix as rm

    out_base = output_dir()
    record = rec.RunRecord(output_dir("matrix"), "matrix", {"releases": releases}, {s: {} for s in stems or
                                                                                    [nb.stem for nb in notebooks()]})
    record.write()
    record.data["environment"]["transformers"] = list(releases)
    record.write()
    os.environ["KVKIT_MATRIX_RUN_ID"] = record.run_id
    record.data["releases"], infos = {}, []
    with _Stop(forward=True) as stop:
        for release in tqdm(releases, desc="releases", unit="release", disable=None, file=sys.stderr):
            if stop.signum is not None:
                break
            info = rm.run_release(release, out_base, stems, jobs, log=lambda *a, **k: tqdm.write(" ".join(map(str, a))))
            infos.append(info)
            try:
                sub_data = json.loads((out_base / "matrix" / release / "run.json").read_text())
            except (OSError, ValueError):
                sub_data = {}
            record.data["releases"][release] = {"run_id": sub_data.get("run_id"), "status": sub_data.get("status")
                                                or ("not_installed" if not info.get("ok") else "failed"), "rc": info.get("rc")}
            for stem, nb in (sub_data.get("notebooks") or {}).items():
                mine = record.data["notebooks"].setdefault(stem, {"status": "ok", "seconds": 0.0, "error": None, "parameters": {}})
                if mine["status"] in ("ok", "not_started") and nb.get("status") != "ok":
                    mine.update(status=nb.get("status"), error=f"{release}: {nb.get('error')}")
                elif mine["status"] == "not_started":
                    mine["status"] = "ok"
                mine["seconds"] = round((mine.get("seconds") or 0.0) + (nb.get("seconds") or 0.0), 2)
            record.write()
        path = rm.write_matrix(out_base, releases)
        bad = [i["release"] for i in infos if not i.get("ok") or i.get("rc") != 0]
        record.finish("interrupted" if stop.signum is not None else "failed" if bad else "complete")
    print(f"matrix: {path.name}")
    if bad and stop.signum is None:
        print(f"releases not installed or with failed notebooks: {', '.join(bad)}", file=sys.stderr)
    return 128 + stop.signum if stop.signum is not None else 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_exec"]:
        return _exec_main(argv[1:])
    if argv[:1] == ["_zygote"]:
        return _zygote_main(argv[1:])
    if argv[:1] == ["_kernel"]:
        return _kernel_main(argv[1:])
    parser = argparse.ArgumentParser(prog="kvkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("run-all", help="execute every notebook, then write SUMMARY.md and html/")
    p_all.add_argument("-j", "--jobs", type=int, default=None)
    p_all.add_argument("--notebooks", nargs="*", default=None, help="only these (default: $NOTEBOOKS, else all)")
    p_all.add_argument("--no-report", action="store_true", help="skip SUMMARY.md")
    p_one = sub.add_parser("run", help="execute one notebook (its outputs replace its earlier ones), then SUMMARY.md")
    p_one.add_argument("notebook")
    p_one.add_argument("--no-report", action="store_true", help="skip SUMMARY.md")
    for p in (p_all, p_one):
        p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    sub.add_parser("report", help="write outputs/SUMMARY.md from the results on disk")
    sub.add_parser("html", help="render outputs/notebooks/*.ipynb to self-contained outputs/html/*.html")
    p_mx = sub.add_parser("matrix", help="run the notebooks on several transformers releases")
    p_mx.add_argument("--releases", nargs="+", default=None, help="default: $RELEASES, else release_matrix.DEFAULT_RELEASES")
    p_mx.add_argument("--notebooks", nargs="*", default=None, help="only these (default: $NOTEBOOKS, else all)")
    p_mx.add_argument("-j", "--jobs", type=int, default=None)
    p_mx.add_argument("--no-run", action="store_true", help="only rebuild matrix.md from outputs/matrix/")
    args = parser.parse_args(argv)

    if args.command == "report":
        from . import report

        path = report.write_summary()
        print(f"{path.name} ({len(path.read_text()):,} chars)")
        return 0
    if args.command == "html":
        from . import report

        written, errors = report.write_html()
        for path in written:
            print(f"html/{path.name}")
        for err in errors:
            print(err, file=sys.stderr)
        return 1 if errors else 0
    if args.command == "matrix":
        from . import release_matrix as rm

        releases = args.releases or os.environ.get("RELEASES", "").split() or list(rm.DEFAULT_RELEASES)
        keys = args.notebooks if args.notebooks is not None else os.environ.get("NOTEBOOKS", "").split()
        if args.no_run:
            print(rm.write_matrix(releases=releases))
            return 0
        return _matrix(releases, [nb.stem for nb in select(keys)] if keys else None, args.jobs)
    if args.command == "run":
        return _recorded("run", [find_notebook(args.notebook)], args.parameter, 1, not args.no_report)
    keys = args.notebooks if args.notebooks is not None else os.environ.get("NOTEBOOKS", "").split()
    return _recorded("run-all", select(keys), args.parameter, args.jobs, not args.no_report)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before the run's own handlers were in place: nothing had started
        print("interrupted before the run started", file=sys.stderr)
        sys.exit(130)
