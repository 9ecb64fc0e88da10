"""Kill tests for the triage tree (make mutants: helpers/triage/tree.py): every leaf reached through each of its
conditions separately, and each claim decision with a holding case and one contradicting case per condition."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest

from helpers.compare import NoiseFloor
from helpers.triage import tree, walk

FLOOR = NoiseFloor(measured=5e-7, resolution=4e-7, margin=4.0, dtype="float32", scale=1.0, what="kill")
T = FLOOR.threshold  # 2e-6
ABOVE = T * (1 + 1e-6)


def sets(diff: float | None = 0.0, error: str = "RuntimeError") -> list[tree.ArgSet]:
    return [tree.ArgSet("neither", False, False, error, error), tree.ArgSet("position_only", False, False, error, error),
            tree.ArgSet("mask_only", True, True, max_abs_diff=diff), tree.ArgSet("both", True, True, max_abs_diff=diff)]


def ctl(**kw: Any) -> tree.Controls:
    base = dict(rebuild="x", floor=FLOOR, arg_sets=sets(), processed_length=82,
                rebuilt_lengths=[82] * 4)
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


def slots(kept: list[int | None], n: int = 82, layers: int = 4) -> list[tree.SlotLayer]:
    return [tree.SlotLayer(n, [None if k is None else (i, k) for k in kept]) for i in range(layers)]


COPIED = slots([None] * 82)


def layer_states(stored: list[int], reported: list[int] | None = None, init: bool = True, cls: str = "L") -> tree.ResumeState:
    reported = reported or stored
    return tree.ResumeState(82, None, reported[0] or 0, 1, (stored[0] or 0) + 1, None, 80,
                            [tree.LayerState(cls, s, r, init) for s, r in zip(stored, reported)])


def fixes(**diffs: float | None) -> dict[str, tree.Repair]:
    return {name: tree.Repair(name, d, d is not None, "" if d is not None else "E at s") for name, d in diffs.items()}


FRESH = dict(resume_on="fresh_instance", fresh_bare_diff=0.45, repairs=fixes(saved_state=0.0))


def test_fresh_instance_leaf_through_each_condition():
    assert branch(ctl(**FRESH)) == "model_side_state"
    assert branch(ctl(**{**FRESH, "resume_on": "same_instance"})) == "no_defect"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": None})) == "no_defect"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": T})) == "no_defect", "the bare instance must differ beyond the floor"
    assert branch(ctl(**{**FRESH, "fresh_bare_diff": ABOVE})) == "model_side_state"
    assert branch(ctl(**{**FRESH, "repairs": {}})) == "no_defect"
    assert branch(ctl(**{**FRESH, "repairs": fixes(saved_state=ABOVE)})) == "no_defect"
    assert branch(ctl(**{**FRESH, "repairs": fixes(saved_state=T)})) == "model_side_state"
    assert branch(ctl(**{**FRESH, "repairs": fixes(saved_state=None)})) == "no_defect", "a repair that raised restores nothing"


def test_the_path_records_each_answer_and_its_numbers():
    v = tree.choose_branch(ctl(**{**FRESH, "repairs": fixes(saved_state=ABOVE, full_mask=1e-7)}))
    assert [(d["node"], d["answer"]) for d in v["path"]] == [("identical", True), ("fresh_state", False), ("no_defect", True)]
    fresh = v["path"][1]
    assert fresh["numbers"] == {"fresh_without_state": 0.45, "saved_state_max_abs_diff": ABOVE, "noise_threshold": T}
    assert fresh["question"] == tree.NODES[1][2]
    assert v["path"][2]["numbers"] == {"fail_for_both": ["neither", "position_only"], "work_for_both": ["mask_only", "both"],
                                       "full_mask_max_abs_diff": 1e-7, "noise_threshold": T}
    assert v["repairs"] == [{"name": "saved_state", "max_abs_diff": ABOVE, "restores": False},
                            {"name": "full_mask", "max_abs_diff": 1e-7, "restores": True}]
    assert v["note"] == "resume_contract"
    v = tree.choose_branch(ctl(arg_sets=sets(0.3), slots=COPIED, repairs=fixes(full_mask=0.3)))
    assert [(d["node"], d["answer"]) for d in v["path"]] == [
        ("identical", False), ("only_rebuilt", True), ("full_mask", False), ("model_state", False), ("metadata", False),
        ("compressed", False), ("kv_differ", True)]
    assert v["path"][1]["numbers"] == {"differing": ["mask_only", "both"]}
    assert v["path"][-1]["numbers"] == {"slots": "content", "layers_content": [0, 1, 2, 3], "full_mask_max_abs_diff": 0.3,
                                        "noise_threshold": T}


EVICT = dict(arg_sets=sets(0.98), rebuilt_lengths=[20] * 4, slots=slots([*range(4), *range(66, 82)]),
             original_state=layer_states([82] * 4), rebuilt_state=layer_states([20] * 4))


def at(d: float | None, vs: float | None = 0.36) -> dict:
    return {"repairs": {"continue_at_processed_length": tree.Repair("continue_at_processed_length", d, d is not None,
                                                                    "" if d is not None else "E at s", vs)}}


def test_compression_leaves_through_each_condition():
    assert branch(ctl(**EVICT, **at(T))) == "compression_positions"
    assert branch(ctl(**EVICT, **at(ABOVE))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, **at(ABOVE, vs=T))) == "compression_information_loss", "the repair moved the step within the floor"
    assert branch(ctl(**EVICT, **at(ABOVE, vs=ABOVE))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, **at(ABOVE, vs=None))) == "compression_positions_and_loss"
    assert branch(ctl(**EVICT, **at(None))) == "compression_unresolved"
    assert branch(ctl(**EVICT)) == "compression_unresolved", "the repair did not run"
    same = {**EVICT, "slots": slots(list(range(82)))}
    assert branch(ctl(**same, **at(T))) == "unexplained", "fewer reported slots are not compression: evicted ones are"
    more = {**EVICT, "slots": slots([*range(82), None])}
    assert branch(ctl(**more, **at(T))) == "unexplained", "extra slots whose crop did not run: not compression"
    one = slots(list(range(82)), layers=3) + [tree.SlotLayer(82, [(3, k) for k in range(1, 82)])]
    assert tree.slot_layers(one, "evicted") == [3] and branch(ctl(**{**EVICT, "slots": one}, **at(T))) == "compression_positions"
    assert branch(ctl(**{**EVICT, "slots": one[:3] + [tree.SlotLayer(82, [(2, k) for k in range(82)])]}, **at(T))) \
        == "reconstruction_copy", "a layer holding another layer's slots: exchanged, not compressed"
    v = tree.choose_branch(ctl(**EVICT, **at(ABOVE, vs=T)))
    assert v["path"][-1] == {"node": "information_lost", "question": tree.QUESTIONS["information_lost"], "answer": True,
                             "numbers": {"repaired_vs_generate": T, "noise_threshold": T}}
    assert [(d["node"], d["answer"]) for d in v["path"][-4:]] == [("positions_restore", False), ("unresolved", False),
                                                                 ("positions_and_loss", False), ("information_lost", True)]
    assert v["path"][-4]["numbers"]["continue_at_processed_length_max_abs_diff"] == ABOVE
    v = tree.choose_branch(ctl(**EVICT, **at(None)))
    assert v["path"][-1]["numbers"] == {"error": "E at s"} and v["repairs"][-1]["error"] == "E at s"


def test_metadata_and_state_leaves_through_each_condition():
    differ = dict(arg_sets=sets(0.3), original_state=layer_states([82] * 4))
    assert branch(ctl(**differ)) == "unexplained"
    assert branch(ctl(**differ, slots=COPIED)) == "reconstruction_copy"
    assert branch(ctl(**differ, slots=slots([*range(81), 80]))) == "reconstruction_copy", "a slot stored twice: repeated"
    meta = fixes(reregister_via_update=T)
    for cell in (dict(init=False), dict(reported=[0] * 4), dict(cls="Other")):
        assert branch(ctl(**differ, rebuilt_state=layer_states([82] * 4, **cell), repairs=meta)) == "cache_metadata", cell
        assert branch(ctl(**differ, rebuilt_state=layer_states([82] * 4, **cell))) == "unexplained", cell
    assert branch(ctl(**differ, rebuilt_state=layer_states([82] * 4), repairs=meta)) == "unexplained", "no cell differs"
    assert branch(ctl(**differ, rebuilt_state=layer_states([82] * 4, init=False), repairs=fixes(reregister_via_update=ABOVE))) \
        == "unexplained"
    state = dict(**differ, state_changed=True, repairs=fixes(saved_state=T))
    assert branch(ctl(**state)) == "model_side_state"
    assert branch(ctl(**{**state, "state_changed": False})) == "unexplained"
    assert branch(ctl(**{**state, "repairs": fixes(saved_state=None)})) == "unexplained"
    assert branch(ctl(**{**state, "repairs": fixes(saved_state=ABOVE)})) == "unexplained"
    moved = {**differ, "rebuilt_state": replace(layer_states([82] * 4), model_state=[1]), "repairs": fixes(saved_state=T)}
    assert branch(ctl(**moved)) == "model_side_state", "the table's model-state cell alone picks the candidate"
    assert branch(ctl(**differ, repairs=fixes(full_mask=T))) == "resume_contract"
    assert branch(ctl(**differ, repairs=fixes(full_mask=ABOVE))) == "unexplained"
    last = tree.choose_branch(ctl(**differ, repairs=fixes(full_mask=0.3, reregister_via_update=0.0)))["path"][-1]
    assert last["node"] == "nothing_visible" and last["numbers"] == {
        "slots": "same", "restoring_repairs_without_a_table_cell": ["reregister_via_update"]}


def test_render_shows_unchecked_and_declined_nodes():
    v = tree.choose_branch(ctl(arg_sets=sets(0.3), repairs=fixes(full_mask=0.3, reregister_via_update=0.0)))
    text = tree.render("r", v)
    assert "+-- [ ] slot comparison: slots no original slot holds" in text
    assert "+-- [x] no cell of control 0 explains it and no repair restores  -> unexplained" in text
    assert "    +--     resumed on a fresh instance" in text  # not reached: no mark
    assert text.splitlines()[1] == ("decided by: slots=same; "
                                    "restoring_repairs_without_a_table_cell=['reregister_via_update']")
    assert "  - reregister_via_update: 0 -> restores" in text and "although no cell of control 0 points at it" in text
    assert tree.render("r", {"branch": "unexplained", "path": []}).splitlines()[1] == "decided by: the first decision"
    assert "repairs tried: none applied" in tree.render("r", {"branch": "unexplained", "path": []})


# --- the claim decisions, as (case, thunk, expected holds) for tests/test_decisions.py's registry --------------

ASSIGNED = ctl(arg_sets=sets(1.15), original_state=layer_states([82] * 4), rebuilt_state=layer_states([82] * 4, [0] * 4, init=False),
               repairs=fixes(full_mask=1.15, reregister_via_update=4e-7))
RETAINED = ctl(**EVICT)  # 82 processed, 20 retained: generate continues at 20 instead of 82 (shift -62)
PER_LAYER = dict(arg_sets=sets(0.91), rebuilt_lengths=[20, 16, 12, 8], slots=COPIED)
SILENT = {"ok": True, "max_abs_diff_vs_original": 0.9, "stage": ""}
RAISED = {"ok": False, "error_type": "RuntimeError", "stage": "modeling_x.py:eager_attention_forward"}


def full(c: tree.Controls) -> tree.ArgSet:
    return c.arg_sets[2]


def per_layer(**kw: Any) -> tuple:
    c = ctl(**{**PER_LAYER, **kw})
    return tree.decide_per_layer(c, full(c), {})


Case = tuple[str, Callable[[], Any], bool]
CASES: list[Case] = [
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
    assert branch(c) == "unexplained" and branch(replace(c, floor=replace(FLOOR, measured=1e-6))) == "no_defect"


def test_the_report_text_carries_every_measured_number():
    v = tree.choose_branch(ctl(**EVICT, **at(ABOVE), extra={"generate_position": 18, "logical_position": 80}))
    taken = v["path"][-1]
    first = next(d for d in v["path"] if d["node"] == "positions_restore")
    assert first["numbers"]["generate_position"] == 18 and first["numbers"]["logical_position"] == 80
    assert first["numbers"]["repaired_vs_generate"] == 0.36 and taken["numbers"] == {"repaired_vs_generate": 0.36}
    assert v["notes"]["remaining"]["after_continue_at_processed_length"] == ABOVE
    v = tree.choose_branch(ctl(arg_sets=sets(0.3), state_changed=True, repairs=fixes(saved_state=1e-7)))
    assert v["path"][-1]["numbers"] == {"state_differs": True, "saved_state_max_abs_diff": 1e-7, "noise_threshold": T}
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


# --- the walk's numbers and notes (make mutants: helpers/triage/walk.py) ---------------------------------------------

def _numbers(v: dict, node: str) -> dict:
    return next(d["numbers"] for d in v["path"] if d["node"] == node)


def test_compression_steps_show_only_what_decided_them():
    v = tree.choose_branch(ctl(**EVICT, **at(ABOVE, vs=T), identity_remaining=0.25))
    assert _numbers(v, "positions_restore")["identity_vs_full_forward"] == 0.25
    assert _numbers(v, "unresolved") == {} and _numbers(v, "positions_and_loss") == {}  # neither raised nor moved
    assert _numbers(v, "information_lost") == {"repaired_vs_generate": T, "noise_threshold": T}
    assert _numbers(tree.choose_branch(ctl(**EVICT)), "unresolved") == {"error": "not run"}  # the repair never ran
    assert _numbers(tree.choose_branch(ctl(**EVICT, **at(None))), "unresolved") == {"error": "E at s"}


def test_a_slot_step_shows_its_repairs_numbers_and_a_failed_repairs_error():
    v = tree.choose_branch(ctl(arg_sets=sets(0.9), slots=slots(list(range(81))), repairs=fixes(full_mask=0.9, refeed_whole_ids=0.0)))
    assert v["branch"] == "prefix_short"
    assert _numbers(v, "prefix_short") == {"slots": "prefix_short", "layers_prefix_short": [0, 1, 2, 3],
                                           "refeed_whole_ids_max_abs_diff": 0.0, "noise_threshold": T}
    w = walk._Walk(ctl(**at(None)))
    assert w.numbers("continue_at_processed_length") == {"continue_at_processed_length_max_abs_diff": None,
                                                         "continue_at_processed_length_error": "E at s", "noise_threshold": T}


def _kinds(*kinds: str, n: int = 82) -> list[tree.SlotLayer]:
    """One rebuilt layer per kind, each against an original layer of n slots."""
    held = {"same": list(range(n)), "evicted": list(range(0, n, 2)), "prefix_short": list(range(n - 1)),
            "extra": [*range(n), None, None], "content": [None] * n}
    return [tree.SlotLayer(n, [None if j is None else (i, j) for j in held[k]]) for i, k in enumerate(kinds)]


def _state(stored: list[int]) -> tree.ResumeState:
    return replace(layer_states(stored), slots=[f"layer {i} as described" for i in range(len(stored))])


def test_notes_say_what_remains_where_the_slots_differ_and_why_lengths_cannot_share_a_mask():
    c = ctl(slots=_kinds("same", "evicted", "same", "extra"), rebuilt_state=_state([82, 41, 82, 41]), identity_remaining=0.25,
            repairs={"continue_at_processed_length": tree.Repair("continue_at_processed_length", 0.5, True, "", 0.1)})
    per_layer = {"stored_slots": [82, 41, 82, 41], "why": "no single attention mask fits different per-layer lengths under "
                 "eager attention or a multi-token suffix (the mask is sized from one layer)",
                 "this_run": "this run's steps ran (a one-token suffix under sdpa needs no real mask)"}
    assert walk.notes(c, "compression_positions_and_loss") == {
        "remaining": {"after_continue_at_processed_length": 0.5, "identity_vs_full_forward": 0.25, "noise_threshold": T,
                      "times_identity": 2.0},
        "slots": {"layers": [1, 3], "first": "layer 1 as described"}, "per_layer": per_layer}
    raised = replace(c, repairs={"continue_at_processed_length": tree.Repair("continue_at_processed_length", None, False,
                                                                             "RuntimeError at step")})
    assert walk.notes(raised, "compression_unresolved") == {
        "slots": {"layers": [1, 3], "first": "layer 1 as described"},
        "per_layer": {**per_layer, "this_run": "continuing at the processed length raised RuntimeError at step"}}
    assert walk.notes(c, "resume_contract") == {"per_layer": per_layer}  # no slot note outside the slot leaves
    assert "per_layer" not in walk.notes(replace(c, rebuilt_state=_state([41] * 4)), "compression_positions_and_loss")
    extra_only = replace(c, slots=_kinds("same", "extra", "same", "extra"))  # different lengths, but not a compression
    assert "per_layer" not in walk.notes(extra_only, "extra_slots")
    copied = replace(c, slots=_kinds("same", "content", "same", "same"), rebuilt_state=_state([82] * 4),
                     localized={"layer": 1}, topk={"top1_kept": True})
    assert walk.notes(copied, "reconstruction_copy") == {"localized": {"layer": 1}, "topk": {"top1_kept": True},
                                                         "slots": {"layers": [1], "first": "layer 1 as described"}}


def test_score_ordered_slots_through_each_condition():
    """An eviction out of position order (whole slots, or per KV head) against its twins: in order, repeated, content;
    the order is harmless only where putting it back in order stays within the floor."""
    def one(kept: list[int | None], heads: list[list[int]] | None = None, n: int = 6) -> str:
        return tree.slot_kind(0, tree.SlotLayer(n, [None if k is None else (0, k) for k in kept], heads=heads))
    assert one([5, 0, 1]) == "reordered" and one([0, 1, 5]) == "evicted" and one([0, 5, 5]) == "repeated"
    assert one([1, 0, 2, 3, 4, 5]) == "reordered" and one([0, 1]) == "prefix_short" and one(list(range(6))) == "same"
    assert one([None] * 3, heads=[[0, 2, 4], [1, 3, 5]]) == "evicted"
    assert one([None] * 3, heads=[[0, 2, 4], [5, 3, 1]]) == "reordered", "one head out of order decides"
    assert one([None] * 3, heads=[[0, 2, 2], [5, 3, 1]]) == "repeated", "one head repeating decides"
    assert one([None] * 3, heads=[[0, 1, 2], [0, 1, 2]]) == "prefix_short"
    assert one([None] * 6, heads=[list(range(6))] * 2) == "same"
    assert one([0, None, 2], heads=[[0, 1, 2], [0, 1, 2]]) == "prefix_short", "heads decide where a whole slot is missing"
    assert one([0, None, 2]) == "content" and one([0, 1, 2, 3, 4, 5, None]) == "extra"
    assert tree.slot_verdict([tree.SlotLayer(6, [(0, 5), (0, 0)]), tree.SlotLayer(6, [(1, 0), (1, 2)])]) == "reordered"
    assert tree.slot_verdict([tree.SlotLayer(6, [(0, 5), (0, 5)]), tree.SlotLayer(6, [(1, 5), (1, 0)])]) == "repeated"
    kept = [*range(4), *range(81, 63, -1)]
    base = dict(arg_sets=sets(0.98), rebuilt_lengths=[22] * 4, slots=slots(kept), original_state=layer_states([82] * 4),
                rebuilt_state=layer_states([22] * 4))

    def order(vs: float | None, ok: bool = True) -> dict:
        r = {**at(ABOVE)["repairs"]}
        if vs is not None or not ok:
            r["position_order"] = tree.Repair("position_order", 0.98, ok, "" if ok else "E at s", vs)
        return {"repairs": r}
    assert branch(ctl(**base, **order(T))) == "compression_positions_and_loss"
    assert branch(ctl(**base, **order(ABOVE))) == "reconstruction_copy", "putting them in order moved the step"
    assert branch(ctl(**base, **order(None))) == "reconstruction_copy", "not measured: not harmless"
    assert branch(ctl(**base, **order(T, ok=False))) == "reconstruction_copy", "raised: not harmless"
    v = tree.choose_branch(ctl(**base, **order(T)))
    step = next(d for d in v["path"] if d["node"] == "order_harmless")
    assert step["answer"] and step["numbers"]["position_order_vs_generate"] == T
    assert "order_harmless" not in [d["node"] for d in tree.choose_branch(ctl(**{**base, "slots": slots(sorted(kept))},
                                                                                **order(T)))["path"]]
