"""Counter-examples for every decision of notebooks 01-04: the normal measurement reproduces the claim,
a measurement contradicting the statement and one at the edge of the noise floor do not."""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from helpers import compare, findings
from helpers.boundary import decisions as boundary_decisions
from helpers.identity import decisions as identity_decisions
from helpers.mask_matrix import decisions as matrix_decisions, tables as matrix_tables
from helpers.rope import decisions as rope_decisions
from helpers.continuation import AFTER_FIRST_CALL, BEFORE_MODEL_CALL, IN_FIRST_CALL
from helpers.continuation import Outcome

FLOOR = compare.NoiseFloor(measured=1e-3, resolution=5e-4, margin=4.0, dtype="float16", scale=1.0, what="test")
T = FLOOR.threshold  # 4e-3
ABOVE = T * (1 + 1e-6)  # just past the edge


def test_noise_floor_edges():
    assert T == 4e-3 and FLOOR.matches(T) and not FLOOR.matches(ABOVE)
    assert not FLOOR.differs(T) and FLOOR.differs(ABOVE)
    assert not FLOOR.matches(float("nan")) and not FLOOR.differs(float("inf")) and not FLOOR.matches(None)
    zero = compare.NoiseFloor(0.0, 0.0, 4.0, "float32", 0.0)
    assert not zero.differs(1e-9), "a floor of exactly 0 never calls anything a difference"
    ev = FLOOR.evidence(0.01)
    assert ev["noise_floor"] == 1e-3 and ev["noise_margin"] == 4.0 and ev["value"] == 0.01 and ev["noise_threshold"] == T


def test_noise_floor_measures_in_float32_and_has_a_resolution_lower_bound():
    ref = torch.tensor([0.5, -0.93, 0.1], dtype=torch.bfloat16)
    same = compare.noise_floor(ref, [ref.clone()], torch.bfloat16)
    assert same.measured == 0.0 and same.resolution == compare.ulp(0.93, torch.bfloat16) == 2 ** -8
    other = ref.clone()
    other[0] += 2 ** -6
    assert compare.noise_floor(ref, other, torch.bfloat16).measured == pytest.approx(2 ** -6)
    assert compare.ulp(1.0, torch.float16) == 2 ** -10 and compare.ulp(0.0, torch.float32) == 0.0


# --- builders ---------------------------------------------------------------------------------------

def call(ids: list[int], mask: list[int], past: int = 82) -> dict[str, Any]:
    return {"input_ids_shape": ids, "attention_mask_shape": mask, "position_ids_shape": None, "past_length": past}


def dropped(**kw: Any) -> Outcome:
    """The source's failure: zero tokens reach the first call, non-empty cache, raised inside that call."""
    args = {"first_call": call([1, 0], [1, 1]), "stage": IN_FIRST_CALL, "rotary": [[3, 1, 1]]} | kw
    return Outcome(False, None, args["first_call"], "RuntimeError", "cannot reshape tensor of 0 elements", args["stage"],
                   "modeling.forward", args["rotary"])


def worked(ids: list[int] = [1, 1], mask: list[int] = [1, 83], past: int = 82, rotary: list | None = None) -> Outcome:
    return Outcome(True, torch.zeros(1, 4), call(ids, mask, past), rotary_position_shapes=rotary or [[3, 1, 1]])


def quirk(plain: Outcome | None = None, sliced: Outcome | None = None, gen: Outcome | None = None) -> dict[str, Outcome]:
    plain = plain or Outcome(False, None, call([1, 1], [1, 83]), "RuntimeError", "mat1 and mat2 shapes cannot be multiplied",
                             IN_FIRST_CALL, "linear.forward", [[3, 1, 83]])
    return dict(zip(matrix_tables.QUIRK_CALLS, (plain, sliced or worked(), gen or worked(rotary=[[1, 1, 1]]))))


VARIANTS = ("original", "rebuilt_update", "rebuilt_config", "rebuilt_ctor")


def meta_rows(**override: Any) -> list[dict[str, Any]]:
    base = {"available": True, "n_layers": 4, "layer_classes": "DynamicLayer", "seq_length": 82,
            "kv_shapes": "(1, 2, 82, 32)", "kv_dtype": "torch.float32", "kv_bitwise_equal": True, "shares_storage": False}
    rows = [{"variant": v, **base} for v in VARIANTS]
    rows[-1].update(override)
    return rows


