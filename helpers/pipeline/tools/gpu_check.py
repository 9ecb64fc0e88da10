"""`make gpu-check`: notebook 05's GPU arms on CUDA, on the pinned release and on 5.20.0 (the first release with the
prefetch-stream ordering edge), plus any `--releases`, without jupyter. Each release runs in its own environment
(envs.ensure_env with GPU_MODULES: torch, transformers, pandas, matplotlib; the pinned release is the running
environment; 5.20.0 installs offline from wheels/ when `make gpu-wheels` put it there) with
`python -m helpers.offload.gpu --out outputs/gpu/<release> --dtypes float32 bfloat16`, the code notebook 05 runs.
Notebook 07's FlashAttention-2 step (`-p device cuda -p dtype float16`) follows where papermill imports. The
verdicts of every release are printed and written, with the seconds each took, to outputs/gpu/gpu-check.json.
Without CUDA it says why in one line and exits 2 before building or running anything.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..paths import output_dir, repo_root
from ..report.records import load_json

ARMS_MODULE, ARMS_FILE, DTYPES = "helpers.offload.gpu", "gpu-arms.json", ("float32", "bfloat16")
# Notebook 07's FlashAttention-2 column, run after the arms in the same release environment (float16, flash_attn).
FLASH_NOTEBOOK, FLASH_ARGS = "07_regression_families", ("-p", "device", "cuda", "-p", "dtype", "float16")
FLASH_CLAIM, FLASH_SKIPPED = "regress.flash_attention_2_matches_sdpa", "skipped: papermill not installed"
EDGE_RELEASE = "5.20.0"
CLAIMS = ("offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
          "offload.ordering_edge_removes_drift", "offload.race_observed_on_device",
          "offload.offload_event_removes_drift", "offload.record_stream_removes_drift", FLASH_CLAIM)
NO_CUDA = 2
TORCH_PROBE = "import torch; print(torch.version.cuda, torch.cuda.is_available())"
SIMULATED = ("simulated", True, "")  # --simulate: torch_cuda's answer taken as given (tests only)
Probe = Callable[[str], "tuple[str | None, bool, str]"]
Step = Callable[[str, Path, float], "int | str"]  # an exit status, or why the step was skipped


def releases_to_run(extra: list[str] | None) -> list[str]:
    """The pinned release, 5.20.0, then `extra`, without repeats."""
    from ..matrix.envs import pinned_release

    return list(dict.fromkeys([r for r in [pinned_release(), EDGE_RELEASE, *(extra or [])] if r]))


def _call(cmd: list[str], out: Path | None, timeout: float, **kw: Any) -> int:
    """`cmd` from the checkout's root in a release python's environment; its exit status (124 on timeout)."""
    from ..matrix.envs import child_env

    try:
        return subprocess.run(cmd, cwd=str(repo_root()), env=child_env(out), timeout=timeout, **kw).returncode
    except subprocess.TimeoutExpired:
        return 124


def torch_cuda(python: str) -> tuple[str | None, bool, str]:
    """(torch.version.cuda, torch.cuda.is_available(), why the probe failed) in `python`."""
    from ..matrix.envs import _tail, child_env

    try:
        res = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=300,
                             cwd=str(repo_root()), env=child_env())
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


def refusal_line(reason: str) -> str:
    return f"gpu-check: {reason}; the GPU arms need CUDA, nothing was run."


def run_arms(python: str, out: Path, timeout: float, extra: tuple[str, ...] = ()) -> int:
    """`python -m helpers.offload.gpu --out <out> --dtypes float32 bfloat16`; its exit status (2: it refused)."""
    return _call([python, "-m", ARMS_MODULE, "--out", str(out), "--dtypes", *DTYPES, *extra], out, timeout)


def simulated_arms(python: str, out: Path, timeout: float) -> int:
    """run_arms with --simulate: the arms on CPU under stand-ins (tests only)."""
    return run_arms(python, out, timeout, ("--simulate",))


def no_flash(python: str, out: Path, timeout: float) -> str:
    return "skipped: simulated run (notebook 07's flash step needs CUDA)"


def has_papermill(python: str) -> bool:
    return _call([python, "-c", "import papermill"], None, 300, capture_output=True) == 0


def run_flash(python: str, out: Path, timeout: float) -> int | str:
    """Notebook 07 on CUDA in float16 under `python`, writing into `out`; FLASH_SKIPPED where papermill does not
    import."""
    if not has_papermill(python):
        return FLASH_SKIPPED
    return _call([python, "-m", "helpers.pipeline.run", "run", "07", *FLASH_ARGS], out, timeout)


def verdicts(out: Path) -> dict[str, str]:
    """claim id -> verdict from a release's gpu-arms.json, then notebook 07's results (empty when there are none)."""
    found: dict[str, str] = {}
    for path in (out / ARMS_FILE, out / "results" / f"{FLASH_NOTEBOOK}.json"):
        found.update({c["id"]: c["verdict"] for c in load_json(path).get("claims", []) if "id" in c})
    return found


def arms_facts(out: Path) -> dict[str, Any]:
    """What gpu-arms.json says about its run: release, torch, device, seconds, schema."""
    data = load_json(out / ARMS_FILE)
    return {k: data.get(k) for k in ("schema", "release", "torch", "device_name", "seconds")}


def _timed(step: Step, python: str, out: Path, timeout: float) -> tuple[int | str, float]:
    start = time.perf_counter()
    rc = step(python, out, timeout)
    return rc, round(time.perf_counter() - start, 1)


def check_release(release: str, timeout: float, run: Step = run_arms, flash: Step = run_flash,
                  probe: Probe = torch_cuda, log: Callable[..., None] = print) -> dict[str, Any]:
    """Prepare the release's environment, run the GPU arms in it, then notebook 07's flash step."""
    from ..matrix import envs

    out = output_dir("gpu", release)
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
        row["rc"], row["arms_seconds"] = _timed(run, env.python, out, timeout)
        row["flash_rc"], row["flash_seconds"] = _timed(flash, env.python, out, timeout)
    row["seconds"] = round(time.perf_counter() - start, 1)
    row["verdicts"] = verdicts(out)
    if isinstance(row["flash_rc"], str):  # skipped, and why
        row["verdicts"][FLASH_CLAIM], row["flash_rc"] = row["flash_rc"], None
    row["arms"] = arms_facts(out)
    row["results"] = f"outputs/gpu/{release}/{ARMS_FILE}"
    return row


def release_ok(row: dict[str, Any]) -> bool:
    """The arms ran (exit 0) and the flash step ran cleanly or was skipped."""
    return row["rc"] == 0 and row["flash_rc"] in (0, None)


def _status(row: dict[str, Any]) -> str:
    if not row["environment_ok"]:
        return f"no environment: {row['reason']}"
    if row["rc"] == NO_CUDA:
        return "the GPU arms refused (exit 2: CUDA unusable)"
    flash = "" if row["flash_rc"] in (0, None) else f", notebook 07 exit {row['flash_rc']}"
    return ("ok" if row["rc"] == 0 else f"exit {row['rc']}") + flash


def print_rows(rows: list[dict[str, Any]], total: float) -> None:
    for row in rows:
        device = f" on {row['arms']['device_name']}" if row["arms"].get("device_name") else ""
        print(f"transformers {row['release']}: {_status(row)} in {row['seconds']:.0f}s{device} -> {row['results']}")
        for cid in CLAIMS:
            print(f"  {cid}: {row['verdicts'].get(cid, 'no result')}")
    print(f"gpu-check: {len(rows)} release(s) in {total:.0f}s -> outputs/gpu/gpu-check.json")


def refusal(cuda: tuple[bool, str] | None, probe: Probe) -> str:
    """Why this machine cannot run the GPU arms ('' when it can): the torch build and devices, then torch itself."""
    from ..run.params import cuda_status

    ok, why = cuda_status() if cuda is None else cuda
    if not ok:
        return why
    return probe_refusal(sys.executable, probe(sys.executable))


def main(argv: list[str] | None = None, cuda: tuple[bool, str] | None = None, probe: Probe = torch_cuda,
         run: Step = run_arms, flash: Step = run_flash) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="*", default=None, help="releases besides the pinned one and 5.20.0")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per step and release (default 600)")
    parser.add_argument("--simulate", action="store_true",
                        help="tests only: no CUDA refusal, the arms with --simulate (CPU stand-ins), no flash step")
    args = parser.parse_args(argv)
    if args.simulate:
        cuda, probe, run, flash = (True, ""), lambda python: SIMULATED, simulated_arms, no_flash
    why = refusal(cuda, probe)
    if why:
        print(refusal_line(why))
        return NO_CUDA
    start = time.perf_counter()
    rows = [check_release(r, args.timeout, run, flash, probe) for r in releases_to_run(args.releases)]
    total = round(time.perf_counter() - start, 1)
    summary = {"schema": "kvkit-gpu-check/1", "seconds": total, "releases": rows}
    (output_dir("gpu") / "gpu-check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_rows(rows, total)
    return 0 if all(release_ok(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
