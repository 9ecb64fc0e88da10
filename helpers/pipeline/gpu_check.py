"""`make gpu-check`: notebook 05's GPU experiment on CUDA, on the pinned release and on 5.20.0 (the first release
with the prefetch-stream ordering edge), plus any `--releases`. Each release runs in its own environment
(helpers.pipeline.release_matrix.ensure_env: the pinned release is the running environment), with
`python -m helpers.pipeline.runner run 05 -p device cuda` and KVKIT_OUTPUT_DIR=outputs/gpu/<release>/; the
verdicts of every release are printed and written to outputs/gpu/gpu-check.json. Notebook 07 follows in the same
environment with `-p device cuda -p dtype float16` (its FlashAttention-2 column, where flash_attn is installed). Without CUDA it says so in
one line and exits 2 without running anything.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .paths import output_dir, repo_root

NOTEBOOK = "05_hybrid_offloading_drift"
# Notebook 07's FlashAttention-2 column, run after 05 in the same release environment (float16, flash_attn needed).
FLASH_NOTEBOOK, FLASH_ARGS = "07_regression_families", ("-p", "device", "cuda", "-p", "dtype", "float16")
EDGE_RELEASE = "5.20.0"
CLAIMS = ("offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
          "offload.ordering_edge_removes_drift", "offload.prefetch_reads_unordered_copy",
          "offload.race_replay_drifts_like_report", "regress.flash_attention_2_matches_sdpa")
NO_CUDA = 2


def releases_to_run(extra: list[str] | None) -> list[str]:
    """The pinned release, 5.20.0, then `extra`, without repeats."""
    from .release_matrix import pinned_release

    return list(dict.fromkeys([r for r in [pinned_release(), EDGE_RELEASE, *(extra or [])] if r]))


def run_notebook(python: str, out: Path, timeout: float) -> int:
    """Notebook 05 with `-p device cuda`, then notebook 07 on CUDA in float16, under `python`, writing into `out`;
    the first non-zero exit status (0 when both ran)."""
    from .envs import child_env

    env = child_env(out)
    codes = []
    for nb, args in (("05", ("-p", "device", "cuda")), ("07", FLASH_ARGS)):
        cmd = [python, "-m", "helpers.pipeline.runner", "run", nb, *args]
        try:
            codes.append(subprocess.call(cmd, cwd=str(repo_root()), env=env, timeout=timeout))
        except subprocess.TimeoutExpired:
            codes.append(124)
    return next((c for c in codes if c), 0)


def verdicts(out: Path) -> dict[str, str]:
    """claim id -> verdict from a release's results files (05, then 07; empty when there are none)."""
    found: dict[str, str] = {}
    for stem in (NOTEBOOK, FLASH_NOTEBOOK):
        try:
            data = json.loads((out / "results" / f"{stem}.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        found.update({c["id"]: c["verdict"] for c in data.get("claims", [])})
    return found


def check_release(release: str, timeout: float, run: Callable[[str, Path, float], int] = run_notebook,
                  log: Callable[..., None] = print) -> dict[str, Any]:
    """Prepare the release's environment and run notebook 05 on CUDA in it."""
    from .release_matrix import ensure_env

    out = output_dir("gpu", release)
    start = time.perf_counter()
    env = ensure_env(release, log)
    row: dict[str, Any] = {"release": release, "environment_ok": env.ok, "reason": env.reason, "rc": None}
    if env.ok and env.python:
        log(f"[gpu-check] transformers {release}: running {NOTEBOOK} on CUDA", flush=True)
        row["rc"] = run(env.python, out, timeout)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["verdicts"] = verdicts(out)
    row["results"] = f"outputs/gpu/{release}/results/{NOTEBOOK}.json"
    return row


def main(argv: list[str] | None = None, cuda_available: bool | None = None,
         run: Callable[[str, Path, float], int] = run_notebook) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="*", default=None, help="releases besides the pinned one and 5.20.0")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per release (default 600)")
    args = parser.parse_args(argv)
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); notebook 05's GPU experiment "
              "needs one, nothing was run.")
        return NO_CUDA
    rows = [check_release(r, args.timeout, run) for r in releases_to_run(args.releases)]
    (output_dir("gpu") / "gpu-check.json").write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        status = "ok" if row["rc"] == 0 else (f"exit {row['rc']}" if row["environment_ok"] else f"no environment: {row['reason']}")
        print(f"transformers {row['release']}: {status} in {row['seconds']:.0f}s -> {row['results']}")
        for cid in CLAIMS:
            print(f"  {cid}: {row['verdicts'].get(cid, 'no result')}")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
