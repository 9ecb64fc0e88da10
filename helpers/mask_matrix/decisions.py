"""Notebook 02's claims, each decided from the measured rows (its finding names this module)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor
from ..continuation import IN_FIRST_CALL, Outcome
from .tables import QUIRK_CALLS


# The source's first model calls (Qwen3-VL-2B, transformers 5.14.1): cached prefix 81, full length 82.
SOURCE_DROPPED = {"first_call_input_ids": [1, 0], "first_call_attention_mask": [1, 1], "past_length": 81}
SOURCE_WORKED = {"first_call_input_ids": [1, 1], "first_call_attention_mask": [1, 82], "past_length": 81}


def _dropped(o: Outcome) -> bool:
    """The source's mechanism: zero input tokens reached the first call, the cache was non-empty, and it raised there."""
    ids, past = o.first_call.get("input_ids_shape"), o.first_call.get("past_length")
    return (not o.ok and ids is not None and ids[-1] == 0 and past is not None and past > 0 and o.stage == IN_FIRST_CALL)


def _unique(values: list[Any]) -> list[Any]:
    """The values once each, in order (shapes are lists: not hashable)."""
    return [v for i, v in enumerate(values) if v not in values[:i]]


def _first_calls(outcomes: dict[Any, Outcome]) -> dict[str, Any]:
    calls = [o.first_call for o in outcomes.values()]
    return {"first_call_input_ids": _unique([c.get("input_ids_shape") for c in calls]),
            "first_call_attention_mask": _unique([c.get("attention_mask_shape") for c in calls]),
            "past_length": _unique([c.get("past_length") for c in calls])}


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


def decide_fails(outcomes: dict[str, Outcome]) -> Decision:
    """Every cache variant fails from a first model call that got zero input tokens with a non-empty cache."""
    by_mechanism = [c for c, o in outcomes.items() if _dropped(o)]
    other = {c: o.error_summary() or "worked" for c, o in outcomes.items() if c not in by_mechanism}
    holds = len(outcomes) > 0 and len(by_mechanism) == len(outcomes)
    why = (f"all {len(outcomes)} variants failed inside the first model call, which got zero input tokens with a non-empty cache"
           if holds else "no run" if not outcomes else f"not the source's mechanism for: {other}")
    firsts = _first_calls(outcomes)
    return Decision(holds, why, {"failed_by_mechanism": by_mechanism, "other_outcomes": other,
                                 "errors": {c: o.error_summary() for c, o in outcomes.items() if not o.ok}, **firsts},
                    {"first_call_input_ids": _one(firsts["first_call_input_ids"]), "past_length": _one(firsts["past_length"])},
                    {k: SOURCE_DROPPED[k] for k in ("first_call_input_ids", "past_length")})


def decide_mask_only_works(outcomes: dict[str, Outcome], diffs: dict[str, float], floor: NoiseFloor) -> Decision:
    """Every variant ran, its first call got the one new token on a non-empty cache (with a mask over cache +
    token, or none at all: newer releases drop an all-ones mask before the call), and its logits match the
    full forward within the noise floor."""
    def good(o: Outcome) -> bool:
        ids, mask, past = (o.first_call.get(k) for k in ("input_ids_shape", "attention_mask_shape", "past_length"))
        return (o.ok and ids is not None and ids[-1] == 1 and past is not None and past > 0
                and (mask is None or mask[-1] == past + 1))
    worst = max((diffs.get(c, float("inf")) for c in outcomes), default=None)
    well_formed = [c for c, o in outcomes.items() if good(o)]
    holds = len(outcomes) > 0 and len(well_formed) == len(outcomes) and floor.matches(worst)
    why = (f"all {len(outcomes)} variants ran with the one token reaching the model; max |diff| vs full forward {worst:.3g} "
           f"<= {floor.threshold:.3g}" if holds else
           f"ran with the token: {well_formed} of {list(outcomes)}; errors: "
           f"{ {c: o.error_summary() for c, o in outcomes.items() if not o.ok} }; max |diff| {worst} vs threshold {floor.threshold:.3g}")
    firsts = _first_calls(outcomes)
    return Decision(holds, why, {"well_formed": well_formed, **firsts, "max_abs_diff_vs_full_forward": diffs, **floor.evidence(worst)},
                    {"first_call_input_ids": _one(firsts["first_call_input_ids"]),
                     "first_call_attention_mask": _one(firsts["first_call_attention_mask"])},
                    {k: SOURCE_WORKED[k] for k in ("first_call_input_ids", "first_call_attention_mask")})


