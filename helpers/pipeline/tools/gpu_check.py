"""`make gpu-check`: notebook 05's GPU arms on CUDA, on the pinned release and on 5.20.0 (the first release with the
prefetch-stream ordering edge), plus any `--releases`, without jupyter. Each release runs in its own environment
(envs.ensure_env with GPU_MODULES: torch, transformers, pandas, matplotlib; the pinned release is the running
environment; 5.20.0 installs offline from wheels/ when `make gpu-wheels` put it there) with
`python -m helpers.offload.gpu --out <out>/<release> --dtypes float32 bfloat16`, the code notebook 05 runs (releases
after the first with `--lag-from` the first's results: the same lag). Notebook 07's FlashAttention-2 step (`-p device
cuda -p dtype float16`) follows where papermill imports. Every step has its own timeout (`--timeout`, and a whole
`--budget`), so a hang loses that step only. Everything goes under one folder (`--out`, default outputs/gpu): the
plan, each step's log, each release's results, and gpu-check.json with every release's verdicts, their seconds and
the claim that compares releases (helpers.offload.gpu.releases_claim). Without CUDA it says why in one line and
exits 2 before building or running anything.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..paths import output_dir, repo_root
from ..report.records import load_json
from .gpu_plan import EDGE_RELEASE, STEP_TIMEOUT, plan, plan_lines, releases_to_run

ARMS_MODULE, ARMS_FILE, DTYPES = "helpers.offload.gpu", "gpu-arms.json", ("float32", "bfloat16")
# Notebook 07's FlashAttention-2 column, run after the arms in the same release environment (float16, flash_attn).
FLASH_NOTEBOOK, FLASH_ARGS = "07_regression_families", ("-p", "device", "cuda", "-p", "dtype", "float16")
FLASH_CLAIM, FLASH_SKIPPED = "regress.flash_attention_2_matches_sdpa", "skipped: papermill not installed"
CLAIMS = ("offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
          "offload.ordering_edge_removes_drift", "offload.race_observed_on_device",
          "offload.offload_event_removes_drift", "offload.record_stream_removes_drift",
          "offload.block_overwritten_under_pending_read", "offload.unlagged_run_drifts", FLASH_CLAIM)
NO_CUDA = 2
TORCH_PROBE = "import torch; print(torch.version.cuda, torch.cuda.is_available())"
SIMULATED = ("simulated", True, "")  # --simulate: torch_cuda's answer taken as given (tests only)
Probe = Callable[[str], "tuple[str | None, bool, str]"]
Step = Callable[..., "int | str"]  # (python, out, timeout[, extra]): an exit status, or why the step was skipped
TIMED_OUT, MIN_STEP_S = 124, 10.0


def _call(cmd: list[str], out: Path | None, timeout: float, log: Path | None = None) -> int:
    """`cmd` from the checkout's root in a release python's environment; its exit status (124 on timeout). Its output
    and errors go to `log` as they come (kept when it timed out), whose last lines are then printed; without `log`, to
    nowhere."""
    from ..releases.envs import child_env

    with open(log or os.devnull, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=str(repo_root()), env=child_env(out), timeout=timeout, stdout=f,
                                stderr=subprocess.STDOUT).returncode
        except subprocess.TimeoutExpired:
            rc = TIMED_OUT
            f.write(f"\n[gpu-check] timed out after {timeout:.0f} s\n")
    if log is not None:
        print("\n".join(f"  | {line}" for line in log.read_text().strip().splitlines()[-12:]), flush=True)
    return rc


def torch_cuda(python: str) -> tuple[str | None, bool, str]:
    """(torch.version.cuda, torch.cuda.is_available(), why the probe failed) in `python`."""
    from ..releases.envs import _run, _tail

    try:
        res = _run([python, "-c", TORCH_PROBE], timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, False, f"{type(exc).__name__}: {exc}"
    if res.returncode != 0:
        return None, False, _tail(res.stderr) or f"exit {res.returncode}"
    words = (res.stdout.strip().splitlines() or [""])[-1].split()
    version = words[0] if words and words[0] != "None" else None
    return version, len(words) > 1 and words[1] == "True", ""


def probe_refusal(python: str, probed: tuple[str | None, bool, str]) -> str:
    """Why `python`'s torch cannot run the GPU arms ('' when it can), from torch_cuda's answer."""
    version, available, error = probed
    if error:
        return f"torch does not import in {python}: {error}"
    if version is None:
        return f"torch in {python} is a CPU-only build (torch.version.cuda is None)"
    if not available:
        return f"torch.cuda.is_available() is False in {python} (a CUDA {version} build; no usable device)"
    return ""


def run_arms(python: str, out: Path, timeout: float, extra: tuple[str, ...] = ()) -> int:
    """`python -m helpers.offload.gpu --out <out> --dtypes float32 bfloat16 [extra]`, its output in <out>/arms.log;
    its exit status (2: it refused, 124: timed out)."""
    out.mkdir(parents=True, exist_ok=True)
    return _call([python, "-m", ARMS_MODULE, "--out", str(out), "--dtypes", *DTYPES, *extra], out, timeout, out / "arms.log")


# --simulate (tests only): small inputs, one model, one dtype, two loops, so that the CPU run of both releases is short;
# every model, dtype and loop runs under the stand-ins in-process in tests/test_offload_gpu*.py.
SIMULATED_SIZE = ("--seq-len", "8", "--n-steps", "3", "--models", "tiny hybrid", "--loops", "report", "cpu",
                  "--dtypes", "bfloat16")


def has_papermill(python: str) -> bool:
    return _call([python, "-c", "import papermill"], None, 300) == 0


def run_flash(python: str, out: Path, timeout: float) -> int | str:
    """Notebook 07 on CUDA in float16 under `python`, writing into `out`; FLASH_SKIPPED where papermill does not
    import."""
    if not has_papermill(python):
        return FLASH_SKIPPED
    return _call([python, "-m", "helpers.pipeline.run", "run", "07", *FLASH_ARGS], out, timeout, out / "flash.log")


def verdicts(out: Path) -> dict[str, str]:
    """claim id -> verdict from a release's gpu-arms.json, then notebook 07's results (empty when there are none)."""
    found: dict[str, str] = {}
    for path in (out / ARMS_FILE, out / "results" / f"{FLASH_NOTEBOOK}.json"):
        found.update({c["id"]: c["verdict"] for c in load_json(path).get("claims", []) if "id" in c})
    return found


def step_timeout(timeout: float, deadline: float | None) -> float:
    """The step's timeout: `timeout`, or what is left of the budget when less (0: nothing left)."""
    left = timeout if deadline is None else min(timeout, deadline - time.monotonic())
    return left if left >= MIN_STEP_S else 0.0