def comparisons(diff: float = 0.0, bitwise: bool = True) -> list[dict[str, Any]]:
    rows = [{"generation": g, "cache_variant": c, "ran": True, "bitwise_equal": True, "max_abs_diff": 0.0}
            for g in ("mask_only", "both") for c in VARIANTS[1:]]
    rows[-1].update(bitwise_equal=bitwise, max_abs_diff=diff)
    return rows + [{"generation": "neither", "cache_variant": "rebuilt_update", "ran": False}]


def metric(diff: float | None, cosine: float = 0.9, top1_equal: bool = True, ran: bool = True) -> dict[str, Any]:
    return {"ran": ran, "max_abs_diff": diff, "cosine": cosine, "top1_equal": top1_equal, "error": "" if ran else "boom"}


def brow(cache: str, args: str, diff: float | None, call_: str = "generate") -> dict[str, Any]:
    return {"boundary": "double processing", "cache": cache, "call": call_, "args": args,
            "result": "worked" if diff is not None else "failed", "max_abs_diff": diff, "cosine": 0.99, "top1_equal": True}


def double(diff_last: float = 0.03) -> list[dict[str, Any]]:
    rows = [brow(c, a, d) for c in ("original", "rebuilt_update")
            for a, d in (("no mask", None), ("full mask (L+1)", 0.13), ("full mask (L+1) + positions (L-1)", 0.026))]
    rows[-1]["max_abs_diff"] = diff_last
    return rows


def refeed(**override: Any) -> list[dict[str, Any]]:
    """The double-processing rows with the plain re-feed (original, generate, L+1 mask) changed by `override`."""
    rows = double()
    for r in rows:
        r.update({"top1": 7, "top1_reference": 7, "top1_margin_reference": 0.11})
    plain = next(r for r in rows if r["cache"] == "original" and r["args"] == "full mask (L+1)")
    plain.update(override)
    if override.get("top1_equal") is False:
        plain["top1_reference"] = 3
    return rows


def per_call(**override: Any) -> list[dict[str, Any]]:
    rows = [{"call": "generate", "args": "no mask", "original": "failed", "rebuilt_update": "failed", "same_status": True,
             "logits_bitwise_equal": None},
            {"call": "generate", "args": "full mask (L+1)", "original": "worked", "rebuilt_update": "worked",
             "same_status": True, "logits_bitwise_equal": True}]
    rows[-1].update(override)
    return rows


# --- the tables: (case, decision thunk, expected holds) ------------------------------------------------

Case = tuple[str, Callable[[], Any], bool]

NOTEBOOK_01: list[Case] = [
    ("metadata: normal", lambda: identity_decisions.decide_cache_metadata_match(meta_rows()), True),
    ("metadata: a rebuilt cache reports another length", lambda: identity_decisions.decide_cache_metadata_match(meta_rows(seq_length=81)), False),
    ("metadata: no rebuilt variant", lambda: identity_decisions.decide_cache_metadata_match(meta_rows()[:1]), False),
    ("kv: normal", lambda: identity_decisions.decide_kv_bitwise_equal(meta_rows()), True),
    ("kv: one value differs", lambda: identity_decisions.decide_kv_bitwise_equal(meta_rows(kv_bitwise_equal=False)), False),
    ("kv: equal because it aliases the original", lambda: identity_decisions.decide_kv_bitwise_equal(meta_rows(shares_storage=True)), False),
    ("logits: normal", lambda: identity_decisions.decide_first_step_logits_equal(comparisons(), FLOOR, []), True),
    ("logits: a rebuilt cache differs", lambda: identity_decisions.decide_first_step_logits_equal(comparisons(0.5, False), FLOOR, []), False),
    ("logits: within the floor but not identical (edge)",
     lambda: identity_decisions.decide_first_step_logits_equal(comparisons(T / 10, False), FLOOR, []), False),
    ("logits: identical through aliased storage", lambda: identity_decisions.decide_first_step_logits_equal(comparisons(), FLOOR, ["rebuilt_ctor"]), False),
    ("logits: nothing ran", lambda: identity_decisions.decide_first_step_logits_equal(comparisons()[-1:], FLOOR, []), False),
]

DROPPED_ALL = lambda **kw: {c: dropped(**kw) for c in VARIANTS}  # noqa: E731
MASK_DIFFS = {c: 5e-4 for c in VARIANTS}

