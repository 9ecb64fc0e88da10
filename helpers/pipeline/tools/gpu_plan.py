"""`make gpu-plan`: what `make gpu-check` would run (`plan`, from helpers.offload.gpu_run's arms), printed without CUDA
(exit 0): the releases, the models and their layouts, every arm with its lag (calibrated, or unlagged), the
pinned-pool poisoning, the event probe, the per-step timeout, and the expected device minutes (an estimate, with its
assumptions)."""
from __future__ import annotations

import argparse
import sys
from typing import Any

EDGE_RELEASE = "5.20.0"
STEP_TIMEOUT = 200.0  # seconds per step (one release's arms, or its flash step): a hang loses one step, not the run
CALIBRATION_RUNS = 2  # offloading `.cpu()` runs with no sleep (a warm-up, then the probe of the host time)
# The estimate's host cost per forward on a GPU machine (eager, offloading, timing events): an assumption, stated.
HOST_MS_BASE, HOST_MS_PER_LAYER = 5.0, 1.0
START_S, ENV_S = 40.0, 30.0  # imports, CUDA context, models, the CPU edge record; the 5.20.0 environment from wheels/


def releases_to_run(extra: list[str] | None) -> list[str]:
    """The pinned release, 5.20.0, then `extra`, without repeats."""
    from ..releases.envs import pinned_release

    return list(dict.fromkeys([r for r in [pinned_release(), EDGE_RELEASE, *(extra or [])] if r]))


def layers_of(model: str) -> dict[str, int]:
    """The layout's layer counts (helpers.hybrid.LAYOUTS)."""
    from ... import hybrid

    types = hybrid.LAYOUTS[model]()
    return {"layers": len(types), "linear_attention": types.count("linear_attention"),
            "full_attention": types.count("full_attention")}


def plan(releases: list[str], step_timeout: float = STEP_TIMEOUT, n_steps: int = 4) -> dict[str, Any]:
    """Everything one release runs, with the expected device time (an estimate from the sleep cap and HOST_MS_*)."""
    from ...offload.arms import POISON
    from ...offload.calibrate import MAX_SLEEP_MS, PROBE_MS, SLEEP_FACTOR, WARM_MS
    from ...offload.gpu import BY_CONSTRUCTION, GPU_DECIDES, claim_type
    from ...offload.gpu_run import MODELS, arms_of, model_runs
    from ...offload.loops import LOOPS

    runs = model_runs(MODELS, ("float32", "bfloat16"), LOOPS)
    rows, forwards, seconds = [], 0, 0.0
    for model, dtype, kept in runs:
        host_ms = HOST_MS_BASE + HOST_MS_PER_LAYER * layers_of(model)["layers"]
        lagged, unlagged = 0, CALIBRATION_RUNS
        sleep_ms = min(MAX_SLEEP_MS, SLEEP_FACTOR * host_ms)
        for loop in kept:
            arms = arms_of(loop)
            rows += [{"model": model, "dtype": dtype, "loop": loop, "arm": a[0],
                      "lag": "calibrated" if a[3] else "unlagged"} for a in arms]
            lagged += sum(a[3] for a in arms)
            unlagged += sum(not a[3] for a in arms)
        forwards += (lagged + unlagged) * n_steps
        seconds += n_steps * (lagged * (sleep_ms + host_ms) + unlagged * host_ms) / 1e3
    per_release = START_S + seconds + (WARM_MS + 2 * PROBE_MS) / 1e3
    return {"releases": releases, "layouts": {m: layers_of(m) for m in dict.fromkeys(m for m, _, _ in runs)},
            "runs": [{"model": m, "dtype": d, "loops": list(l)} for m, d, l in runs], "arms": rows,
            "forwards_per_release": forwards, "n_steps": n_steps,
            "pool_poisoning": f"before every offloading arm: cached pinned blocks of the arm's K/V sizes checked out, "
                              f"filled with {POISON} (finite), released",
            "event_probe": f"{PROBE_MS:.0f} ms _sleep on the default stream, the event waited on the prefetch stream, "
                           "query(): the offload-event arm runs only if it held",
            "claims": [{"id": cid, **claim_type(cid)} for cid in (*BY_CONSTRUCTION, *GPU_DECIDES)],
            "step_timeout_s": step_timeout, "seconds_per_release": round(per_release),
            "expected_minutes": round((len(releases) * per_release + ENV_S) / 60, 1),
            "assumptions": f"host {HOST_MS_BASE:.0f} ms + {HOST_MS_PER_LAYER:.0f} ms per layer per forward, the sleep "
                           f"{SLEEP_FACTOR:.0f} x that (cap {MAX_SLEEP_MS:.0f} ms) on every lagged forward; "
                           f"{START_S:.0f} s start-up per release; {ENV_S:.0f} s for the other release's environment"}


def plan_lines(p: dict[str, Any]) -> list[str]:
    """The plan as text, one fact a line."""
    lines = [f"gpu-plan: releases {', '.join(p['releases'])} (the ordering edge from {EDGE_RELEASE}), each in its own environment"]
    lines += [f"  model {model}: {layout['layers']} layers, {layout['linear_attention']} linear_attention / "
              f"{layout['full_attention']} full_attention" for model, layout in p["layouts"].items()]
    lines += [f"  run {run['model']} {run['dtype']}: loops {', '.join(run['loops'])}" for run in p["runs"]]
    lags = {(a["loop"], a["arm"]): a["lag"] for a in p["arms"]}  # an arm's lag is the same on every model
    lines += [f"  arm [{loop}] {arm}: {'unlagged' if lag == 'unlagged' else 'lag calibrated'}" for (loop, arm), lag in lags.items()]
    lines += [f"  pool poisoning: {p['pool_poisoning']}", f"  event probe: {p['event_probe']}",
              f"  per-step timeout: {p['step_timeout_s']:.0f} s (each release's arms, each flash step)",
              f"  forwards per release: {p['forwards_per_release']} ({p['n_steps']} per arm)",
              f"  expected: about {p['seconds_per_release']} s per release, {p['expected_minutes']} minutes in all "
              f"(estimate: {p['assumptions']})",
              "  then the cross-release claim: drift without the ordering edge, none with it (same models, same lag)",
              "  claims:"]
    return lines + [f"    {c['id']}: can fail: yes; decides {c['decides']}; fed by {c['fed_by']}" if c["can_fail"]
                    else f"    {c['id']}: can fail: no (by construction: {c['by_construction']})"
                    for c in p.get("claims", [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-plan", description=__doc__)
    parser.add_argument("--releases", nargs="*", default=None, help="releases besides the pinned one and 5.20.0")
    parser.add_argument("--timeout", type=float, default=STEP_TIMEOUT, help="seconds per step (default 200)")
    args = parser.parse_args(argv)
    print("\n".join(plan_lines(plan(releases_to_run(args.releases), step_timeout=args.timeout))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