def _step(step: Step, python: str, out: Path, timeout: float, deadline: float | None, extra: tuple[str, ...] = ()) -> tuple[int | str, float]:
    """`step` with what is left of its timeout (step_timeout): its exit status (or why it was skipped) and seconds."""
    allowed = step_timeout(timeout, deadline)
    if not allowed:
        return "skipped: the budget was spent", 0.0
    start = time.perf_counter()
    rc = step(python, out, allowed, extra) if extra else step(python, out, allowed)
    return rc, round(time.perf_counter() - start, 1)


def check_release(release: str, timeout: float, run: Step = run_arms, flash: Step = run_flash,
                  probe: Probe = torch_cuda, log: Callable[..., None] = print, root: Path | None = None,
                  lag_from: Path | None = None, deadline: float | None = None) -> dict[str, Any]:
    """Prepare the release's environment, run the GPU arms in it (with `lag_from`'s lag), then notebook 07's flash step."""
    from ..releases import envs

    root = root or output_dir("gpu")
    out = root / release
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / ARMS_FILE, out / "results" / f"{FLASH_NOTEBOOK}.json"):
        stale.unlink(missing_ok=True)
    start = time.perf_counter()
    env = envs.ensure_env(release, log, modules=envs.GPU_MODULES)
    row: dict[str, Any] = {"release": release, "environment_ok": env.ok, "reason": env.reason, "rc": None,
                           "flash_rc": None, "environment_seconds": round(time.perf_counter() - start, 1)}
    if env.ok and env.python and env.python != sys.executable:
        row["reason"] = probe_refusal(f"the {release} environment", probe(env.python))
        row["environment_ok"] = not row["reason"]
    if row["environment_ok"] and env.python:
        log(f"[gpu-check] transformers {release}: running the GPU arms ({ARMS_MODULE})", flush=True)
        extra = ("--lag-from", str(lag_from)) if lag_from is not None and lag_from.is_file() else ()
        row["lag_from"] = lag_from.parent.name if extra else None
        row["rc"], row["arms_seconds"] = _step(run, env.python, out, timeout, deadline, extra)
        if isinstance(row["rc"], str):  # the budget was spent before the arms
            row["reason"], row["rc"] = row["rc"], None
        row["flash_rc"], row["flash_seconds"] = _step(flash, env.python, out, timeout, deadline)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["verdicts"] = verdicts(out)
    if isinstance(row["flash_rc"], str):  # skipped, and why
        row["verdicts"][FLASH_CLAIM], row["flash_rc"] = row["flash_rc"], None
    arms = load_json(out / ARMS_FILE)  # what gpu-arms.json says about its run
    row["arms"] = {k: arms.get(k) for k in ("schema", "release", "torch", "device_name", "seconds")}
    row["results"] = f"{root.name}/{release}/{ARMS_FILE}"
    return row


def release_ok(row: dict[str, Any]) -> bool:
    """The arms ran (exit 0) and the flash step ran cleanly or was skipped."""
    return row["rc"] == 0 and row["flash_rc"] in (0, None)