NOTEBOOK_02: list[Case] = [
    ("fails: normal", lambda: matrix_decisions.decide_fails(DROPPED_ALL()), True),
    ("fails: one variant works", lambda: matrix_decisions.decide_fails({**DROPPED_ALL(), "rebuilt_ctor": worked()}), False),
    ("fails: the token reached the model and it failed elsewhere",
     lambda: matrix_decisions.decide_fails(DROPPED_ALL(first_call=call([1, 1], [1, 1]))), False),
    ("fails: raised before any model call", lambda: matrix_decisions.decide_fails(DROPPED_ALL(stage=BEFORE_MODEL_CALL)), False),
    ("fails: raised after the first call returned", lambda: matrix_decisions.decide_fails(DROPPED_ALL(stage=AFTER_FIRST_CALL)), False),
    ("fails: empty cache", lambda: matrix_decisions.decide_fails(DROPPED_ALL(first_call=call([1, 0], [1, 1], past=0))), False),
    ("fails: no run", lambda: matrix_decisions.decide_fails({}), False),
    ("mask_only: normal", lambda: matrix_decisions.decide_mask_only_works({c: worked() for c in VARIANTS}, MASK_DIFFS, FLOOR), True),
    ("mask_only: one variant fails", lambda: matrix_decisions.decide_mask_only_works(
        {**{c: worked() for c in VARIANTS}, "rebuilt_ctor": dropped()}, MASK_DIFFS, FLOOR), False),
    ("mask_only: runs but the mask does not cover cache + token", lambda: matrix_decisions.decide_mask_only_works(
        {c: worked(mask=[1, 1]) for c in VARIANTS}, MASK_DIFFS, FLOOR), False),
    ("mask_only: no mask reaches the model (5.24 drops an all-ones mask)", lambda: matrix_decisions.decide_mask_only_works(
        {c: Outcome(True, torch.zeros(1, 4), call([1, 1], None)) for c in VARIANTS}, MASK_DIFFS, FLOOR), True),
    ("mask_only: the token reached an empty cache", lambda: matrix_decisions.decide_mask_only_works(
        {c: worked(mask=[1, 1], past=0) for c in VARIANTS}, MASK_DIFFS, FLOOR), False),
    ("mask_only: logits just past the floor (edge)", lambda: matrix_decisions.decide_mask_only_works(
        {c: worked() for c in VARIANTS}, {**MASK_DIFFS, "original": ABOVE}, FLOOR), False),
    ("both: normal", lambda: matrix_decisions.decide_both_matches_mask_only({c: 0.0 for c in VARIANTS}, FLOOR), True),
    ("both: at the threshold still matches", lambda: matrix_decisions.decide_both_matches_mask_only({c: T for c in VARIANTS}, FLOOR), True),
    ("both: positions change the logits", lambda: matrix_decisions.decide_both_matches_mask_only({c: 0.3 for c in VARIANTS}, FLOOR), False),
    ("both: just past the floor (edge)", lambda: matrix_decisions.decide_both_matches_mask_only({**{c: 0.0 for c in VARIANTS}, "original": ABOVE}, FLOOR), False),
    ("both: one pair did not run", lambda: matrix_decisions.decide_both_matches_mask_only({**{c: 0.0 for c in VARIANTS}, "original": None}, FLOOR), False),
    ("drops suffix: normal", lambda: matrix_decisions.decide_first_call_drops_suffix(
        {("neither", "original"): dropped(), ("mask_only", "original"): worked()}), True),
    ("drops suffix: a failing run got its token", lambda: matrix_decisions.decide_first_call_drops_suffix(
        {("neither", "original"): dropped(), ("position_only", "original"): dropped(first_call=call([1, 1], [1, 1]))}), False),
    ("drops suffix: nothing failed", lambda: matrix_decisions.decide_first_call_drops_suffix({("mask_only", "original"): worked()}), False),
    ("forward: normal (sdpa)", lambda: matrix_decisions.decide_forward_needs_positions(quirk(), 1, 83), True),
    ("forward: eager's error text, same captured mechanism", lambda: matrix_decisions.decide_forward_needs_positions(quirk(plain=Outcome(
        False, None, call([1, 1], [1, 83]), "RuntimeError", "The size of tensor a (165) must match the size of tensor b (83)",
        IN_FIRST_CALL, "eager_attention_forward", [[3, 1, 83]])), 1, 83), True),
    ("forward: plain forward works", lambda: matrix_decisions.decide_forward_needs_positions(quirk(plain=worked(rotary=[[3, 1, 1]])), 1, 83), False),
    ("forward: fails although its positions were the one token's", lambda: matrix_decisions.decide_forward_needs_positions(quirk(plain=Outcome(
        False, None, call([1, 1], [1, 83]), "RuntimeError", "mat1 and mat2", IN_FIRST_CALL, "linear.forward", [[3, 1, 1]])), 1, 83), False),
    ("forward: positions one short of the mask (edge)", lambda: matrix_decisions.decide_forward_needs_positions(quirk(plain=Outcome(
        False, None, call([1, 1], [1, 83]), "RuntimeError", "x", IN_FIRST_CALL, "f", [[3, 1, 82]])), 1, 83), False),
    ("forward: raised before the model ran", lambda: matrix_decisions.decide_forward_needs_positions(quirk(plain=Outcome(
        False, None, {}, "TypeError", "unexpected kwarg", BEFORE_MODEL_CALL, "generate", [])), 1, 83), False),
    ("forward: sliced positions fail too", lambda: matrix_decisions.decide_forward_needs_positions(quirk(sliced=dropped()), 1, 83), False),
    ("forward: generate fails", lambda: matrix_decisions.decide_forward_needs_positions(quirk(gen=dropped()), 1, 83), False),
]

