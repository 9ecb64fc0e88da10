"""The claim that compares releases (`make gpu-check`): drift on the release without the prefetch-stream ordering
edge, none on the release with it (5.20.0), with the same models and the same device lag.

A pure function of two `python -m helpers.offload.gpu` results (gpu-arms.json, as loaded): the report's loop on the
primary model and dtype, offloading=True against offloading=False beyond the noise floor measured in the same run
(logits) or a state tensor beyond its floor. Not the same models or not the same lag: not like with like, skipped.
"""
from __future__ import annotations

from typing import Any

from .arms import OFF

CLAIM = "offload.drift_only_without_ordering_edge"
KIND = "beyond"
STATEMENT = ("On CUDA, with the same models and the same calibrated device lag, offloading=True drifts in the report's "
             "loop on the release without the prefetch-stream ordering edge and does not on the first release with it (5.20.0).")


def primary_key(data: dict[str, Any]) -> tuple[str, str, str]:
    """The report's loop, the first model, bfloat16 where it ran (the primary arm of a GPU experiment)."""
    s = data["settings"]
    return ("report", s["models"][0], "bfloat16" if "bfloat16" in s["dtypes"] else s["dtypes"][0])


def drift(data: dict[str, Any], key: tuple[str, str, str]) -> bool | None:
    """offloading=True beyond the floor at `key` (a step or a state tensor); None: that arm is not in the run."""
    match = lambda r: (r["loop"], r["model"], r["dtype"]) == key and r["variant"] == OFF  # noqa: E731
    steps = [r for r in data["tables"]["steps"] if match(r)]
    if not steps:
        return None
    return any(bool(r["differs"]) for r in steps) or any(match(r) for r in data["tables"].get("states_differing") or [])


def lags(data: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(model, dtype) -> the sleep per forward the run used (cycles)."""
    rows = data.get("tables", {}).get("calibration", [])
    return {(r["model"], r["dtype"]): int(r["sleep_cycles_used"]) for r in rows}


def decide(without: dict[str, Any], with_edge: dict[str, Any]) -> dict[str, Any]:
    """The claim's record (id, kind, verdict, reason, evidence) from the two releases' results ({}: not run)."""
    out = {"id": CLAIM, "kind": KIND, "statement": STATEMENT}
    missing = [r for r, d in (("without the edge", without), ("with the edge", with_edge)) if not d.get("tables")]
    if missing:
        return {**out, "verdict": "skipped", "reason": f"no GPU arms result for the release {' and '.join(missing)}", "evidence": {}}
    key, lag_a, lag_b = primary_key(without), lags(without), lags(with_edge)
    same_models = without["settings"].get("runs") == with_edge["settings"].get("runs")
    common = sorted(set(lag_a) & set(lag_b))
    same_lag = bool(common) and all(lag_a[k] == lag_b[k] for k in common)
    ev = {"key": list(key), "release_without": without.get("release"), "release_with": with_edge.get("release"),
          "same_models": same_models, "same_lag": same_lag,
          "lag_cycles": {f"{m}/{d}": [lag_a[(m, d)], lag_b[(m, d)]] for m, d in common},
          "drift_without_edge": drift(without, key), "drift_with_edge": drift(with_edge, key)}
    simulated = without["settings"].get("simulated_on_cpu") or with_edge["settings"].get("simulated_on_cpu")
    prefix = "[simulated on CPU] " if simulated else ""
    unlike = [w for w, bad in (("different models", not same_models), ("different lag", not same_lag),
                               ("the arm is missing", None in (ev["drift_without_edge"], ev["drift_with_edge"]))) if bad]
    if unlike:
        return {**out, "verdict": "skipped", "reason": prefix + "not like with like: " + ", ".join(unlike), "evidence": ev}
    holds = bool(ev["drift_without_edge"]) and not ev["drift_with_edge"]
    why = (f"{'/'.join(key)}: drift on {ev['release_without']} = {ev['drift_without_edge']}, on {ev['release_with']} = "
           f"{ev['drift_with_edge']} (same models, same lag)")
    return {**out, "verdict": "holds" if holds else "fails", "reason": prefix + why, "evidence": ev}