def _status(row: dict[str, Any]) -> str:
    if not row["environment_ok"]:
        return f"no environment: {row['reason']}"
    if row["rc"] is None:
        return f"not run: {row['reason']}"
    if row["rc"] == NO_CUDA:
        return "the GPU arms refused (exit 2: CUDA unusable)"
    if row["rc"] == TIMED_OUT:
        return f"the GPU arms timed out after {row.get('arms_seconds', 0):.0f} s (the per-step timeout)"
    flash = "" if row["flash_rc"] in (0, None) else f", notebook 07 exit {row['flash_rc']}"
    return ("ok" if row["rc"] == 0 else f"exit {row['rc']}") + flash


def print_rows(rows: list[dict[str, Any]], total: float, root: Path) -> None:
    for row in rows:
        device = f" on {row['arms']['device_name']}" if row["arms"].get("device_name") else ""
        print(f"transformers {row['release']}: {_status(row)} in {row['seconds']:.0f}s{device} -> {row['results']}")
        for cid in CLAIMS:
            print(f"  {cid}: {row['verdicts'].get(cid, 'no result')}")
    print(f"gpu-check: {len(rows)} release(s) in {total:.0f}s -> {root.name}/gpu-check.json")


def refusal(cuda: tuple[bool, str] | None, probe: Probe) -> str:
    """Why this machine cannot run the GPU arms ('' when it can): the torch build and devices, then torch itself."""
    from ..run.params import cuda_status

    ok, why = cuda_status() if cuda is None else cuda
    if not ok:
        return why
    return probe_refusal(sys.executable, probe(sys.executable))


def cross_release(rows: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    """The claim comparing the first release without the ordering edge with the first release with it."""
    from packaging.version import Version

    from ...offload.gpu import releases_claim

    before = [r["release"] for r in rows if Version(r["release"]) < Version(EDGE_RELEASE)]
    load = lambda release: load_json(root / release / ARMS_FILE) if release else {}  # noqa: E731
    with_edge = EDGE_RELEASE if any(r["release"] == EDGE_RELEASE for r in rows) else None
    return releases_claim(load(before[0] if before else None), load(with_edge))


def main(argv: list[str] | None = None, cuda: tuple[bool, str] | None = None, probe: Probe = torch_cuda,
         run: Step = run_arms, flash: Step = run_flash) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="*", default=None, help="releases besides the pinned one and 5.20.0")
    parser.add_argument("--timeout", type=float, default=STEP_TIMEOUT, help=f"seconds per step (default {STEP_TIMEOUT:.0f})")
    parser.add_argument("--budget", type=float, default=0.0, help="seconds for the whole check (0: no limit); a step "
                        "gets what is left when that is less than --timeout")
    parser.add_argument("--out", default=None, help="the one folder everything goes to (default outputs/gpu)")
    parser.add_argument("--simulate", action="store_true",
                        help="tests only: no CUDA refusal, the arms with --simulate (CPU stand-ins), no flash step")
    args = parser.parse_args(argv)
    if args.simulate:
        cuda, probe = (True, ""), lambda python: SIMULATED
        run = lambda py, out, t, extra=(): run_arms(py, out, t, (*extra, *SIMULATED_SIZE, "--simulate"))  # noqa: E731
        flash = lambda *a: "skipped: simulated run (notebook 07's flash step needs CUDA)"  # noqa: E731
    why = refusal(cuda, probe)
    if why:
        print(f"gpu-check: {why}; the GPU arms need CUDA, nothing was run.")
        return NO_CUDA
    start = time.perf_counter()
    deadline = time.monotonic() + args.budget if args.budget > 0 else None
    root = Path(args.out) if args.out else output_dir("gpu")
    root.mkdir(parents=True, exist_ok=True)
    releases = releases_to_run(args.releases)
    the_plan = plan(releases, step_timeout=args.timeout)
    (root / "plan.txt").write_text("\n".join(plan_lines(the_plan)) + "\n")
    rows: list[dict[str, Any]] = []
    for release in releases:
        first = next((r for r in rows if r["rc"] == 0), None)  # later releases take the first one's lag
        lag_from = root / first["release"] / ARMS_FILE if first else None
        rows.append(check_release(release, args.timeout, run, flash, probe, root=root, lag_from=lag_from, deadline=deadline))
    total = round(time.perf_counter() - start, 1)
    claim = cross_release(rows, root)
    summary = {"schema": "kvkit-gpu-check/1", "seconds": total, "step_timeout_s": args.timeout, "budget_s": args.budget or None,
               "releases": rows, "claims": [claim], "plan": the_plan}
    (root / "gpu-check.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print_rows(rows, total, root)
    print(f"{claim['id']}: {claim['verdict']} - {claim['reason']}")
    return 0 if all(release_ok(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
