"""The matrix runner: each release's notebooks under its environment's python (`runner run-all`, so
papermill's kernel is that python too) with KVKIT_OUTPUT_DIR=outputs/matrix/<release>; cli._matrix runs every
release in turn as one recorded run, then matrix.md. `make bisect` runs its notebook the same way (run_all_under)."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from . import envs
from .envs import ReleaseEnv, child_env
from ..paths import repo_root
from ..report.scrub import scrub


def run_all_under(env: ReleaseEnv, dest: Path, args: Sequence[str], quiet: bool = False) -> tuple[int, float]:
    """`runner run-all ARGS` under the release's python, into a fresh `dest`: (exit code, seconds)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    start = time.perf_counter()
    rc = subprocess.call([env.python, "-m", "helpers.pipeline.run", "run-all", *args], cwd=str(repo_root()),
                         env=child_env(dest), stdout=subprocess.DEVNULL if quiet else None)
    return rc, round(time.perf_counter() - start, 1)


def run_release(release: str, out_base: Path, notebooks: Sequence[str] | None = None,
                jobs: int | None = None, log=print) -> dict[str, Any]:
    """Install (or reuse) the release's environment (envs.ensure_env) and run the notebooks under it."""
    dest = out_base / "matrix" / release
    shutil.rmtree(dest, ignore_errors=True)  # an earlier matrix's results, run record and release.json
    dest.mkdir(parents=True)
    log(f"[matrix] transformers {release}: preparing environment", flush=True)
    env = envs.ensure_env(release, log)
    info: dict[str, Any] = {**asdict(env), "rc": None, "run_seconds": None}
    if not env.ok:
        log(f"[matrix] transformers {release}: cannot run: {env.reason}", flush=True)
    else:
        log(f"[matrix] transformers {release}: {'reusing' if env.reused else 'built'} {env.python} "
            f"({env.seconds:.0f}s); running notebooks", flush=True)
        args = [*(["--notebooks", *notebooks] if notebooks else []), *(["--jobs", str(jobs)] if jobs else [])]
        info["rc"], info["run_seconds"] = run_all_under(env, dest, args)
        log(f"[matrix] transformers {release}: run-all exit {info['rc']} in {info['run_seconds']:.0f}s", flush=True)
    (dest / "release.json").write_text(scrub(json.dumps(info, indent=2), out_base) + "\n")
    return info
