"""The run record: outputs/run.json names one run (id, command, start, kit commit, parameters, each
notebook's status, environment), and every results file of that run carries the same run id.

Written by the runner when a run starts (status "running"), after every notebook and when the run
ends ("complete", "failed" or "interrupted"). Kernels learn the run through KVKIT_RUN_* variables
(read by helpers/results.py). Cheap to import: no torch, no transformers, no jupyter.
"""
from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from ..paths import repo_root
from .params import cuda_status

NB_STATUSES = ("ok", "failed", "interrupted", "not_started")
RUN_STATUSES = ("running", "complete", "interrupted", "failed")
INTERRUPTED = "interrupted: the run was stopped before this notebook finished"
# What a run-all removes before it starts: the outputs of earlier runs (a run-all describes one run).
RUN_ALL_OUTPUTS = ("results", "notebooks", "html", "figures", "resume_state", "SUMMARY.md", "timings.json", "run.json",
                   "releases.json")


def utc_now() -> str:
    """ISO 8601 UTC to the second, e.g. 2026-12-02T20:37:13Z."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_state() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the kit checkout; (None, None) outside git. Dirty ignores untracked files."""
    try:  # porcelain v2: a '# branch.oid <commit>' header, then one line per changed tracked file
        res = subprocess.run(["git", "status", "--porcelain=v2", "--branch", "--untracked-files=no"], cwd=repo_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None
    lines = res.stdout.splitlines() if res.returncode == 0 else []
    commit = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ") and "(initial)" not in ln), None)
    return (commit, any(not ln.startswith("#") for ln in lines)) if commit else (None, None)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


class RunRecord:
    """outputs/run.json of one run, rewritten after every change."""

    def __init__(self, out: Path, command: str, parameters: dict[str, Any],
                 notebooks: dict[str, dict[str, Any]]) -> None:
        commit, dirty = git_state()
        self.path = Path(out) / "run.json"
        self.data: dict[str, Any] = {  # the id: sortable and unique, UTC time plus four hex digits
            "run_id": f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}", "command": command,
            "started": utc_now(), "finished": None, "status": "running", "kit_commit": commit, "kit_dirty": dirty,
            "parameters": parameters,
            "notebooks": {stem: {"status": "not_started", "seconds": None, "error": None, "parameters": p}
                          for stem, p in notebooks.items()},
            # versions and platform, read without importing torch or transformers (the notebooks' own results
            # files hold the environment each of them ran with)
            "environment": {"python": platform.python_version(), "torch": _version("torch"),
                            "transformers": _version("transformers"), "platform": platform.platform(),
                            "cuda_available": cuda_status()[0]},
        }
        if os.environ.get("KVKIT_MATRIX_RUN_ID") and command != "matrix":
            self.data["matrix_run_id"] = os.environ["KVKIT_MATRIX_RUN_ID"]  # one release of that matrix run

    @property
    def run_id(self) -> str:
        return self.data["run_id"]

    def env_vars(self) -> dict[str, str]:
        """What the kernels need to stamp their results files with this run."""
        dirty = self.data["kit_dirty"]
        return {"KVKIT_RUN_ID": self.run_id, "KVKIT_RUN_STARTED": self.data["started"],
                "KVKIT_KIT_COMMIT": self.data["kit_commit"] or "",
                "KVKIT_KIT_DIRTY": "" if dirty is None else str(dirty).lower()}

    def notebook(self, stem: str, status: str, seconds: float | None = None, error: str | None = None,
                 retried: str = "") -> None:
        """Record one notebook's outcome (and, where its kernel was started twice, why)."""
        assert status in NB_STATUSES, status
        self.data["notebooks"].setdefault(stem, {"parameters": {}})
        self.data["notebooks"][stem].update(status=status, seconds=seconds, error=error or None,
                                            **({"retried": retried} if retried else {}))
        self.write()

    def finish(self, status: str) -> None:
        """Close the record: final status and finish time (each results file holds the environment its kernel saw)."""
        assert status in RUN_STATUSES, status
        self.data.update(status=status, finished=utc_now())
        self.write()

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)
        return self.path


def run_stamp() -> dict[str, Any]:
    """The "run" block of a results file, from the KVKIT_RUN_* variables (nulls outside the runner)."""
    dirty = os.environ.get("KVKIT_KIT_DIRTY", "")
    return {"run_id": os.environ.get("KVKIT_RUN_ID") or None, "started": os.environ.get("KVKIT_RUN_STARTED") or None,
            "kit_commit": os.environ.get("KVKIT_KIT_COMMIT") or None,
            "kit_dirty": {"true": True, "false": False}.get(dirty.lower())}


def mark_interrupted(results_path: Path, run_id: str) -> bool:
    """Rewrite an unfinished notebook's results file of run `run_id`: every claim `error` with the reason
    "interrupted" (a verdict reached before the stop is kept in the evidence, not shown as the result)."""
    from ..report.records import load_json

    data = load_json(Path(results_path))
    if (data.get("run") or {}).get("run_id") != run_id:
        return False  # another run's file: not this run's to rewrite
    for claim in data.get("claims", []):
        before = claim.get("verdict")
        claim.update(verdict="error", reason=INTERRUPTED, deciding={})
        if before not in (None, "error"):
            claim["evidence"] = {"verdict_before_the_stop": before, **(claim.get("evidence") or {})}
    Path(results_path).write_text(json.dumps(data, indent=2) + "\n")
    return True


def clean_run_all(out: Path) -> None:
    """Remove the outputs of earlier runs, so that everything in `out` describes the run that starts."""
    for name in RUN_ALL_OUTPUTS:
        path = Path(out) / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def clean_notebook(out: Path, stem: str) -> None:
    """Remove one notebook's earlier outputs (results, executed copy, HTML, figures) before it runs again."""
    out = Path(out)
    for path in (out / "results" / f"{stem}.json", out / "notebooks" / f"{stem}.ipynb", out / "html" / f"{stem}.html"):
        path.unlink(missing_ok=True)
    for fig in (out / "figures").glob(f"{stem}-*"):
        fig.unlink(missing_ok=True)
