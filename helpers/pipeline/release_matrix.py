"""Every notebook on several transformers releases: outputs/matrix/<release>/ and outputs/matrix.md.
The names other modules import from here; the work is in envs.py (release environments), matrix_run.py
(the matrix runner), matrix_facts.py and matrix_diff.py (what differs, "What changed") and
matrix_report.py (matrix.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from . import matrix_run
from .envs import (PIP, STAMP, ReleaseEnv, _build_env, _check_probe, _link_jupyter_data, _lock, _probe, _run,
                   _tail, ensure_env, pinned_release, shared_site_packages, venvs_dir)
from .matrix_diff import _kit_skew, boundary_changes, change_section
from .matrix_kinds import (COLLAPSED, _behaviour_line, _incomplete, _not_recorded, _verdict_changes, detail_section,
                           sort_differences)
from .matrix_facts import (_ABSENT, _ERROR_NAME, _SOURCE_LOCATION, KINDS, LARGE_FLOAT, _has_float, _leaf,
                           _notebook_facts, _numbers, classify, differences, distinct_texts, flatten,
                           group_differences, notebook_facts, relative_size)
from .matrix_report import DEFAULT_RELEASES, _load_release, _matrix_run, build_matrix, write_matrix
from .paths import output_dir, repo_root

__all__ = ["DEFAULT_RELEASES", "KINDS", "ReleaseEnv", "build_matrix", "change_section", "classify", "differences",
           "distinct_texts", "ensure_env", "flatten", "group_differences", "notebook_facts", "output_dir",
           "pinned_release", "relative_size", "repo_root", "run_matrix", "run_release", "shared_site_packages",
           "sort_differences", "venvs_dir", "write_matrix", "COLLAPSED", "LARGE_FLOAT", "PIP", "STAMP", "_ABSENT",
           "_ERROR_NAME", "_SOURCE_LOCATION", "_behaviour_line", "_build_env", "_check_probe", "_has_float",
           "_incomplete", "_kit_skew", "_leaf", "_link_jupyter_data", "_load_release", "_lock", "_matrix_run",
           "_not_recorded", "_notebook_facts", "_numbers", "_probe", "_run", "_tail", "_verdict_changes", "boundary_changes", "detail_section"]


def run_release(release: str, out_base: Path, notebooks: Sequence[str] | None = None,
                jobs: int | None = None, log=print) -> dict[str, Any]:
    """matrix_run.run_release with this module's ensure_env (looked up at call time)."""
    return matrix_run.run_release(release, out_base, notebooks, jobs, log, ensure=ensure_env)


def run_matrix(releases: Sequence[str] = DEFAULT_RELEASES, notebooks: Sequence[str] | None = None,
               jobs: int | None = None, out_base: Path | None = None, log=print) -> tuple[Path, list[dict[str, Any]]]:
    """matrix_run.run_matrix with this module's ensure_env (looked up at call time)."""
    return matrix_run.run_matrix(releases, notebooks, jobs, out_base, log, ensure=ensure_env)
