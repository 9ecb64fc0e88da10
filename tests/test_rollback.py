"""Notebook 10's decision functions, each fed a measurement that contradicts it, and the state comparison."""
from __future__ import annotations

import math

import torch

from helpers.compare import NoiseFloor
from helpers.rollback import decisions, probes

FLOOR = NoiseFloor(measured=2e-7, resolution=6e-8, margin=4.0, dtype="float32", scale=0.5, what="test")
FLOORS = {name: FLOOR for name in ("dense", "sliding", "static", "hybrid")}


def _row(family: str, mode: str, outcome: str, diff: float | None = 0.0, **extra) -> dict:
    ran = outcome in decisions.RAN
    return {"family": family, "mode": mode, "outcome": outcome, "next_logits_diff": diff if ran else None,
            "kv_held_diff": 0.0 if ran else None, **extra}


def test_dense_crop_holds_when_restored_and_fails_when_off_or_refused():
    assert decisions.decide_dense_crop([_row("dense", "plain", "restored", 0.0)], FLOOR).holds
    assert not decisions.decide_dense_crop([_row("dense", "plain", "silently wrong", 1e-3)], FLOOR).holds
    assert not decisions.decide_dense_crop([_row("dense", "plain", "refused", error="RuntimeError")], FLOOR).holds
    stale = _row("dense", "plain", "restored", 0.0, kv_held_diff=0.5)  # logits agree but the held K/V do not
    assert not decisions.decide_dense_crop([stale], FLOOR).holds


def test_plain_never_silent_fails_on_one_silently_wrong_family():
    rows = [_row("dense", "plain", "restored"), _row("hybrid", "plain", "refused", error="RuntimeError")]
    assert decisions.decide_plain_never_silent(rows, FLOORS).holds
    rows.append(_row("static", "plain", "silently wrong", 0.01))
    d = decisions.decide_plain_never_silent(rows, FLOORS)
    assert not d.holds and d.deciding["silently_wrong"] == ["static"]


def test_recurrent_not_rolled_back_needs_the_mechanism_not_just_a_difference():
    stale = [_row("hybrid", "record", "silently wrong", 0.0075, conv_diff=0.0, recurrent_diff=0.0046),
             _row("hybrid", "record_keep", "not offered", error="TypeError")]
    d = decisions.decide_recurrent_not_rolled_back(stale, FLOOR)
    assert d.holds and "recurrent state not" in d.why
    fixed = stale + [_row("hybrid", "record_keep", "restored", 0.0, conv_diff=0.0, recurrent_diff=0.0)]  # 5.25.0
    assert not decisions.decide_recurrent_not_rolled_back(fixed[:1] + fixed[2:], FLOOR).holds
    conv_off = [_row("hybrid", "record", "silently wrong", 0.0075, conv_diff=0.3, recurrent_diff=0.0046)]
    assert not decisions.decide_recurrent_not_rolled_back(conv_off, FLOOR).holds  # another mechanism
    in_noise = [_row("hybrid", "record", "restored", 1e-7, conv_diff=0.0, recurrent_diff=0.0046)]
    assert not decisions.decide_recurrent_not_rolled_back(in_noise, FLOOR).holds  # not silently wrong
    raised = [_row("hybrid", "record", "raised while recording", error="TypeError")]
    assert not decisions.decide_recurrent_not_rolled_back(raised, FLOOR).holds


def test_recording_runs_fails_when_the_forward_raises():
    assert decisions.decide_recording_runs([_row("hybrid", "record", "silently wrong", 0.01)]).holds
    assert not decisions.decide_recording_runs([_row("hybrid", "record", "raised while recording", error="TypeError")]).holds


def test_family_recorded_and_refused_contradicted():
    rows = [_row("sliding", "plain", "refused", error="RuntimeError"), _row("sliding", "record", "restored")]
    assert decisions.decide_family_recorded(rows, "sliding", FLOOR).holds
    assert not decisions.decide_family_recorded(rows[:1] + [_row("sliding", "record", "refused", error="ValueError")],
                                                "sliding", FLOOR).holds  # 5.14.1
    assert not decisions.decide_family_recorded(rows[:1] + [_row("sliding", "record", "silently wrong", 0.01)],
                                                "sliding", FLOOR).holds
    static = [_row("static", m, "refused", error="AttributeError") for m in ("plain", "record")]
    assert decisions.decide_refused(static, "static").holds
    assert not decisions.decide_refused(static + [_row("static", "record_keep", "restored")], "static").holds  # 5.24.0+
    assert not decisions.decide_refused([], "static").holds


