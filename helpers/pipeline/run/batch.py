"""A recorded run (run-all / run): notebooks started as child processes, `jobs` at a time, through warm
kernels; Ctrl-C or SIGTERM stops it within seconds; run.json, results, timings.json and SUMMARY.md."""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import params as params_mod
from . import record as rec
from .execute import RunResult, failure_line, notebooks
from ..paths import output_dir, repo_root
from .procs import Stop, _alive, descendants, stop_processes
from .schedule import HtmlRenderer, child_env, expected_seconds, floor_seconds, longest_first
from .forks import Forked
from .warm import warm_enabled


@dataclass
class _Job:
    path: Path
    proc: subprocess.Popen | Forked
    began: float
    result_file: Path
    log_file: Path


def _wait_any(running: list[_Job], seconds: float) -> None:
    """Sleep up to `seconds`, waking as soon as a forked worker's server says it has exited."""
    select.select([job.proc.sock for job in running if isinstance(job.proc, Forked) and job.proc.returncode is None
                   and not job.proc.lost], [], [], seconds)


class Run:
    """One recorded run of `paths` with per-notebook parameters, `jobs` notebooks at a time."""

    def __init__(self, command: str, paths: list[Path], per_notebook: dict[str, dict[str, Any]],
                 parameters: dict[str, Any], jobs: int | None = None) -> None:
        self.command, self.paths, self.per_notebook = command, paths, per_notebook
        self.jobs = jobs or max(1, min(len(paths), os.cpu_count() or 1))
        self.out = output_dir()
        self.expected = expected_seconds(paths, self.out / "timings.json")  # read before the outputs are removed
        self.order = longest_first(paths, self.expected)
        if command in ("run-all", "share"):
            rec.clean_run_all(self.out)
        else:
            for nb in paths:
                rec.clean_notebook(self.out, nb.stem)
        self.record = rec.RunRecord(self.out, command, parameters, {nb.stem: per_notebook.get(nb.stem, {}) for nb in paths})
        self.record.write()
        self.results: dict[str, RunResult] = {}
        self.tmp = Path(tempfile.mkdtemp(prefix="kvkit-run-"))
        self.zygote: subprocess.Popen | None = None  # the warm process (warm.py)
        self.warm_s: float | None = None  # until the warm process had imported everything

    def _start_zygote(self) -> dict[str, str]:
        """The warm process the notebooks' workers and kernels are forked from (see WARM_MODULES); {} when off."""
        if not warm_enabled():
            return {}
        path = self.tmp / "warm.sock"
        self.zygote = subprocess.Popen([sys.executable, "-m", "helpers.pipeline.run", "_zygote", str(path)],
                                       cwd=str(repo_root()), env=child_env(KVKIT_OUTPUT_DIR=str(self.out)),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
        return {"KVKIT_ZYGOTE": str(path)}

    def _stop_zygote(self) -> None:
        """Stop the warm process and whatever it forked that is still running."""
        if self.zygote is not None:
            stop_processes([self.zygote.pid, *descendants(self.zygote.pid)], grace=1.0)
            self.zygote.wait()

    def _start(self, path: Path) -> _Job:
        """The notebook's worker, forked by the warm process once it has imported everything (stdout and stderr
        to its log), else (before that, or if it cannot) started fresh; its kernel is forked from it either way."""
        result_file, log_file = self.tmp / f"{path.stem}.json", self.tmp / f"{path.stem}.log"
        env = child_env(**self.record.env_vars(), **self.warm, KVKIT_OUTPUT_DIR=str(self.out))
        began = time.time()
        cmd = [sys.executable, "-m", "helpers.pipeline.run", "_exec", str(path), "--out-json", str(result_file),
               "--params", json.dumps(self.per_notebook.get(path.stem, {})), "--began", str(began)]
        with open(log_file, "wb") as log, open(os.devnull, "rb") as null:
            proc: Forked | subprocess.Popen | None = None
            with contextlib.suppress(OSError, ValueError):
                if self.warm_s is not None:
                    proc = Forked(self.warm["KVKIT_ZYGOTE"], {"argv": cmd[4:], "cwd": str(repo_root()), "env": env},
                                  [null.fileno(), log.fileno(), log.fileno()])
            if proc is None:
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
                        data.get("error") or "", data["status"], data.get("phases") or {}, data.get("retried") or "")
        if (self.out / "notebooks" / job.path.name).exists():
            self.html.submit(job.path.stem, res.phases)
        self.record.notebook(res.notebook, res.status, seconds, res.error, res.retried)
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
        pending, running = list(self.order), []
        self.html = HtmlRenderer(self.out)
        label = f"transformers {rec._version('transformers')}" if os.environ.get("KVKIT_MATRIX_RUN_ID") else "notebooks"
        with Stop() as stop, tqdm(total=len(pending), desc=label, unit="nb", disable=None, file=sys.stderr,
                                   leave=False) as bar:
            tqdm.write(f"{self.command} {self.record.run_id}: {len(pending)} notebook(s), {self.jobs} at a time",
                       file=sys.stdout)
            while (pending or running) and stop.signum is None:
                if ready is not None and self.warm_s is None and ready.exists():
                    self.warm_s = round(time.perf_counter() - started, 2)
                while pending and len(running) < self.jobs:
                    running.append(self._start(pending.pop(0)))
                for job in [j for j in running if j.proc.poll() is not None]:
                    running.remove(job)
                    res = self.results[job.path.stem] = self._finish(job)
                    status = "ok" if res.ok else f"FAILED ({res.error})"
                    tqdm.write(f"  {res.notebook}: {status} in {res.seconds:.1f}s", file=sys.stdout)
                    bar.update(1)
                _wait_any(running, 0.05)
            if stop.signum is not None:
                self._interrupt(running)
            self._stop_zygote()
            self.html.close()
            notebooks_s = time.perf_counter() - started
            for nb in pending:
                self.results[nb.stem] = RunResult(nb.stem, False, 0.0, "", "not started: the run was interrupted",
                                                  "not_started")
                self.record.notebook(nb.stem, "not_started", None, "not started: the run was interrupted")
            failed = any(not r.ok for r in self.results.values())
            status = "interrupted" if stop.signum is not None else "failed" if failed else "complete"
            self.record.finish(status)
            report_s = self._write_summary() if report else None
            self._write_timings(time.perf_counter() - started, notebooks_s, report_s)
            shutil.rmtree(self.tmp, ignore_errors=True)
            return stop.signum

    def _write_summary(self) -> float:
        start = time.perf_counter()
        try:
            from ..report import summary

            path = summary.write_summary(self.out)
            print(f"summary: {path.relative_to(self.out.parent)}", flush=True)  # outputs/SUMMARY.md
        except Exception as exc:  # noqa: BLE001 - the run record is already written
            print(f"summary failed: {failure_line(exc)}", file=sys.stderr)
        return round(time.perf_counter() - start, 2)

    def _write_timings(self, total: float, notebooks_s: float, report_s: float | None) -> None:
        rows = [self.results[nb.stem] for nb in self.paths if nb.stem in self.results]
        summed = {k: round(sum(r.phases.get(k, 0.0) for r in rows), 2)
                  for k in sorted({k for r in rows for k in r.phases})}
        cores = min(self.jobs, os.cpu_count() or 1)
        floor = floor_seconds(self.warm_s, summed, cores)
        timings = {
            "run_id": self.record.run_id, "command": self.command, "status": self.record.data["status"],
            "total_seconds": round(total, 2), "jobs": self.jobs, "cpu_count": os.cpu_count(),
            "run": {"warm_imports_s": self.warm_s, "notebooks_s": round(notebooks_s, 2), "summary_s": report_s},
            "phases_summed_over_notebooks": summed,
            "floor": {"seconds": floor, "cores": cores, "ratio": round(total / floor, 3) if floor else None,
                      "formula": "warm_imports_s + (experiments_s + html_s summed over notebooks) / cores",
                      "start_order": [nb.stem for nb in self.order],
                      "expected_seconds": self.expected},
            "notebooks": [{"notebook": r.notebook, "status": r.status, "ok": r.ok, "seconds": r.seconds, "error": r.error,
                           "output": f"notebooks/{r.notebook}.ipynb" if r.output else None, "phases": r.phases,
                           **({"retried": r.retried} if r.retried else {})}
                          for r in rows],
        }
        (self.out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
        try:  # scrub it and add it to share.zip (written with SUMMARY.md, before timings.json existed)
            from ..report import share

            share.finish_timings(self.out)
        except Exception as exc:  # noqa: BLE001 - the run is recorded; only share.zip lacks its timings
            print(f"timings not added to share.zip: {failure_line(exc)}", file=sys.stderr)
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