NOTEBOOK_03: list[Case] = [
    ("state: normal", lambda: rope_decisions.decide_state_outside_kv([-42], []), True),
    ("state: zero", lambda: rope_decisions.decide_state_outside_kv([0], []), False),
    ("state: none kept", lambda: rope_decisions.decide_state_outside_kv(None, []), False),
    ("state: the cache holds it", lambda: rope_decisions.decide_state_outside_kv([-42], ["layers[0].rope_deltas"]), False),
    ("none=0: normal", lambda: rope_decisions.decide_none_equals_zero({"ran": True, "bitwise_equal": True, "max_abs_diff": 0.0}, FLOOR), True),
    ("none=0: they differ", lambda: rope_decisions.decide_none_equals_zero({"ran": True, "bitwise_equal": False, "max_abs_diff": 0.4}, FLOOR), False),
    ("none=0: within the floor, not identical (edge)",
     lambda: rope_decisions.decide_none_equals_zero({"ran": True, "bitwise_equal": False, "max_abs_diff": T / 10}, FLOOR), False),
    ("none=0: did not run", lambda: rope_decisions.decide_none_equals_zero({"ran": False}, FLOOR), False),
    ("none>+1: normal", lambda: rope_decisions.decide_missing_state_diverges_more(metric(0.45, 0.85), metric(0.138, 0.98), FLOOR), True),
    ("none>+1: +1 moves further", lambda: rope_decisions.decide_missing_state_diverges_more(metric(0.1, 0.95), metric(0.138, 0.98), FLOOR), False),
    ("none>+1: gap just under the threshold (edge)",
     lambda: rope_decisions.decide_missing_state_diverges_more(metric(0.138 + 0.999 * T, 0.85), metric(0.138, 0.98), FLOOR), False),
    ("none>+1: None within the floor (edge)", lambda: rope_decisions.decide_missing_state_diverges_more(metric(T, 0.85), metric(0.0, 0.98), FLOOR), False),
    ("none>+1: cosine not lower", lambda: rope_decisions.decide_missing_state_diverges_more(metric(0.45, 0.99), metric(0.138, 0.98), FLOOR), False),
    ("fresh: normal", lambda: rope_decisions.decide_fresh_instance_diverges(metric(0.45), FLOOR), True),
    ("fresh: matches", lambda: rope_decisions.decide_fresh_instance_diverges(metric(0.0), FLOOR), False),
    ("fresh: at the threshold (edge)", lambda: rope_decisions.decide_fresh_instance_diverges(metric(T), FLOOR), False),
    ("fresh: did not run", lambda: rope_decisions.decide_fresh_instance_diverges(metric(None, ran=False), FLOOR), False),
    ("restored: normal", lambda: rope_decisions.decide_restored_state_matches(metric(0.0), FLOOR), True),
    ("restored: still diverges", lambda: rope_decisions.decide_restored_state_matches(metric(0.45), FLOOR), False),
    ("restored: just past the floor (edge)", lambda: rope_decisions.decide_restored_state_matches(metric(ABOVE), FLOOR), False),
    ("restored: top-1 changed", lambda: rope_decisions.decide_restored_state_matches(metric(0.0, top1_equal=False), FLOOR), False),
]