def test_continuation_fails_on_a_refed_suffix_or_a_difference():
    ok = [{"suffix": s, "call": c, "fed": s, "max_abs_diff": 1e-7} for s in (1, 8) for c in ("forward()", "generate()")]
    assert decisions.decide_continuation(ok, FLOOR).holds
    refed = ok[:-1] + [{"suffix": 8, "call": "generate()", "fed": 20, "max_abs_diff": 1e-7}]
    assert not decisions.decide_continuation(refed, FLOOR).holds
    off = ok[:-1] + [{"suffix": 8, "call": "generate()", "fed": 8, "max_abs_diff": 0.04}]
    assert not decisions.decide_continuation(off, FLOOR).holds


def test_rebuild_fails_on_the_5_25_length_of_a_hand_rebuild():
    original = {"rebuild": "original", "length": 23, "fed": 1, "max_abs_diff": 0.0}
    same = {"rebuild": "hand", "length": 23, "fed": 1, "max_abs_diff": 0.0}
    assert decisions.decide_rebuild([original, same], ("hand",)).holds
    lost = {"rebuild": "hand", "length": 4, "fed": 20, "max_abs_diff": 0.042}  # 5.25.0: the conv width, 19 re-fed
    d = decisions.decide_rebuild([original, lost], ("hand",))
    assert not d.holds and "length 4 (original 23)" in d.why
    assert not decisions.decide_rebuild([original, {"rebuild": "hand", "error": "AttributeError: x"}], ("hand",)).holds
    assert not decisions.decide_rebuild([original], ("hand",)).holds  # a rebuild that was never measured


def test_max_diff_marks_shape_mismatch_and_missing():
    assert probes.max_diff(torch.zeros(2), torch.ones(2)) == 1.0
    assert math.isinf(probes.max_diff(torch.zeros(2), torch.zeros(3)))
    assert probes.max_diff(None, torch.zeros(1)) is None


def _a(family: str, way: str, outcome: str) -> dict:
    return {"family": family, "way": way, "outcome": outcome, "error": "ValueError: stateful" if outcome == "refused" else None}


def test_assisted_decisions_contradicted():
    rows = [_a(f, w, "equal") for f in ("dense", "hybrid") for w in ("greedy", "prompt lookup", "own assistant")]
    assert decisions.decide_assisted_never_wrong(rows).holds and not decisions.decide_assisted_refused(rows).holds  # 5.25.0
    refused = rows[:4] + [_a("hybrid", "prompt lookup", "refused"), _a("hybrid", "own assistant", "refused")]
    assert decisions.decide_assisted_never_wrong(refused).holds and decisions.decide_assisted_refused(refused).holds
    wrong = rows[:-1] + [_a("hybrid", "own assistant", "differs")]
    d = decisions.decide_assisted_never_wrong(wrong)
    assert not d.holds and d.deciding["differs"] == ["hybrid · own assistant"]
    assert not decisions.decide_assisted_never_wrong([_a("dense", "greedy", "differs")]).holds  # greedy vs no cache


def test_static_decisions_contradicted():
    rows = [{"case": "user StaticCache(max_cache_len=20), reused", "outcome": "raises", "error": "IndexError"},
            {"case": "cache_implementation='static', cache_config max_cache_len=64", "outcome": "matches", "capacity": 35,
             "requested": 64, "needed": 35}]
    assert decisions.decide_static_case(rows, "user StaticCache", "raises").holds
    assert not decisions.decide_static_case([{**rows[0], "outcome": "silently wrong"}], "user StaticCache", "raises").holds
    assert decisions.decide_max_cache_len_ignored(rows).holds
    assert not decisions.decide_max_cache_len_ignored([{**rows[1], "capacity": 64}]).holds  # honoured
    assert not decisions.decide_max_cache_len_ignored([{**rows[1], "outcome": "silently wrong"}]).holds
