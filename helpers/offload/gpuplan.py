"""What the GPU arms run, in one place: `python -m helpers.offload.gpu` runs it and `make gpu-plan` prints it.

Per model, dtype and loop: offloading=False twice (the noise floor), offloading=True, offloading=True with each fix
edge, all under the calibrated device lag; in the report's loop also offloading=True again (run to run) and
offloading=True with no injected lag (does the model drift by itself?). The report's own 64-layer layout (48
linear_attention / 16 full_attention) runs in its dtype (bfloat16) and its loop only. Before every offloading arm
the pinned host pool is poisoned (helpers.offload.arms).
"""
from __future__ import annotations

from typing import Any

from .arms import AGAIN, BASE, FIXES, OFF, OFF_AGAIN, POISON, UNLAGGED, variant_name
from .calibrate import MAX_SLEEP_MS, PROBE_MS, SLEEP_FACTOR, WARM_MS
from .loops import LOOPS
from ..quotes import QUOTES

MODELS = ("tiny hybrid", "tiny dense", "report layout (64)")
RESTRICTED = {"report layout (64)": (("bfloat16",), ("report",))}  # the report's layout: its dtype and loop only
CALIBRATION_RUNS = 2  # offloading `.cpu()` runs with no sleep (a warm-up, then the probe of the host time)
# The estimate's host cost per forward on a GPU machine (eager, offloading, timing events): an assumption, stated.
HOST_MS_BASE, HOST_MS_PER_LAYER = 5.0, 1.0
START_S, ENV_S = 40.0, 30.0  # imports, CUDA context, models, the CPU edge record; the 5.20.0 environment from wheels/

Arm = tuple[str, bool, "str | None", bool]  # (variant, offloading, fix edge, lagged)

# Once the lag is injected these hold by construction (never counted as the report's statements: helpers/quotes.py
# says so in by_construction); GPU_DECIDES: what only a GPU decides, each able to fail, and the arms that feed it.
BY_CONSTRUCTION = {**{cid: QUOTES[cid].by_construction for cid in (
    "offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
    "offload.race_observed_on_device")},
    "offload.drift_only_without_ordering_edge": "the same lag on both releases, and 5.20.0's edge orders the reads it races"}
GPU_DECIDES = {
    "offload.ordering_edge_removes_drift": ("whether 5.20.0's ordering edge removes the logit drift",
                                            "offloading=True and + 5.20.0 edge, report loop, every model that drifts "
                                            "(the 64-layer layout's included)"),
    "offload.offload_event_removes_drift": ("whether an event after each offload removes it (host-buffer hazard only)",
                                            "+ offload event (where the device probe holds), report loop, every model"),
    "offload.record_stream_removes_drift": ("whether record_stream on the prefetched K/V removes it (reuse hazard only)",
                                            "+ record_stream, report loop, every model"),
    "offload.block_overwritten_under_pending_read": ("device-timed count of prefetches that overwrite a block whose read "
                                                     "has not finished (the allocator's reuse), none with record_stream",
                                                     "every offloading arm's CUDA events and data pointers (64-layer included)"),
    "offload.unlagged_run_drifts": ("whether a run with no injected lag drifts at all (logits; end state shown apart)",
                                    "offloading=True (unlagged), report loop, every model (64-layer included)"),
}
DEVICE_CLAIMS = ("offload.block_overwritten_under_pending_read", "offload.unlagged_run_drifts")  # decided from device timing / unlagged arms


def claim_type(cid: str) -> dict[str, Any]:
    """Whether a GPU claim can fail on a GPU, and why not (by construction) or what it decides and from which arms."""
    if cid in BY_CONSTRUCTION:
        return {"can_fail": False, "by_construction": BY_CONSTRUCTION[cid]}
    what, arms = GPU_DECIDES[cid]
    return {"can_fail": True, "decides": what, "fed_by": arms}


def arms_of(loop: str, fixes: tuple[str, ...] = FIXES, unlagged: bool = True) -> list[Arm]:
    """The arms of one loop, in run order."""
    arms: list[Arm] = [(BASE, False, None, True), (AGAIN, False, None, True), (OFF, True, None, True)]
    arms += [(variant_name(e), True, e, True) for e in fixes]
    if loop == "report":
        arms.append((OFF_AGAIN, True, None, True))
        if unlagged:
            arms.append((UNLAGGED, True, None, False))
    return arms


def model_runs(models: tuple[str, ...], dtypes: tuple[str, ...],
               loops: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(model, dtype, loops) in run order: dtypes outer, models inner; a RESTRICTED model only in its dtypes, loops."""
    out = []
    for dtype in dtypes:
        for model in models:
            only_dtypes, only_loops = RESTRICTED.get(model, (dtypes, loops))
            kept = tuple(l for l in loops if l in only_loops)
            if dtype in only_dtypes and kept:
                out.append((model, dtype, kept))
    return out


def layers_of(model: str) -> dict[str, int]:
    """The layout's layer counts (helpers.hybrid.LAYOUTS)."""
    from .. import hybrid

    types = hybrid.LAYOUTS[model]()
    return {"layers": len(types), "linear_attention": types.count("linear_attention"),
            "full_attention": types.count("full_attention")}


def plan(releases: list[str], step_timeout: float = 200.0, n_steps: int = 4) -> dict[str, Any]:
    """Everything one release runs, with the expected device time (an estimate from the sleep cap and HOST_MS_*)."""
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
                           f"{SLEEP_FACTOR:.0f} x that (cap {MAX_SLEEP_MS:.0f} ms) on every lagged forward; {START_S:.0f} s start-up per release; "
                           f"{ENV_S:.0f} s for the other release's environment"}