VALID = {"boundary": "valid split", "cache": "original", "call": "generate", "args": "full mask (L)", "result": "worked",
         "max_abs_diff": 5e-4, "cosine": 1.0, "top1_equal": True}
RESTORING = lambda d=0.026: [brow(c, "full mask (L+1) + positions (L-1)", d if c == "rebuilt_update" else 0.026)  # noqa: E731
                             for c in ("original", "rebuilt_update")]

NOTEBOOK_04: list[Case] = [
    ("valid: normal", lambda: boundary_decisions.decide_valid_split_matches(VALID, FLOOR), True),
    ("valid: diverges", lambda: boundary_decisions.decide_valid_split_matches({**VALID, "max_abs_diff": 0.1}, FLOOR), False),
    ("valid: just past the floor (edge)", lambda: boundary_decisions.decide_valid_split_matches({**VALID, "max_abs_diff": ABOVE}, FLOOR), False),
    ("valid: top-1 changed", lambda: boundary_decisions.decide_valid_split_matches({**VALID, "top1_equal": False}, FLOOR), False),
    ("valid: failed", lambda: boundary_decisions.decide_valid_split_matches({**VALID, "result": "failed", "max_abs_diff": None}, FLOOR), False),
    ("double: normal", lambda: boundary_decisions.decide_double_processing_diverges(double(), FLOOR), True),
    ("double: one call matches", lambda: boundary_decisions.decide_double_processing_diverges(double(0.0), FLOOR), False),
    ("double: one call at the threshold (edge)", lambda: boundary_decisions.decide_double_processing_diverges(double(T), FLOOR), False),
    ("double: only the original ran", lambda: boundary_decisions.decide_double_processing_diverges(
        [r for r in double() if r["cache"] == "original"], FLOOR), False),
    ("double: nothing ran", lambda: boundary_decisions.decide_double_processing_diverges([brow("original", "no mask", None)], FLOOR), False),
    ("rebuilt: normal", lambda: boundary_decisions.decide_rebuilt_same_as_original(per_call(), True, False), True),
    ("rebuilt: another status", lambda: boundary_decisions.decide_rebuilt_same_as_original(per_call(same_status=False), True, False), False),
    ("rebuilt: other logits", lambda: boundary_decisions.decide_rebuilt_same_as_original(per_call(logits_bitwise_equal=False), True, False), False),
    ("rebuilt: K/V differ", lambda: boundary_decisions.decide_rebuilt_same_as_original(per_call(), False, False), False),
    ("rebuilt: aliases the original", lambda: boundary_decisions.decide_rebuilt_same_as_original(per_call(), True, True), False),
    ("restore: normal", lambda: boundary_decisions.decide_mask_and_positions_do_not_restore(RESTORING(), FLOOR), True),
    ("restore: restored", lambda: boundary_decisions.decide_mask_and_positions_do_not_restore(RESTORING(0.0), FLOOR), False),
    ("restore: at the threshold (edge)", lambda: boundary_decisions.decide_mask_and_positions_do_not_restore(RESTORING(T), FLOOR), False),
    ("restore: nothing ran", lambda: boundary_decisions.decide_mask_and_positions_do_not_restore([], FLOOR), False),
    ("top-1: changed", lambda: boundary_decisions.decide_top1_changed(refeed(top1_equal=False)), True),
    ("top-1: unchanged", lambda: boundary_decisions.decide_top1_changed(refeed()), False),
    ("top-1: no plain re-feed ran", lambda: boundary_decisions.decide_top1_changed([brow("original", "no mask", None)]), False),
    ("cosine: the source's", lambda: boundary_decisions.decide_cosine_like_source(refeed(cosine=0.8698)), True),
    ("cosine: moves less", lambda: boundary_decisions.decide_cosine_like_source(refeed(cosine=0.977)), False),
    ("cosine: moves more", lambda: boundary_decisions.decide_cosine_like_source(refeed(cosine=0.5)), False),
    ("cosine: at the band's edge", lambda: boundary_decisions.decide_cosine_like_source(refeed(cosine=1 - 0.1302 / 2)), True),
    ("cosine: no plain re-feed ran", lambda: boundary_decisions.decide_cosine_like_source([]), False),
]