def decide_both_matches_mask_only(diffs: dict[str, float | None], floor: NoiseFloor) -> Decision:
    """mask + positions vs mask alone, per variant (None: one of the two did not run), within the noise floor."""
    ran = {c: d for c, d in diffs.items() if d is not None}
    worst = max(ran.values(), default=None)
    holds = len(diffs) > 0 and len(ran) == len(diffs) and floor.matches(worst)
    why = (f"max |diff| {worst:.3g} <= margin x floor {floor.threshold:.3g}" if holds else
           f"did not run for {sorted(set(diffs) - set(ran))}" if len(ran) != len(diffs) or not diffs else
           f"max |diff| {worst:.3g} > margin x floor {floor.threshold:.3g}")
    return Decision(holds, why, {"max_abs_diff_both_vs_mask_only": diffs, **floor.evidence(worst)},
                    {"max_abs_diff_both_vs_mask_only": worst}, {})


def decide_first_call_drops_suffix(outcomes: dict[str, Outcome]) -> Decision:
    """Every failing run's first model call got zero input tokens with a non-empty cache (and raised there)."""
    failed = {k: o for k, o in outcomes.items() if not o.ok}
    dropped = [k for k, o in failed.items() if _dropped(o)]
    holds = len(failed) > 0 and len(dropped) == len(failed)
    why = (f"all {len(failed)} failing runs: zero input tokens reached the first call, cache non-empty" if holds else
           "no run failed" if not failed else f"other failures: { {k: o.error_summary() for k, o in failed.items() if k not in dropped} }")
    firsts = _first_calls(failed)
    return Decision(holds, why, {"failing_runs": len(failed), "by_mechanism": len(dropped), **firsts},
                    {"first_call_input_ids": _one(firsts["first_call_input_ids"]), "past_length": _one(firsts["past_length"])},
                    {k: SOURCE_DROPPED[k] for k in ("first_call_input_ids", "past_length")})


def decide_forward_needs_positions(runs: dict[str, Outcome], new_tokens: int, mask_length: int) -> Decision:
    """The plain forward fails inside the call because the positions it derives span the full mask (not the new
    token); with sliced positions it works; generate() with the same mask works."""
    plain, sliced, gen = (runs[k] for k in QUIRK_CALLS)
    plain_pos = [s[-1] for s in plain.rotary_position_shapes if s]
    sliced_pos = [s[-1] for s in sliced.rotary_position_shapes if s]
    mechanism = (not plain.ok and plain.stage == IN_FIRST_CALL and bool(plain_pos) and all(n == mask_length for n in plain_pos))
    fixed = sliced.ok and bool(sliced_pos) and all(n == new_tokens for n in sliced_pos)
    holds = mechanism and fixed and gen.ok
    why = (f"forward() derived positions over the full mask ({mask_length}) for {new_tokens} new token and raised "
           f"({plain.error_type}); sliced positions ({new_tokens}) worked; generate() worked" if holds else
           f"plain forward: {plain.error_summary() or 'worked'} with rotary positions {plain.rotary_position_shapes} "
           f"(mask {mask_length}, new tokens {new_tokens}); sliced: {sliced.error_summary() or 'worked'} "
           f"{sliced.rotary_position_shapes}; generate: {gen.error_summary() or 'worked'}")
    return Decision(holds, why, {"forward_full_mask": plain.error_summary() or "worked",
                                 "forward_full_mask_rotary_positions": plain.rotary_position_shapes,
                                 "forward_sliced_rotary_positions": sliced.rotary_position_shapes,
                                 "forward_sliced_positions": sliced.error_summary() or "worked",
                                 "generate_full_mask": gen.error_summary() or "worked",
                                 "mask_length": mask_length, "new_tokens": new_tokens},
                    {"positions_derived_by_forward": _one(plain.rotary_position_shapes) if plain.rotary_position_shapes else None,
                     "positions_sliced": _one(sliced.rotary_position_shapes) if sliced.rotary_position_shapes else None}, {})
