"""Kill tests for the triage tree (make mutants: helpers/triage/tree.py): every leaf reached through each of its
conditions separately, and each claim decision with a holding case and one contradicting case per condition."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest

from helpers.compare import NoiseFloor
from helpers.triage import tree

FLOOR = NoiseFloor(measured=5e-7, resolution=4e-7, margin=4.0, dtype="float32", scale=1.0, what="kill")
T = FLOOR.threshold  # 2e-6
ABOVE = T * (1 + 1e-6)


def sets(diff: float | None = 0.0, error: str = "RuntimeError") -> list[tree.ArgSet]:
    return [tree.ArgSet("neither", False, False, error, error), tree.ArgSet("position_only", False, False, error, error),
            tree.ArgSet("mask_only", True, True, max_abs_diff=diff), tree.ArgSet("both", True, True, max_abs_diff=diff)]


def ctl(**kw: Any) -> tree.Controls:
    base = dict(rebuild="x", floor=FLOOR, arg_sets=sets(), processed_length=82, original_lengths=[82] * 4,
                rebuilt_lengths=[82] * 4, classes_equal=True, kv_bitwise_equal=True, kv_max_abs_diff=0.0,
                identity_identical=True, identity_worst=0.0)
    return tree.Controls(**{**base, **kw})


def branch(c: tree.Controls) -> str:
    return tree.choose_branch(c)["branch"]


def test_consistent_on_each_condition():
    assert tree.consistent(tree.ArgSet("a", True, True, max_abs_diff=T), FLOOR)
    assert not tree.consistent(tree.ArgSet("a", True, True, max_abs_diff=ABOVE), FLOOR)
    assert not tree.consistent(tree.ArgSet("a", True, True, max_abs_diff=None), FLOOR), "a missing diff is not a match"
    assert not tree.consistent(tree.ArgSet("a", True, False), FLOOR) and not tree.consistent(tree.ArgSet("a", False, True), FLOOR)
    assert tree.consistent(tree.ArgSet("a", False, False, "E", "E"), FLOOR)
    assert not tree.consistent(tree.ArgSet("a", False, False, "E", "F"), FLOOR)


def test_identical_and_its_numbers():
    same, numbers = tree.identical(ctl(arg_sets=sets(1e-7)))
    assert same and numbers["worst_max_abs_diff"] == 1e-7 and numbers["noise_threshold"] == T
    assert numbers["per_argument_set"] == {"neither": "both failed (RuntimeError)", "position_only": "both failed (RuntimeError)",
                                           "mask_only": 1e-7, "both": 1e-7}
    mixed = [tree.ArgSet("m", True, False), tree.ArgSet("n", False, True), tree.ArgSet("o", True, True, max_abs_diff=3e-7),
             tree.ArgSet("p", True, True, max_abs_diff=1e-7)]
    same, numbers = tree.identical(ctl(arg_sets=mixed))
    assert not same and numbers["worst_max_abs_diff"] == 3e-7
    assert numbers["per_argument_set"]["m"] == "original worked, rebuilt failed"
    assert numbers["per_argument_set"]["n"] == "original failed, rebuilt worked"
    assert tree.identical(ctl(arg_sets=[]))[0] is False, "no argument set ran: not identical"
    assert tree.identical(ctl(arg_sets=sets(None)))[1]["worst_max_abs_diff"] is None


def test_lengths_changed_ignores_missing_lengths():
    assert not tree.lengths_changed(ctl()) and not tree.lengths_changed(ctl(rebuilt_lengths=[None, 82]))
    assert tree.lengths_changed(ctl(rebuilt_lengths=[82, 20])) and tree.lengths_changed(ctl(rebuilt_lengths=[None, 83]))


FRESH = dict(resume_on="fresh_instance", fresh_bare_diff=0.45, fresh_restored_diff=0.0)


def test_fresh_instance_leaf_through_each_condition():
    assert branch(ctl(**FRESH)) == "model_side_state"
    assert branch(ctl(**{**FRESH, "resume_on": "same_instance"})) == "resume_contract"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": None})) == "resume_contract"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": T})) == "resume_contract", "the bare instance must differ beyond the floor"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": ABOVE})) == "model_side_state"
    assert branch(ctl(**{**FRESH, "fresh_restored_diff": None})) == "resume_contract"
    assert branch(ctl(**{**FRESH, "fresh_restored_diff": ABOVE})) == "resume_contract"
    assert branch(ctl(**{**FRESH, "fresh_restored_diff": T})) == "model_side_state"


def test_the_path_records_each_answer_and_its_numbers():
    v = tree.choose_branch(ctl(**{**FRESH, "fresh_restored_diff": ABOVE}))
    assert [(d["node"], d["answer"]) for d in v["path"]] == [("identical", True), ("fresh_state", False), ("fails_for_both", True)]
    fresh = v["path"][1]
    assert fresh["numbers"] == {"fresh_without_state": 0.45, "fresh_state_restored": ABOVE, "noise_threshold": T}
    assert fresh["question"] == tree.NODES[1][2]
    assert v["path"][2]["numbers"] == {"fail_for_both": ["neither", "position_only"], "work_for_both": ["mask_only", "both"]}
    v = tree.choose_branch(ctl(arg_sets=sets(0.3), kv_bitwise_equal=False, kv_max_abs_diff=0.01))
    assert [(d["node"], d["answer"]) for d in v["path"]] == [("identical", False), ("only_rebuilt", True),
                                                             ("lengths_changed", False), ("kv_differ", True)]
    assert v["path"][1]["numbers"] == {"differing": ["mask_only", "both"]} and v["path"][3]["numbers"] == {"kv_max_abs_diff": 0.01}
    assert v["path"][2]["numbers"]["identity_matches"] is True and v["path"][2]["numbers"]["rebuilt_lengths"] == [82] * 4


EVICT = dict(arg_sets=sets(0.98), rebuilt_lengths=[20] * 4, kv_bitwise_equal=False, kv_max_abs_diff=None)


def pos(step: float | None, full: float | None, gen: int | None = 18, logical: int | None = 80) -> dict:
    return {"generate_position": gen, "logical_position": logical, "explicit_vs_generate": step, "explicit_vs_full_forward": full}


def test_compression_leaves_through_each_condition():
    assert branch(ctl(**EVICT, extra=pos(0.36, T))) == "compression_positions"
    assert branch(ctl(**EVICT, extra=pos(0.36, ABOVE))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, extra=pos(ABOVE, 0.0))) == "compression_positions", "explicit_vs_generate just past the floor"
    assert branch(ctl(**EVICT, extra=pos(T, ABOVE))) == "compression_information_loss", "explicit_vs_generate at the floor"
    assert branch(ctl(**EVICT, extra=pos(T, T))) == "compression_unresolved", "neither question says yes"
    assert branch(ctl(**EVICT, extra=pos(0.36, ABOVE, gen=80))) == "compression_unresolved", "same position, steps differ"
    assert branch(ctl(**EVICT, extra=pos(0.0, ABOVE, gen=80))) == "compression_information_loss"
    assert branch(ctl(**EVICT, extra=pos(0.36, ABOVE, gen=None))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, extra=pos(0.36, ABOVE, logical=None))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, extra=pos(None, ABOVE))) == "compression_unresolved"
    assert branch(ctl(**EVICT, extra=pos(0.0, None))) == "compression_unresolved"
    assert branch(ctl(**EVICT, extra={})) == "compression_unresolved"
    assert branch(ctl(**EVICT, identity_identical=None, extra=pos(0.36, 0.0))) == "reconstruction_copy"
    assert branch(ctl(**EVICT, identity_identical=False, extra=pos(0.36, 0.0))) == "reconstruction_copy"
    same_length = {**EVICT, "rebuilt_lengths": [82] * 4}
    assert branch(ctl(**same_length, extra=pos(0.36, 0.0))) == "reconstruction_copy"
    assert tree.position_shift(ctl(extra=pos(ABOVE, 0.0))) and not tree.position_shift(ctl(extra=pos(T, 0.0)))
    assert not tree.position_shift(ctl(extra=pos(None, 0.0))) and not tree.position_shift(ctl(extra=pos(0.36, 0.0, gen=80)))
    assert tree.information_loss(ctl(extra=pos(0.0, ABOVE))) and not tree.information_loss(ctl(extra=pos(0.0, T)))
    assert not tree.information_loss(ctl(extra=pos(0.0, None)))
    v = tree.choose_branch(ctl(**EVICT, extra=pos(T, ABOVE)))
    assert v["path"][-1] == {"node": "information_lost", "question": tree.NODES[8][2], "answer": True,
                             "numbers": {**pos(T, ABOVE), "noise_threshold": T}}
    assert v["path"][-2]["node"] == "positions_shift" and v["path"][-2]["answer"] is False
    assert v["path"][-3]["numbers"]["logical_position"] == 80
    v = tree.choose_branch(ctl(**EVICT, extra=pos(0.36, T)))
    assert [(d["node"], d["answer"]) for d in v["path"][-3:]] == [("positions_shift", True), ("positions_and_loss", False),
                                                                 ("positions_restore", True)]
    v = tree.choose_branch(ctl(**EVICT, extra=pos(T, T)))
    assert [(d["node"], d["answer"]) for d in v["path"][-3:]] == [("positions_shift", False), ("information_lost", False),
                                                                 ("unresolved", True)]


def test_metadata_and_state_leaves_through_each_condition():
    differ = dict(arg_sets=sets(0.3))
    assert branch(ctl(**differ)) == "unexplained"
    assert branch(ctl(**differ, kv_bitwise_equal=False)) == "reconstruction_copy"
    assert branch(ctl(**differ, classes_equal=False)) == "cache_metadata"
    assert branch(ctl(**differ, original_lengths=[81] * 4)) == "cache_metadata", "lengths alone differ"
    state = dict(**differ, state_changed=True, restored_diff=T)
    assert branch(ctl(**state)) == "model_side_state"
    assert branch(ctl(**{**state, "state_changed": False})) == "unexplained"
    assert branch(ctl(**{**state, "restored_diff": None})) == "unexplained"
    assert branch(ctl(**{**state, "restored_diff": ABOVE})) == "unexplained"
    last = tree.choose_branch(ctl(**differ))["path"][-1]
    assert last["node"] == "nothing_visible" and last["numbers"] == {"kv_bitwise_equal": True, "classes_equal": True}


def test_render_shows_unchecked_and_declined_nodes():
    text = tree.render("r", tree.choose_branch(ctl(arg_sets=sets(0.3))))
    assert "+-- [ ] its K/V tensors differ from the original's  -> reconstruction_copy" in text
    assert "+-- [x] K/V and visible cache metadata match  -> unexplained" in text
    assert "    +--     same instance works" in text  # not reached: no mark
    assert text.splitlines()[1] == "decided by: kv_bitwise_equal=True; classes_equal=True"
    assert tree.render("r", {"branch": "unexplained", "path": []}).splitlines()[1] == "decided by: the first decision"


# --- the claim decisions, as (case, thunk, expected holds) for tests/test_decisions.py's registry --------------

RETAINED = ctl(**EVICT)  # 82 processed, 20 retained: generate continues at 20 instead of 82 (shift -62)
PER_LAYER = dict(arg_sets=sets(0.91), rebuilt_lengths=[20, 16, 12, 8], kv_bitwise_equal=False)
SILENT = {"ok": True, "max_abs_diff_vs_original": 0.9, "stage": ""}
RAISED = {"ok": False, "error_type": "RuntimeError", "stage": "modeling_x.py:eager_attention_forward"}


def full(c: tree.Controls) -> tree.ArgSet:
    return c.arg_sets[2]


def per_layer(**kw: Any) -> tuple:
    c = ctl(**{**PER_LAYER, **kw})
    return tree.decide_per_layer(c, full(c), {})


Case = tuple[str, Callable[[], Any], bool]
CASES: list[Case] = [
    ("branch: lands where expected", lambda: tree.decide_branch(tree.choose_branch(ctl()), "resume_contract"), True),
    ("branch: another leaf", lambda: tree.decide_branch(tree.choose_branch(ctl(arg_sets=sets(0.3))), "resume_contract"), False),
    ("retained: normal", lambda: tree.decide_retained_length(RETAINED, 18, 80, 0.36), True),
    ("retained: generate at the logical position", lambda: tree.decide_retained_length(RETAINED, 80, 80, 0.36), False),
    ("retained: shift by another amount", lambda: tree.decide_retained_length(RETAINED, 19, 80, 0.36), False),
    ("retained: no generate position", lambda: tree.decide_retained_length(RETAINED, None, 80, 0.36), False),
    ("retained: no logical position", lambda: tree.decide_retained_length(RETAINED, 18, None, 0.36), False),
    ("retained: nothing evicted", lambda: tree.decide_retained_length(ctl(), 80, 80, 0.36), False),
    ("retained: explicit step at the threshold (edge)", lambda: tree.decide_retained_length(RETAINED, 18, 80, T), False),
    ("retained: explicit step just past it (edge)", lambda: tree.decide_retained_length(RETAINED, 18, 80, ABOVE), True),
    ("retained: explicit step missing", lambda: tree.decide_retained_length(RETAINED, 18, 80, None), False),
    ("retained: first layer without a length", lambda: tree.decide_retained_length(
        ctl(**{**EVICT, "rebuilt_lengths": [None, 20, 20, 20]}), 18, 80, 0.36), True),
    ("retained: no layer has a length", lambda: tree.decide_retained_length(
        ctl(**{**EVICT, "rebuilt_lengths": [None] * 4}), 18, 80, 0.36), False),
    ("per-layer: silent difference", lambda: per_layer(), True),
    ("per-layer: error", lambda: per_layer(arg_sets=sets(0.91)[:2] + [tree.ArgSet("mask_only", True, False, "", "E")]), True),
    ("per-layer: within the floor", lambda: per_layer(arg_sets=sets(T)), False),
    ("per-layer: just past the floor (edge)", lambda: per_layer(arg_sets=sets(ABOVE)), True),
    ("per-layer: no diff measured", lambda: per_layer(arg_sets=sets(None)), False),
    ("per-layer: one length for every layer", lambda: per_layer(rebuilt_lengths=[20] * 4), False),
    ("per-layer: two lengths, one missing", lambda: per_layer(rebuilt_lengths=[20, None, 12, None]), True),
    ("per-layer: one length and missing ones", lambda: per_layer(rebuilt_lengths=[20, None, None, None]), False),
    ("backends: as predicted", lambda: tree.decide_per_layer_backends({"sdpa": SILENT, "eager": RAISED}, FLOOR), True),
    ("backends: sdpa within the floor", lambda: tree.decide_per_layer_backends(
        {"sdpa": {**SILENT, "max_abs_diff_vs_original": T}, "eager": RAISED}, FLOOR), False),
    ("backends: sdpa just past the floor (edge)", lambda: tree.decide_per_layer_backends(
        {"sdpa": {**SILENT, "max_abs_diff_vs_original": ABOVE}, "eager": RAISED}, FLOOR), True),
    ("backends: sdpa without a diff", lambda: tree.decide_per_layer_backends(
        {"sdpa": {**SILENT, "max_abs_diff_vs_original": None}, "eager": RAISED}, FLOOR), False),
    ("backends: eager raised outside attention", lambda: tree.decide_per_layer_backends(
        {"sdpa": SILENT, "eager": {**RAISED, "stage": "generation/utils.py:_prepare"}}, FLOOR), False),
    ("backends: eager raised without a stage", lambda: tree.decide_per_layer_backends(
        {"sdpa": SILENT, "eager": {**RAISED, "stage": None}}, FLOOR), False),
    ("backends: eager did not run", lambda: tree.decide_per_layer_backends({"sdpa": SILENT}, FLOOR), False),
    ("backends: nothing ran", lambda: tree.decide_per_layer_backends({}, FLOOR), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_claim_decisions(name, thunk, expected):
    out = thunk()
    assert out[0] is expected, (name, out[1] if isinstance(out[1], str) else out[2])


def test_the_claim_decisions_report_their_numbers():
    holds, evidence, deciding = tree.decide_branch(tree.choose_branch(ctl(arg_sets=sets(1e-7))), "resume_contract")
    assert deciding == {"branch": "resume_contract", "worst_max_abs_diff_vs_original": 1e-7, "noise_threshold": T}
    assert evidence["expected_branch"] == "resume_contract" and evidence["branch"] == "resume_contract"
    assert tree.decide_branch({"branch": "x", "path": []}, "x")[2]["noise_threshold"] is None
    holds, evidence, deciding = tree.decide_retained_length(RETAINED, 18, 80, 0.36)
    assert (evidence["position_shift"], evidence["expected_shift_if_retained_length"], deciding["retained_length"]) == (-62, -62, 20)
    assert evidence["noise_threshold"] == T and evidence["value"] == 0.36
    holds, why, evidence, deciding = per_layer()
    assert deciding == {"outcome": "silent_difference", "rebuilt_lengths": [20, 16, 12, 8], "max_abs_diff_vs_original": 0.91,
                        "noise_threshold": T}
    assert "silent difference" in why and evidence["stage"] == "no error: every layer ran"
    c = ctl(**{**PER_LAYER, "arg_sets": sets(0.91)[:2] + [tree.ArgSet("mask_only", True, False, "", "RuntimeError")]})
    holds, why, evidence, deciding = tree.decide_per_layer(c, full(c), {"stage": "sdpa", "error_layer": 2, "error": "boom"})
    assert deciding["outcome"] == "error" and "at sdpa (layer 2): RuntimeError: boom" in why
    assert tree.per_layer_outcome(c, full(c)) == "error"
    assert tree.backend_outcome({"ok": True}, FLOOR) == "no_difference"
    holds, why, evidence, deciding = tree.decide_per_layer_backends({"sdpa": SILENT, "eager": RAISED}, FLOOR)
    assert deciding == {"sdpa_outcome": "silent_difference", "eager_outcome": "error", "noise_threshold": T}
    assert evidence["prediction"] == tree.PER_LAYER_PREDICTION


def test_a_floor_change_alone_moves_a_leaf():
    c = ctl(arg_sets=sets(3e-6))
    assert branch(c) == "unexplained" and branch(replace(c, floor=replace(FLOOR, measured=1e-6))) == "resume_contract"


def test_the_report_text_carries_every_measured_number():
    v = tree.choose_branch(ctl(**EVICT, extra=pos(0.36, 0.0)))
    lengths, explicit = v["path"][2], v["path"][3]
    assert lengths["numbers"]["generate_position"] == 18 and lengths["numbers"]["explicit_vs_full_forward"] == 0.0
    assert explicit["numbers"]["generate_position"] == 18 and explicit["numbers"]["logical_position"] == 80
    assert explicit["numbers"]["explicit_vs_generate"] == 0.36
    v = tree.choose_branch(ctl(arg_sets=sets(0.3), state_changed=True, restored_diff=1e-7))
    assert v["path"][-1]["numbers"] == {"state_changed_by_rebuild": True, "state_restored_max_abs_diff": 1e-7}
    mech = {"past_length_reported": 20, "generate_position": 20, "attention_mask_shape": [1, 83], "attention_masks": [[1, 83]]}
    why = per_layer_with(mech)
    assert "past length 20 (layer 0's), position 20, mask [1, 83]; attention masks per layer [[1, 83]]" in why
    assert "mask none (generate passed no mask)" in per_layer_with({})
    _, why, _, _ = tree.decide_per_layer_backends({"sdpa": SILENT, "eager": RAISED, "flash": SILENT}, FLOOR)
    assert "flash: predicted -, measured silent_difference" in why
    assert tree.backend_outcome({"ok": False, "stage": None}, FLOOR) == "error_elsewhere"


def per_layer_with(mechanism: dict) -> str:
    c = ctl(**PER_LAYER)
    return tree.decide_per_layer(c, full(c), mechanism)[1]