# --- cases that kill the mutants the tables above let through (make mutants): one condition changed alone ------

EXACT = compare.NoiseFloor(measured=2 ** -8, resolution=0.0, margin=4.0, dtype="float32", scale=1.0, what="exact")
TE = EXACT.threshold  # 2**-6: sums and differences below stay exact in binary


def unavailable_original() -> list[dict[str, Any]]:
    rows = meta_rows()
    rows[0]["available"] = False
    return rows


def wide(ids: list[int], mask: list[int] | None, past: int, ok: bool, rotary: list | None = None) -> Outcome:
    """A first call whose shapes have more than two dimensions: the sequence is the last one."""
    if ok:
        return Outcome(True, torch.zeros(1, 4), call(ids, mask, past), rotary_position_shapes=rotary or [[3, 1, 1]])
    return Outcome(False, None, call(ids, mask, past), "RuntimeError", "x", IN_FIRST_CALL, "f", rotary or [[3, 1, 1]])


NOTEBOOK_01 += [
    ("metadata: the original row is unavailable", lambda: identity_decisions.decide_cache_metadata_match(unavailable_original()), False),
    ("metadata: no original row", lambda: identity_decisions.decide_cache_metadata_match(meta_rows()[1:]), False),
    ("metadata: one rebuilt variant", lambda: identity_decisions.decide_cache_metadata_match(meta_rows()[:2]), True),
    ("kv: one rebuilt variant", lambda: identity_decisions.decide_kv_bitwise_equal(meta_rows()[:2]), True),
    ("kv: no rebuilt variant", lambda: identity_decisions.decide_kv_bitwise_equal(meta_rows()[:1]), False),
    ("logits: one comparison ran", lambda: identity_decisions.decide_first_step_logits_equal(comparisons()[:1], FLOOR, []), True),
]

NOTEBOOK_02 += [
    ("fails: one variant", lambda: matrix_decisions.decide_fails({"original": dropped()}), True),
    ("fails: a cache of one token", lambda: matrix_decisions.decide_fails({"original": dropped(first_call=call([1, 0], [1, 1], past=1))}), True),
    ("fails: 3-D ids, zero tokens last", lambda: matrix_decisions.decide_fails({"original": wide([1, 2, 0], [1, 1], 82, False)}), True),
    ("fails: 3-D ids, tokens last", lambda: matrix_decisions.decide_fails({"original": wide([1, 0, 2], [1, 1], 82, False)}), False),
    ("mask_only: one variant", lambda: matrix_decisions.decide_mask_only_works({"original": worked()}, MASK_DIFFS, FLOOR), True),
    ("mask_only: no run", lambda: matrix_decisions.decide_mask_only_works({}, {}, FLOOR), False),
    ("mask_only: a cache of one token", lambda: matrix_decisions.decide_mask_only_works(
        {"original": worked(mask=[1, 2], past=1)}, MASK_DIFFS, FLOOR), True),
    ("mask_only: a variant without its diff", lambda: matrix_decisions.decide_mask_only_works(
        {c: worked() for c in VARIANTS}, {"original": 0.0}, FLOOR), False),
    ("mask_only: 3-D shapes, one token last", lambda: matrix_decisions.decide_mask_only_works(
        {"original": wide([1, 2, 1], [1, 2, 83], 82, True)}, MASK_DIFFS, FLOOR), True),
    ("mask_only: 3-D shapes, the mask's last is not cache + token", lambda: matrix_decisions.decide_mask_only_works(
        {"original": wide([1, 2, 1], [1, 83, 2], 82, True)}, MASK_DIFFS, FLOOR), False),
    ("mask_only: 3-D shapes, two tokens last", lambda: matrix_decisions.decide_mask_only_works(
        {"original": wide([1, 1, 2], [1, 1, 83], 82, True)}, MASK_DIFFS, FLOOR), False),
    ("both: one variant", lambda: matrix_decisions.decide_both_matches_mask_only({"original": 0.0}, FLOOR), True),
    ("both: nothing compared", lambda: matrix_decisions.decide_both_matches_mask_only({}, FLOOR), False),
    ("forward: sliced positions of a batch of two", lambda: matrix_decisions.decide_forward_needs_positions(
        quirk(sliced=worked(rotary=[[3, 2, 1]])), 1, 83), True),
    ("forward: sliced positions of two tokens for a batch of one", lambda: matrix_decisions.decide_forward_needs_positions(
        quirk(sliced=worked(rotary=[[3, 1, 2]])), 1, 83), False),
    ("forward: sliced call recorded no positions", lambda: matrix_decisions.decide_forward_needs_positions(
        quirk(sliced=Outcome(True, torch.zeros(1, 4), call([1, 1], [1, 83]), rotary_position_shapes=[])), 1, 83), False),
]

