"""The matrix runner: each release's notebooks under its environment's python (`runner run-all`, so
papermill's kernel is that python too) with KVKIT_OUTPUT_DIR=outputs/matrix/<release>; cli._matrix runs every
release in turn as one recorded run, then matrix.md."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from . import envs
from .envs import ReleaseEnv, child_env
from ..paths import repo_root
from ..report.scrub import scrub


def run_release(release: str, out_base: Path, notebooks: Sequence[str] | None = None,
                jobs: int | None = None, log=print, ensure: Callable[..., ReleaseEnv] | None = None) -> dict[str, Any]:
    """Install (or reuse) the release's environment (`ensure`, default envs.ensure_env) and run the notebooks under it."""
    dest = out_base / "matrix" / release
    for sub in ("results", "notebooks", "figures", "html"):
        shutil.rmtree(dest / sub, ignore_errors=True)
    for name in ("SUMMARY.md", "timings.json", "release.json"):
        (dest / name).unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    log(f"[matrix] transformers {release}: preparing environment", flush=True)
    env = (ensure or envs.ensure_env)(release, log)
    info: dict[str, Any] = {**asdict(env), "rc": None, "run_seconds": None}
    if not env.ok:
        log(f"[matrix] transformers {release}: cannot run: {env.reason}", flush=True)
    else:
        log(f"[matrix] transformers {release}: {'reusing' if env.reused else 'built'} {env.python} "
            f"({env.seconds:.0f}s); running notebooks", flush=True)
        cmd = [env.python, "-m", "helpers.pipeline.run", "run-all"]
        if notebooks:
            cmd += ["--notebooks", *notebooks]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        start = time.perf_counter()
        rc = subprocess.call(cmd, cwd=str(repo_root()), env=child_env(dest))
        info["rc"], info["run_seconds"] = rc, round(time.perf_counter() - start, 1)
        log(f"[matrix] transformers {release}: run-all exit {rc} in {info['run_seconds']:.0f}s", flush=True)
    (dest / "release.json").write_text(scrub(json.dumps(info, indent=2), out_base) + "\n")
    return info

