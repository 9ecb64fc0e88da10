"""Notebook 03's claims, each decided from the measured rows (its finding names this module)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor


SOURCE_STATE = {"rope_deltas": [-42]}
SOURCE_NONE = {"max_abs_diff_none": 17.1328, "cosine_none": 0.30597}
SOURCE_PLUS_1 = {"max_abs_diff_plus_1": 1.21875, "cosine_plus_1": 0.99833}
SOURCE_TOP5_OVERLAP_NONE = 0  # "The top-5 overlap with the correct state was also zero."
BY_CONSTRUCTION = ("the value is fixed by construction, not measured agreement: rope_deltas follows from the image grid "
                   "and the prompt layout alone (a 224x224 image -> 7x7 merged patches take 7 positions for 49 tokens: "
                   "7 - 49 = -42), whatever the weights; the finding is that it is non-zero and outside the cache.")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def _ran(row: Any) -> bool:
    return bool(row is not None and row.get("ran") and row.get("max_abs_diff") is not None)


def decide_state_outside_kv(saved: list | None, cache_matches: list[str]) -> Decision:
    """The prefix prefill leaves a non-zero model-side state, and nothing in the cache is named like it or equals it."""
    nonzero = saved is not None and any(v != 0 for v in saved)
    holds = nonzero and not cache_matches
    why = (f"state {saved} on the model; the cache holds nothing like it" if holds else
           f"state {saved} is zero or missing" if not nonzero else f"the cache holds it: {cache_matches}")
    return Decision(holds, why, {"saved_state": saved, "cache_matches": cache_matches},
                    {"rope_deltas": saved}, SOURCE_STATE, [BY_CONSTRUCTION])


def decide_none_equals_zero(none_vs_zero: dict[str, Any], floor: NoiseFloor) -> Decision:
    """State None and state 0 give bitwise the same first-step logits (the source: identical)."""
    ran = bool(none_vs_zero.get("ran"))
    value = none_vs_zero.get("max_abs_diff") if ran else None
    holds = ran and bool(none_vs_zero.get("bitwise_equal"))
    why = ("bitwise identical" if holds else f"did not run: {none_vs_zero}" if not ran else
           f"not identical: max |diff| {value:.3g} ({'within' if floor.matches(value) else 'beyond'} the noise threshold {floor.threshold:.3g})")
    return Decision(holds, why, {"zero_vs_none": none_vs_zero, **floor.evidence(value)},
                    {"max_abs_diff_none_vs_zero": value}, {"max_abs_diff_none_vs_zero": 0.0})


def decide_missing_state_diverges_more(none: dict[str, Any], plus_1: dict[str, Any], floor: NoiseFloor) -> Decision:
    """None moves the logits beyond the noise, and further than saved + 1 by more than the noise (and lower cosine)."""
    both = _ran(none) and _ran(plus_1)
    holds = (both and floor.differs(none["max_abs_diff"]) and none["max_abs_diff"] - plus_1["max_abs_diff"] > floor.threshold
             and none["cosine"] < plus_1["cosine"])
    why = ("one of the two continuations did not run" if not both else
           f"None: max |diff| {none['max_abs_diff']:.4g} (cosine {none['cosine']:.5f}); +1: {plus_1['max_abs_diff']:.4g} "
           f"(cosine {plus_1['cosine']:.5f}); noise threshold {floor.threshold:.3g}")
    deciding = {"max_abs_diff_none": none.get("max_abs_diff"), "cosine_none": none.get("cosine"),
                "max_abs_diff_plus_1": plus_1.get("max_abs_diff"), "cosine_plus_1": plus_1.get("cosine")}
    mine = ratio(none.get("max_abs_diff"), plus_1.get("max_abs_diff"))
    theirs = ratio(SOURCE_NONE["max_abs_diff_none"], SOURCE_PLUS_1["max_abs_diff_plus_1"])
    scale_free = (f"scale-free: None/+1 ratio of max |diff| {mine:.3g} here, {theirs:.3g} in the source; top-5 overlap of "
                  f"None with the saved state {none.get('top5_overlap')}/5 here, {SOURCE_TOP5_OVERLAP_NONE}/5 in the source; "
                  f"top-1 under None {'unchanged' if none.get('top1_equal') else 'changed'} here, changed in the source "
                  "(left -> The).") if mine is not None else "scale-free comparison not available: a run did not complete."
    return Decision(holds, why, {"none": dict(none), "saved_plus_1": dict(plus_1), **floor.evidence(none.get("max_abs_diff")),
                                 "ratio_none_to_plus_1": mine},
                    deciding, {**SOURCE_NONE, **SOURCE_PLUS_1}, [scale_free])


def decide_fresh_instance_diverges(bare: dict[str, Any], floor: NoiseFloor) -> Decision:
    """The fresh instance given only the cache and the full mask differs from the same-instance continuation beyond the noise."""
    value = bare.get("max_abs_diff") if _ran(bare) else None
    holds = _ran(bare) and floor.differs(value)
    why = (f"did not run: {bare.get('error')}" if not _ran(bare) else
           f"max |diff| {value:.4g} {'>' if holds else '<='} margin x floor {floor.threshold:.3g}")
    return Decision(holds, why, {"fresh_no_state": dict(bare), **floor.evidence(value)},
                    {"max_abs_diff_fresh": value, "cosine_fresh": bare.get("cosine")}, {})


def decide_restored_state_matches(restored: dict[str, Any], floor: NoiseFloor) -> Decision:
    """After restoring the saved resume state, the fresh instance matches within the noise, with the same top-1."""
    value = restored.get("max_abs_diff") if _ran(restored) else None
    holds = _ran(restored) and floor.matches(value) and bool(restored.get("top1_equal"))
    why = (f"did not run: {restored.get('error')}" if not _ran(restored) else
           f"max |diff| {value:.4g} {'<=' if floor.matches(value) else '>'} margin x floor {floor.threshold:.3g}, "
           f"top-1 {'equal' if restored.get('top1_equal') else 'changed'}")
    return Decision(holds, why, {"restored": dict(restored), **floor.evidence(value)},
                    {"max_abs_diff_restored": value, "top1_equal": restored.get("top1_equal")}, {})