NOTEBOOK_03 += [
    ("none=0: did not run, a diff left over", lambda: rope_decisions.decide_none_equals_zero(
        {"ran": False, "bitwise_equal": True, "max_abs_diff": 0.0}, FLOOR), False),
    ("none>+1: gap exactly the threshold (edge)", lambda: rope_decisions.decide_missing_state_diverges_more(
        metric(0.5 + TE, 0.85), metric(0.5, 0.98), EXACT), False),
    ("none>+1: gap just past the threshold (edge)", lambda: rope_decisions.decide_missing_state_diverges_more(
        metric(0.5 + TE + 2 ** -20, 0.85), metric(0.5, 0.98), EXACT), True),
    ("none>+1: same cosine", lambda: rope_decisions.decide_missing_state_diverges_more(metric(0.45, 0.98), metric(0.138, 0.98), FLOOR), False),
    ("none>+1: +1 did not run", lambda: rope_decisions.decide_missing_state_diverges_more(
        {**metric(0.45, 0.85), "top5_overlap": 2, "top1_equal": False}, metric(None, ran=False), FLOOR), False),
    ("none>+1: None did not run, a diff left over", lambda: rope_decisions.decide_missing_state_diverges_more(
        metric(0.45, 0.85, ran=False), metric(0.138, 0.98), FLOOR), False),
    ("none>+1: normal, top-1 changed", lambda: rope_decisions.decide_missing_state_diverges_more(
        {**metric(0.45, 0.85, top1_equal=False), "top5_overlap": 3}, metric(0.138, 0.98), FLOOR), True),
    ("fresh: did not run, a diff left over", lambda: rope_decisions.decide_fresh_instance_diverges(metric(0.45, ran=False), FLOOR), False),
    ("restored: did not run, a diff left over", lambda: rope_decisions.decide_restored_state_matches(metric(0.0, ran=False), FLOOR), False),
]

NOTEBOOK_04 += [
    ("valid: failed, a diff left over", lambda: boundary_decisions.decide_valid_split_matches({**VALID, "result": "failed"}, FLOOR), False),
    ("double: a failed call with a diff left over", lambda: boundary_decisions.decide_double_processing_diverges(
        double() + [{**brow("original", "no mask", 0.0), "result": "failed"}], FLOOR), True),
    ("double: the plain refeed's top-5 overlap", lambda: boundary_decisions.decide_double_processing_diverges(
        [{**r, "top5_overlap": 3} for r in double()], FLOOR), True),
]

TABLES = {"01": NOTEBOOK_01, "02": NOTEBOOK_02, "03": NOTEBOOK_03, "04": NOTEBOOK_04}
BY_NOTEBOOK = [(nb, name, thunk, expected) for nb, table in TABLES.items() for name, thunk, expected in table]
CASES = [case for table in TABLES.values() for case in table]  # the kill cases of notebooks 01-04's deciding modules


@pytest.mark.parametrize("nb,name,thunk,expected", BY_NOTEBOOK, ids=[f"{nb}-{name}" for nb, name, _, _ in BY_NOTEBOOK])
def test_counter_examples(nb, name, thunk, expected):
    d = thunk()
    assert isinstance(d, compare.Decision)
    assert d.holds is expected or bool(d.holds) == expected, (name, d.why)
    assert d.why and isinstance(d.evidence, dict) and isinstance(d.deciding, dict) and isinstance(d.source, dict)


def registered() -> dict[str, list[str]]:
    """{module: [decision function]} of every deciding module a finding declares (helpers.findings): each of these
    needs a holding and a contradicting case."""
    return {d.dotted: findings.decision_functions(d) for d in findings.decisions()}


def every_case() -> list[tuple[str, Callable[[], Any], bool]]:
    """The CASES tables of the kill files the deciding modules name (this file's for notebooks 01-04)."""
    files = dict.fromkeys(Path(d.kill).stem for d in findings.decisions())
    return [case for name in files for case in importlib.import_module(name).CASES]


def _holds(value: Any) -> bool | None:
    """A decision's verdict: Decision.holds, or the first item of a (holds, ...) / (Decision | None, ...) tuple."""
    if isinstance(value, tuple):
        value = value[0]
    if value is None:
        return None
    return bool(value.holds) if hasattr(value, "holds") else bool(value)


OUTPUTS = Path(__file__).parent / "golden" / "decision_outputs.json"


def _snapshot(value: Any) -> Any:
    """A decision's whole output as JSON: verdict, why, evidence, deciding, source, notes (tuples item by item)."""
    from helpers.results import to_jsonable

    if isinstance(value, tuple):
        return [_snapshot(v) for v in value]
    if hasattr(value, "holds"):
        return {k: to_jsonable(getattr(value, k)) for k in ("holds", "why", "evidence", "deciding", "source", "notes")
                if hasattr(value, k)}
    return to_jsonable(value)


def test_every_decision_output_is_the_golden_one():
    """What each case's decision says (reason, evidence, deciding and source values) is pinned, not only its verdict:
    a change is deliberate (KVKIT_UPDATE_GOLDEN=1 rewrites tests/golden/decision_outputs.json) and shows in review."""
    import os

    names = [name for name, _, _ in every_case()]
    assert len(names) == len(set(names)), "case names must be unique: they key the golden file"
    got = json.loads(json.dumps({name: _snapshot(thunk()) for name, thunk, _ in every_case()}))
    if os.environ.get("KVKIT_UPDATE_GOLDEN"):
        OUTPUTS.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    want = json.loads(OUTPUTS.read_text())
    assert sorted(got) == sorted(want), "cases added or removed: `make generate` rewrites the golden file (docs/adding-a-finding.md)"
    for name in want:
        assert got[name] == want[name], f"{name}: if deliberate, `make generate` rewrites the golden file"


def test_every_decision_has_a_normal_case_and_a_counter_example(monkeypatch):
    """Each registered function, called through the case tables, gives holds=True in one case and False in another."""
    seen: dict[str, set[bool]] = {}

    def recording(qualified: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            seen.setdefault(qualified, set()).add(_holds(out))
            return out
        return wrapper

    for module, names in registered().items():
        mod = importlib.import_module(module)
        for name in names:
            monkeypatch.setattr(mod, name, recording(f"{module}.{name}", getattr(mod, name)))
    for name, thunk, expected in every_case():
        assert bool(_holds(thunk())) is expected, name  # None (not decided, e.g. flash without CUDA) is not holding
    wanted = {f"{m}.{n}" for m, names in registered().items() for n in names}
    lacking = {f: sorted(seen.get(f, set()), key=str) for f in sorted(wanted) if not {True, False} <= seen.get(f, set())}
    assert not lacking, f"decisions without both a holding and a contradicting case: {lacking}"


def test_floor_decisions_record_the_floor_in_their_evidence():
    for d in (boundary_decisions.decide_double_processing_diverges(double(), FLOOR), rope_decisions.decide_fresh_instance_diverges(metric(0.45), FLOOR),
              matrix_decisions.decide_both_matches_mask_only({"original": 0.0}, FLOOR)):
        assert {"noise_floor", "noise_margin", "noise_threshold", "value"} <= set(d.evidence)


def test_source_values_are_the_sources():
    d = rope_decisions.decide_missing_state_diverges_more(metric(0.45, 0.85), metric(0.138, 0.98), FLOOR)
    assert d.source == {"max_abs_diff_none": 17.1328, "cosine_none": 0.30597, "max_abs_diff_plus_1": 1.21875, "cosine_plus_1": 0.99833}
    assert boundary_decisions.decide_double_processing_diverges(double(), FLOOR).source == {"max_abs_diff": 7.65625}
    assert matrix_decisions.decide_fails(DROPPED_ALL()).source == {"first_call_input_ids": [1, 0], "past_length": 81}
    assert rope_decisions.decide_state_outside_kv([-42], []).source == {"rope_deltas": [-42]}
