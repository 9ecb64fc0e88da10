"""Notebook 06: the decision tree's branch logic, the claim decisions, the rebuild loader, and the notebook end to end."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvresume import compat
from helpers.triage import rebuilds, slots
from helpers.triage import tree as triage
from helpers.compare import NoiseFloor
from helpers.pipeline.run import execute
from helpers.pipeline.paths import repo_root
from helpers.results import Results
from inprocess import run_one  # tests/ is on sys.path

ROOT = repo_root()
EXAMPLE = "examples/my_rebuild.py"
FLOOR = NoiseFloor(measured=5e-7, resolution=4e-7, margin=4.0, dtype="float32", scale=1.0, what="hand-made")
FAILS = ("neither", "position_only")


def arg_sets(diff: float | None = 0.0, rebuilt_fails: bool = False, error: str = "RuntimeError") -> list[triage.ArgSet]:
    """The seed's four argument sets: neither/position_only fail for both, the two with the full mask run."""
    out = [triage.ArgSet(n, False, False, error, error) for n in FAILS]
    for n in ("mask_only", "both"):
        if rebuilt_fails:
            out.append(triage.ArgSet(n, True, False, "", "RuntimeError"))
        else:
            out.append(triage.ArgSet(n, True, True, max_abs_diff=diff))
    return out


def state(stored: list[int | None] | None = None, reported: list[int | None] | None = None, initialized: bool = True,
          cls: str = "DynamicLayer", model_state: list | None = None, carried: int | None = None) -> triage.ResumeState:
    """Control 0 of one cache (82 processed tokens, a one-token suffix); per-layer cells from the lists."""
    stored = stored or [82] * 4
    reported = reported or stored
    layers = [triage.LayerState(cls, s, r, initialized) for s, r in zip(stored, reported)]
    return triage.ResumeState(82, carried, int(reported[0] or 0), 1, int(stored[0] or 0) + 1, None, 39, layers,
                              model_state=model_state)


def held(kept: list[int | None] | None = None, n: int = 82, layers: int = 4) -> list[triage.SlotLayer]:
    """The slot comparison: every layer holds the original's slots `kept` in this order (None: a slot no original
    slot holds); default: all 82."""
    kept = list(range(n)) if kept is None else kept
    return [triage.SlotLayer(n, [None if k is None else (i, k) for k in kept]) for i in range(layers)]


SHORT, EXTRA, COPIED = held(list(range(81))), held(list(range(82)) + [None] * 5), held([None] * 82)


def fix(name: str, d: float | None, vs: float | None = None, ok: bool = True) -> triage.Repair:
    return triage.Repair(name, d, ok, "" if ok else "RuntimeError at eager_attention_forward", vs)


def controls(rebuilt: triage.ResumeState | None = None, repairs: list[triage.Repair] | None = None, **kw) -> triage.Controls:
    """An identity-like outcome (control 0 equal, the full mask restores); keyword arguments change one control."""
    base = dict(rebuild="x", floor=FLOOR, arg_sets=arg_sets(), processed_length=82,
                rebuilt_lengths=[82] * 4, slots=held(),
                original_state=state(), rebuilt_state=rebuilt or state(),
                repairs={r.name: r for r in (repairs or [fix("full_mask", 1e-7)])}, identity_remaining=4e-7)
    base.update(kw)
    return triage.Controls(**base)


EVICTED = dict(arg_sets=arg_sets(0.98), rebuilt_lengths=[20] * 4, slots=held([0, 1, 2, 3, *range(66, 82)]),
               rebuilt=state([20] * 4), extra={"generate_position": -22, "logical_position": 39})


def evicted(at_processed: triage.Repair) -> triage.Controls:
    return controls(**EVICTED, repairs=[fix("full_mask", 0.98), at_processed])


ASSIGNED = state([82] * 4, [0] * 4, initialized=False)  # the assignment rebuild: slots stored, nothing reported
LEAF_CASES = {
    "no_defect": controls(),
    "resume_contract": controls(arg_sets=[triage.ArgSet("neither", False, False, "RuntimeError", "ValueError")] + arg_sets()[1:]),
    "model_side_state (fresh instance)": controls(resume_on="fresh_instance", fresh_bare_diff=0.45,
                                                  repairs=[fix("full_mask", 1e-7), fix("saved_state", 0.0)]),
    "model_side_state (state changed by the rebuild)": controls(
        arg_sets=arg_sets(0.45), state_changed=True, rebuilt=state(model_state=[-40]),
        original_state=state(model_state=[-42]), repairs=[fix("full_mask", 0.45), fix("saved_state", 0.0)]),
    "cache_metadata": controls(arg_sets=arg_sets(1.15), rebuilt=ASSIGNED, rebuilt_lengths=[0] * 4,
                               repairs=[fix("full_mask", 1.15), fix("reregister_via_update", 4e-7)]),
    "prefix_short": controls(arg_sets=arg_sets(0.17), rebuilt=state([81] * 4), rebuilt_lengths=[81] * 4, slots=SHORT,
                             repairs=[fix("full_mask", 0.17), fix("refeed_whole_ids", 4.8e-7)]),
    "extra_slots": controls(arg_sets=arg_sets(0.42), rebuilt=state([87] * 4), rebuilt_lengths=[87] * 4, slots=EXTRA,
                            repairs=[fix("full_mask", 0.42), fix("crop_to_processed", 4.2e-7)]),
    "compression_positions": evicted(fix("continue_at_processed_length", 1e-6, vs=0.36)),
    "compression_positions_and_loss": evicted(fix("continue_at_processed_length", 0.81, vs=0.36)),
    "compression_information_loss": evicted(fix("continue_at_processed_length", 0.94, vs=0.0)),
    "compression_unresolved": evicted(fix("continue_at_processed_length", None, ok=False)),
    "reconstruction_copy": controls(arg_sets=arg_sets(1.6e-3), slots=COPIED,
                                    repairs=[fix("full_mask", 1.6e-3)]),
    "unexplained": controls(arg_sets=arg_sets(0.3), repairs=[fix("full_mask", 0.3)]),
}

# each leaf's case with the control-0 cell (or the repair's number) that picked it contradicted: the leaf it moves to
CONTRADICTED = {
    "no_defect": (controls(arg_sets=arg_sets(0.3), repairs=[fix("full_mask", 0.3)]), "unexplained"),
    "resume_contract": (replace(LEAF_CASES["resume_contract"], repairs={"full_mask": fix("full_mask", 0.3)}), "unexplained"),
    "model_side_state (fresh instance)": (replace(LEAF_CASES["model_side_state (fresh instance)"],
                                                  repairs={"saved_state": fix("saved_state", 0.45)}), "no_defect"),
    "model_side_state (state changed by the rebuild)": (replace(LEAF_CASES["model_side_state (state changed by the rebuild)"],
                                                                state_changed=False, rebuilt_state=state(model_state=[-42])),
                                                        "unexplained"),
    "cache_metadata": (replace(LEAF_CASES["cache_metadata"], rebuilt_state=state()), "unexplained"),
    "prefix_short": (replace(LEAF_CASES["prefix_short"], repairs={"full_mask": fix("full_mask", 0.17),
                     "refeed_whole_ids": fix("refeed_whole_ids", 0.17), "continue_at_processed_length":
                     fix("continue_at_processed_length", 0.2, vs=0.1)}), "compression_positions_and_loss"),
    "extra_slots": (replace(LEAF_CASES["extra_slots"], slots=held(list(range(82)) + [None] * 4 + [3])), "reconstruction_copy"),
    "compression_positions": (replace(LEAF_CASES["compression_positions"], slots=held()), "unexplained"),
    "compression_positions_and_loss": (evicted(fix("continue_at_processed_length", 0.81, vs=2e-6)), "compression_information_loss"),
    "compression_information_loss": (evicted(fix("continue_at_processed_length", 0.94, vs=2.1e-6)),
                                     "compression_positions_and_loss"),
    "compression_unresolved": (evicted(fix("continue_at_processed_length", 2e-6, vs=0.36)), "compression_positions"),
    "reconstruction_copy": (replace(LEAF_CASES["reconstruction_copy"], slots=held()), "unexplained"),
    "unexplained": (replace(LEAF_CASES["unexplained"], rebuilt_state=ASSIGNED,
                            repairs={"full_mask": fix("full_mask", 0.3), "reregister_via_update": fix("reregister_via_update", 0.0)}),
                    "cache_metadata"),
}


@pytest.mark.parametrize("case", list(LEAF_CASES))
def test_every_leaf_is_reached(case):
    verdict = triage.choose_branch(LEAF_CASES[case])
    assert verdict["branch"] == case.split(" ")[0]
    assert verdict["path"][0]["node"] == "identical"
    assert all({"node", "question", "answer", "numbers"} <= set(d) for d in verdict["path"])
    assert set(triage.LEAVES) >= {verdict["branch"]}
    assert all(set(r) >= {"name", "max_abs_diff", "restores"} for r in verdict["repairs"]) and verdict["repairs"]


@pytest.mark.parametrize("case", list(CONTRADICTED))
def test_each_leaf_fed_a_contradicting_table_moves(case):
    c, moves_to = CONTRADICTED[case]
    assert triage.choose_branch(c)["branch"] == moves_to != case.split(" ")[0]


def test_leaf_cases_cover_every_leaf():
    assert {case.split(" ")[0] for case in LEAF_CASES} == set(triage.LEAVES)


def test_a_repaired_leaf_is_named_only_when_its_repair_restores():
    """The repair's number decides: at the threshold it restores, just past it the walk moves on."""
    t = FLOOR.threshold
    meta = lambda d: triage.choose_branch(replace(LEAF_CASES["cache_metadata"], repairs={  # noqa: E731
        "full_mask": fix("full_mask", 1.15), "reregister_via_update": fix("reregister_via_update", d)}))
    assert meta(t)["branch"] == "cache_metadata" and meta(t * 1.01)["branch"] == "unexplained"
    assert meta(None)["branch"] == "unexplained"
    v = meta(t * 1.01)
    assert [(r["name"], r["restores"]) for r in v["repairs"]] == [("full_mask", False), ("reregister_via_update", False)]
    state_case = LEAF_CASES["model_side_state (state changed by the rebuild)"]
    assert triage.choose_branch(replace(state_case, repairs={"full_mask": fix("full_mask", 0.45),
                                                             "saved_state": fix("saved_state", 0.1)}))["branch"] == "unexplained"
    failing = replace(LEAF_CASES["cache_metadata"], repairs={"full_mask": fix("full_mask", 1.15),
                                                            "reregister_via_update": fix("reregister_via_update", None, ok=False)})
    assert triage.choose_branch(failing)["repairs"][-1]["error"].startswith("RuntimeError")


def test_the_floor_decides_not_a_fixed_number():
    tiny = controls(arg_sets=arg_sets(3e-6), repairs=[fix("full_mask", 3e-6)])  # threshold 4 x 5e-7 = 2e-6: 3e-6 differs
    assert triage.choose_branch(tiny)["branch"] == "unexplained"
    loose = replace(tiny, floor=replace(FLOOR, measured=1e-6))  # threshold 4e-6: the same 3e-6 is noise
    assert triage.choose_branch(loose)["branch"] == "no_defect"


def test_a_failure_only_for_the_rebuilt_cache_is_not_the_contract():
    fails = controls(arg_sets=arg_sets(rebuilt_fails=True), repairs=[fix("full_mask", None, ok=False)])
    assert triage.choose_branch(fails)["branch"] == "unexplained"
    assert triage.choose_branch(LEAF_CASES["resume_contract"])["path"][0]["answer"] is False


def test_compression_is_evicted_slots_by_content_not_a_different_reported_length():
    """The assignment rebuild reports length 0 with every slot stored: metadata, not compression (the issue's case)."""
    v = triage.choose_branch(LEAF_CASES["cache_metadata"])
    assert "compressed" not in [d["node"] for d in v["path"]]
    assert triage.slot_verdict(LEAF_CASES["cache_metadata"].slots) == "same"
    assert triage.metadata_differs(LEAF_CASES["cache_metadata"]) == [0, 1, 2, 3]
    no_repair = replace(LEAF_CASES["cache_metadata"], repairs={"full_mask": fix("full_mask", 1.15)})
    v = triage.choose_branch(no_repair)
    assert v["branch"] == "unexplained" and [d["node"] for d in v["path"]][-2:] == ["kv_differ", "nothing_visible"]
    sliding = state([82, 16], [82, 82])  # a sliding layer stores its window and reports what it processed
    assert triage.metadata_differs(controls(original_state=sliding, rebuilt=sliding)) == []


def test_slot_decisions_each_with_a_contradicting_twin():
    """Each slot kind from the content a layer holds, and the twin one slot away that the rule must not take."""
    kind = lambda kept, n=6, i=0: triage.slot_kind(i, triage.SlotLayer(n, [None if k is None else (i, k) if  # noqa: E731
                                                                                  isinstance(k, int) else k for k in kept]))
    assert kind([0, 1, 2, 3, 4, 5]) == "same" and kind([0, 1, 2, 3, 5, 4]) == "reordered"
    assert kind([0, 1, 2, 3, 4]) == "prefix_short" and kind([1, 2, 3, 4, 5]) == "evicted", "the first slot, not the last"
    assert kind([0, 1, 2, 4, 5]) == "evicted" and kind([0, 1, 2, 2, 5]) == "repeated"
    assert kind([5, 0, 1]) == "reordered" and kind([0, 1, 5]) == "evicted", "a subset out of position order: an eviction"
    heads = lambda *h: triage.slot_kind(0, triage.SlotLayer(6, [None] * 3, heads=[list(x) for x in h]))  # noqa: E731
    assert heads([0, 2, 4], [1, 3, 5]) == "evicted" and heads([4, 2, 0], [1, 3, 5]) == "reordered", "each head its own"
    assert heads([0, 0, 4], [5, 3, 1]) == "repeated" and kind([None, None, None]) == "content", "no head match: content"
    assert kind([0, 1, 2, 3, 4, 5, None]) == "extra" and kind([0, 1, 2, 3, 4, None, None]) == "content"
    assert kind([0, 1, 2, 3, 4, 5, None, 1]) == "content", "an original slot after the extra ones: not a plain append"
    assert kind([None] * 6) == "content" and kind([(1, k) for k in range(6)]) == "exchanged"
    assert kind([]) == "evicted" and kind([], n=None) == "same"
    assert triage.slot_kind(0, triage.SlotLayer(None, [], same_state=False)) == "content"
    verdict = lambda *layers: triage.slot_verdict([triage.SlotLayer(3, [(i, k) if k is not None else None  # noqa: E731
                                                                        for k in kept]) for i, kept in enumerate(layers)])
    assert verdict([0, 1, 2], [0, 1, 2]) == "same" and verdict([0, 1], [0, 1, 2]) == "prefix_short"
    assert verdict([0, 1], [0, 2]) == "evicted", "one evicted layer makes the cache a compression"
    assert verdict([0, 1, 2, None], [0, 1, 2]) == "extra" and verdict([0, 1, 2, None], [None, 1, 2]) == "content"
    assert triage.slot_layers(held(list(range(81))) + held(n=82, layers=1), "prefix_short") == [0, 1, 2, 3]


def test_a_prefix_short_cache_is_not_compression_when_its_refeed_restores():
    """An exact prefix one slot short: prefix_short when the re-feed restores; an eviction of the first slot, with the
    same lengths, is a compression; a re-feed past the floor moves the walk on to the compression leaves."""
    v = triage.choose_branch(LEAF_CASES["prefix_short"])
    assert v["path"][-1]["numbers"]["layers_prefix_short"] == [0, 1, 2, 3] and v["repairs"][-1]["restores"]
    first = replace(LEAF_CASES["prefix_short"], slots=held(list(range(1, 82))))
    assert triage.choose_branch(first)["branch"] == "compression_unresolved", "first slot evicted: no re-feed tried"
    at_floor = lambda d: triage.choose_branch(replace(LEAF_CASES["prefix_short"], repairs={  # noqa: E731
        "refeed_whole_ids": fix("refeed_whole_ids", d)}))["branch"]
    assert at_floor(FLOOR.threshold) == "prefix_short" and at_floor(FLOOR.threshold * 1.01) == "compression_unresolved"
    extra = lambda d: triage.choose_branch(replace(LEAF_CASES["extra_slots"], repairs={  # noqa: E731
        "crop_to_processed": fix("crop_to_processed", d)}))["branch"]
    assert extra(FLOOR.threshold) == "extra_slots" and extra(FLOOR.threshold * 1.01) == "unexplained"
    assert "crop_to_processed" not in [r["name"] for r in triage.choose_branch(LEAF_CASES["prefix_short"])["repairs"]]


def test_compression_is_split_by_the_continue_at_processed_length_repair():
    """The repair restores, raises, changes generate()'s step (positions + loss) or not (loss): each at the floor's edge."""
    leaf = lambda d, vs=None, ok=True: triage.choose_branch(evicted(fix("continue_at_processed_length", d, vs, ok)))["branch"]  # noqa: E731
    assert leaf(0.81, 0.36) == "compression_positions_and_loss"
    assert leaf(2e-6, 0.36) == "compression_positions", "at the threshold: restores"
    assert leaf(2.1e-6, 0.36) == "compression_positions_and_loss"
    assert leaf(0.94, 0.0) == "compression_information_loss"
    assert leaf(0.94, 2e-6) == "compression_information_loss", "within the floor: the repair changed nothing"
    assert leaf(0.94, 2.1e-6) == "compression_positions_and_loss"
    assert leaf(0.94, None) == "compression_positions_and_loss", "generate() raised, the repair ran: a position defect"
    assert leaf(None, None, ok=False) == "compression_unresolved"
    assert triage.choose_branch(controls(**EVICTED, repairs=[fix("full_mask", 0.98)]))["branch"] == "compression_unresolved"


def test_no_compression_leaf_says_positions_do_not_matter_when_they_do():
    """Every leaf reached when the repair changes generate()'s step tells the reporter to pass the processed length."""
    for d in (0.81, 1e-6, 0.94):
        branch = triage.choose_branch(evicted(fix("continue_at_processed_length", d, vs=0.36)))["branch"]
        assert branch != "compression_information_loss", d
        assert "not the cause" not in triage.NEXT[branch]
        assert "processed length" in triage.NEXT[branch]
    assert "own loss" in triage.NEXT["compression_positions_and_loss"] and "own loss" in triage.NEXT["compression_information_loss"]


def test_loss_leaves_show_what_remains_against_the_identity_floor():
    v = triage.choose_branch(LEAF_CASES["compression_information_loss"])
    assert v["notes"]["remaining"] == {"after_continue_at_processed_length": 0.94, "identity_vs_full_forward": 4e-7,
                                       "noise_threshold": FLOOR.threshold, "times_identity": 0.94 / 4e-7}
    assert "against the identity rebuild's 4e-07" in triage.render("x", v)
    v = triage.choose_branch(replace(LEAF_CASES["reconstruction_copy"], topk={"top1_kept": True, "top5_kept": False,
                                     "top5_overlap": 4, "max_abs_diff": 1.6e-3, "noise_threshold": 2e-6, "times_threshold": 800.0},
                                     localized={"layer": 2, "slot": 5, "differs_in": "keys", "keys_max_abs_diff": 0.01,
                                                "values_max_abs_diff": 0.0, "keys_differ_by": "content",
                                                "pair_norm_max_gap": 0.01, "pair_norm_tolerance": 1e-6, "pair_angle_max_gap": 0.2}))
    text = triage.render("int8", v)
    assert "top-1 kept, top-5 changed (4/5 shared); max |diff| 0.0016 = 800 times the noise threshold 2e-06" in text
    assert "first difference at layer 2, slot 5, in the keys" in text and "differ by content" in text


def test_every_leaf_says_what_to_do_next():
    assert set(triage.NEXT) == set(triage.LEAVES) == set(triage.MEANING)
    for case, c in LEAF_CASES.items():
        verdict = triage.choose_branch(c)
        assert f"next: {triage.NEXT[verdict['branch']]}" in triage.render("x", verdict)


def test_render_marks_the_taken_path_and_lists_the_repairs():
    text = triage.render("streaming", triage.choose_branch(LEAF_CASES["compression_positions"]))
    assert text.splitlines()[0].startswith("rebuild 'streaming'  ->  compression_positions")
    assert "[x] slot comparison: original slots evicted (first, middle, last)" in text
    assert "+--     slot comparison: the original's first slots, N short" in text, "asked only of a short prefix"
    short = triage.render("crop_short", triage.choose_branch(LEAF_CASES["prefix_short"]))
    assert "[x] slot comparison: the original's first slots, N short" in short
    assert "[x] the repair restores the full forward  -> compression_positions" in text
    assert "[ ] original and rebuilt behave identically" in text
    assert "stored_slots=[20, 20, 20, 20]" in text
    assert "  - full_mask: 0.98 -> does not restore" in text and "  - continue_at_processed_length: 1e-06 -> restores" in text
    assert text.splitlines()[2].startswith("next: continue at the processed length")
    correct = triage.render("identity", triage.choose_branch(LEAF_CASES["no_defect"]))
    assert correct.splitlines()[0].startswith("rebuild 'identity': no defect")
    assert "note (the resume contract, not the rebuild): ['neither', 'position_only'] fail for both" in correct
    assert triage.render("r", {"branch": "unexplained", "path": []}).splitlines()[1] == "decided by: the first decision"


# --- claim decisions: the measurement and a contradicting one ------------------------------------

def _verdict_of(holds: bool, tmp_path: Path) -> str:
    res = Results("t", {"c": "claim"}, {}, path=tmp_path / "r.json")
    return res.decide("c", holds, {})


def test_retained_length_claim_and_its_contradictions(tmp_path):
    c = LEAF_CASES["compression_positions"]  # 82 processed, 20 retained
    holds, evidence, deciding = triage.decide_retained_length(c, generate_position=-22, logical_position=40, explicit_vs_generate=0.36)
    assert _verdict_of(holds, tmp_path) == "reproduced" and evidence["position_shift"] == -62
    at_logical = triage.decide_retained_length(c, generate_position=40, logical_position=40, explicit_vs_generate=0.36)[0]
    same_step = triage.decide_retained_length(c, generate_position=-22, logical_position=40, explicit_vs_generate=1e-7)[0]
    not_evicted = triage.decide_retained_length(controls(), generate_position=40, logical_position=40, explicit_vs_generate=0.0)[0]
    assert [_verdict_of(h, tmp_path) for h in (at_logical, same_step, not_evicted)] == ["not_reproduced"] * 3


def test_per_layer_claim_outcomes_and_contradictions(tmp_path):
    c = controls(arg_sets=arg_sets(0.91), rebuilt_lengths=[20, 16, 12, 8])
    full = c.arg_sets[2]
    holds, why, evidence, deciding = triage.decide_per_layer(c, full, {"attention_masks": [None] * 4})
    assert holds and deciding["outcome"] == "silent_difference" and "silent difference" in why
    err = controls(arg_sets=arg_sets(rebuilt_fails=True), rebuilt_lengths=[20, 16, 12, 8])
    holds, why, evidence, _ = triage.decide_per_layer(err, err.arg_sets[2], {"stage": "integrations/sdpa_attention.py:sdpa_attention_forward", "error_layer": 1})
    assert holds and evidence["stage"].startswith("integrations/") and "layer 1" in why
    no_effect = controls(arg_sets=arg_sets(1e-7), rebuilt_lengths=[20, 16, 12, 8])
    uniform = controls(arg_sets=arg_sets(0.91), rebuilt_lengths=[20] * 4)
    for contradicting in (no_effect, uniform):
        assert _verdict_of(triage.decide_per_layer(contradicting, contradicting.arg_sets[2], {})[0], tmp_path) == "not_reproduced"


# --- loading rebuilds ----------------------------------------------------------------------------

def test_builtins_and_specs_load():
    for name in rebuilds.BUILTINS:
        assert callable(rebuilds.load(name))
    assert rebuilds.load("helpers.triage.rebuilds:int8") is rebuilds.int8
    fn = rebuilds.load(f"{EXAMPLE}:rebuild")
    assert fn.__name__ == "rebuild" and rebuilds.label(f"{EXAMPLE}:rebuild") == "rebuild"


def test_a_rebuild_from_a_file_path(tmp_path, bundle, prompt, prefix_cache):
    path = tmp_path / "mine.py"
    path.write_text("def rebuild(cache, model, prompt):\n    return cache\n")
    fn = rebuilds.load(f"{path}:rebuild")
    out = rebuilds.apply(fn, "mine", prefix_cache, bundle.model, prompt)
    assert out.cache is not prefix_cache and out.cache.get_seq_length() == prefix_cache.get_seq_length()


@pytest.mark.parametrize("spec, says", [
    ("nosuch", "no built-in of that name"),
    ("no/such/file.py:fn", "does not exist"),
    ("nosuch_package.module:fn", "cannot import 'nosuch_package.module': ModuleNotFoundError"),
    (f"{EXAMPLE}:missing", "has no attribute 'missing'"),
    ("helpers.triage.rebuilds:BUILTINS", "not callable"),
])
def test_a_rebuild_that_cannot_be_loaded_is_one_line(spec, says):
    with pytest.raises(rebuilds.RebuildError) as info:
        rebuilds.load(spec)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_rebuild_with_the_wrong_signature_or_a_syntax_error(tmp_path):
    (tmp_path / "two.py").write_text("def fn(cache, model):\n    return cache\n")
    (tmp_path / "broken.py").write_text("def fn(cache, model, prompt)\n    return cache\n")
    with pytest.raises(rebuilds.RebuildError, match="must take"):
        rebuilds.load(f"{tmp_path / 'two.py'}:fn")
    with pytest.raises(rebuilds.RebuildError, match="SyntaxError"):
        rebuilds.load(f"{tmp_path / 'broken.py'}:fn")


def test_a_rebuild_that_raises_is_one_line(tmp_path, bundle, prompt, prefix_cache):
    path = tmp_path / "bad.py"
    path.write_text("def boom(cache, model, prompt):\n    raise ValueError('needs attention scores\\nsecond line')\n")
    with pytest.raises(rebuilds.RebuildError) as info:
        rebuilds.apply(rebuilds.load(f"{path}:boom"), "boom", prefix_cache, bundle.model, prompt)
    assert str(info.value) == "rebuild 'boom' raised ValueError: needs attention scores"
    with pytest.raises(rebuilds.RebuildError, match="returned int"):
        rebuilds.apply(lambda c, m, p: 3, "three", prefix_cache, bundle.model, prompt)


# --- the built-ins on the tiny model -------------------------------------------------------------

def test_builtin_rebuilds_use_update_and_keep_what_they_say(bundle, prompt, prefix_cache):
    n = int(prefix_cache.get_seq_length())
    ident = rebuilds.apply(rebuilds.load("identity"), "identity", prefix_cache, bundle.model, prompt)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(ident.cache.layers, prefix_cache.layers))
    stream = rebuilds.apply(rebuilds.load("streaming", 4, 16), "streaming", prefix_cache, bundle.model, prompt)
    assert [l.get_seq_length() for l in stream.cache.layers] == [20] * 4 and stream.processed_length == n
    assert slots.describe(0, slots.compare(prefix_cache, stream.cache)[0]) == f"evicted: 20 slots; original 0-3, {n - 16}-{n - 1}; missing 4-{n - 17} (middle)"
    assert torch.equal(stream.cache.layers[2].keys[..., 4:, :], prefix_cache.layers[2].keys[..., -16:, :])
    per = rebuilds.apply(rebuilds.load("per_layer", 4, 16), "per_layer", prefix_cache, bundle.model, prompt)
    assert [l.get_seq_length() for l in per.cache.layers] == [4 + w for w in rebuilds.layer_windows(4, 16)] == [20, 16, 12, 8]
    q = rebuilds.apply(rebuilds.load("int8"), "int8", prefix_cache, bundle.model, prompt)
    k, kq = prefix_cache.layers[0].keys, q.cache.layers[0].keys
    bound = k.abs().amax(-1, keepdim=True) / 254 + 1e-7  # half a quantization step per token
    assert not torch.equal(k, kq) and bool(((k - kq).abs() <= bound).all())


def test_a_resume_state_dict_carries_the_logical_length(bundle, prompt, prefix_cache):
    out = rebuilds.apply(rebuilds.load(f"{EXAMPLE}:keep_recent"), "keep_recent", prefix_cache, bundle.model, prompt)
    assert out.processed_length == prefix_cache.get_seq_length() and out.cache.get_seq_length() == 32


def test_controls_on_the_tiny_model_name_the_branches(bundle, prompt):
    from helpers.triage import run as triage_run
    from helpers.triage import tables as triage_tables

    base = triage_run.prepare(bundle, prompt)
    specs = triage_run.load_specs("int8", 4, 16) | {"probe": rebuilds.load(f"{EXAMPLE}:probe_then_copy"),
                                                    "assign": rebuilds.load(f"{EXAMPLE}:assign_layers")}
    results = triage_run.triage_all(base, triage_run.apply_all(base, specs))
    assert {n: t.verdict["branch"] for n, t in results.items()} == {
        "identity": "no_defect", "int8": "reconstruction_copy", "probe": "model_side_state", "assign": "cache_metadata"}
    repaired = {n: {r["name"]: r["restores"] for r in t.verdict["repairs"]} for n, t in results.items()}
    assert repaired == {"identity": {"full_mask": True}, "int8": {"full_mask": False},
                        "probe": {"full_mask": False, "saved_state": True},
                        "assign": {"full_mask": False, "reregister_via_update": True}}
    assign = results["assign"].controls
    assert [s.reported for s in assign.rebuilt_state.layers] == [0] * 4 and assign.extra["generate_position"] == 0
    assert [s.stored for s in assign.rebuilt_state.layers] == [s.stored for s in assign.original_state.layers]
    top = results["int8"].verdict["notes"]["topk"]
    assert top["top1_kept"] and top["max_abs_diff"] > base.floor.threshold
    assert results["int8"].verdict["notes"]["localized"]["keys_differ_by"] == "content"
    assert torch.equal(compat.get_rope_state(bundle.model), base.saved_state)  # the probe's state change was undone
    steps = triage_tables.first_step_table(base, results)
    assert steps.loc[("original", "neither"), "input_ids_shape"] == [1, 0]  # the suffix was dropped (notebook 02)
    assert steps.loc[("original", "mask_only"), "attention_mask_shape"] == [1, prompt.length]


# --- end to end ----------------------------------------------------------------------------------

def _run(tmp_path: Path, monkeypatch, **params) -> tuple[execute.RunResult, dict]:
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    result = run_one(ROOT / "notebooks" / "06_rebuild_triage.ipynb", params)
    return result, json.loads((tmp_path / "results" / "06_rebuild_triage.json").read_text())


@pytest.mark.e2e
def test_notebook_06_names_the_branch_of_a_users_rebuild(tmp_path, monkeypatch):
    result, data = _run(tmp_path, monkeypatch, rebuild=f"{EXAMPLE}:assign_layers")
    assert result.ok, result.error
    assert data["measurements"]["triage"]["assign_layers"]["branch"] == "cache_metadata"
    assert data["measurements"]["triage"]["assign_layers"]["repairs"][-1]["restores"] is True
    verdicts = {c["id"]: c["verdict"] for c in data["claims"]}
    assert verdicts.pop("triage.identity_matches_original") == "reproduced"
    assert set(verdicts.values()) == {"skipped"}


def test_builtins_name_a_layer_without_kv(bundle, prompt):
    from types import SimpleNamespace

    class LinearAttentionLayer(SimpleNamespace):
        pass

    cache = SimpleNamespace(layers=[LinearAttentionLayer(keys=None, values=None)], get_seq_length=lambda: 0)
    with pytest.raises(rebuilds.RebuildError, match=r"cache layer 0 \(LinearAttentionLayer\) holds neither"):
        rebuilds.apply(rebuilds.load("identity"), "identity", cache, bundle.model, prompt)


def test_per_layer_lengths_under_eager_attention_raise_at_an_identified_stage():
    """With eager attention the mask sized from layer 0 meets a shorter layer: an error, placed by stage and layer."""
    from helpers import inputs, models
    from helpers.triage import run as triage_run
    from helpers.triage import tables as triage_tables

    bundle = models.load(models.TINY_VL, attn_implementation="eager")
    prompt = inputs.build_prompt(bundle)
    base = triage_run.prepare(bundle, prompt)
    results = triage_run.triage_all(base, triage_run.apply_all(base, triage_run.load_specs("per_layer", 4, 16)))
    t = results["per_layer"]
    holds, why, evidence, deciding = triage.decide_per_layer(t.controls, triage_tables.full_arg_set(t), triage_tables.per_layer_mechanism(t))
    assert holds and deciding["outcome"] == "error" and t.verdict["branch"] == "compression_unresolved"
    assert t.controls.extra["explicit_vs_full_forward"] is None  # the explicit step raises there too
    assert evidence["stage"].endswith("eager_attention_forward") and evidence["error_layer"] == 1
    assert evidence["attention_masks"][1][-1] == 21 and evidence["layer_lengths_at_call"] == [20, 16, 12, 8]


# --- other cache families, the reporter's input ---------------------------------------------------

@pytest.mark.parametrize("model_id", ["tiny-qwen3-sliding", "tiny-qwen3.5-hybrid"])
def test_builtins_work_on_sliding_and_hybrid_caches(model_id):
    from helpers import models
    from helpers.families import setup
    from kvresume import layers

    family = setup.text_family("x", models.load(model_id), 30, 0)
    with torch.no_grad():
        cache = family.model(**family.prefill_kwargs(), use_cache=True).past_key_values
    ident = rebuilds.apply(rebuilds.load("identity"), "identity", cache, family.model, family.prompt)
    assert layers.cache_state_equal(cache, ident.cache)
    stream = rebuilds.apply(rebuilds.load("streaming", 4, 8), "streaming", cache, family.model, family.prompt)
    for a, b in zip(cache.layers, stream.cache.layers):
        assert type(a) is type(b)
        if layers.has_linear_state(a):
            assert layers.layer_state_equal(a, b)  # linear states copied whole
        else:
            assert layers.layer_length(b) == (29 if layers.is_sliding(a) else 12)  # a sliding layer keeps its processed length
    q = rebuilds.apply(rebuilds.load("int8"), "int8", cache, family.model, family.prompt)
    assert not layers.cache_state_equal(cache, q.cache)


def test_generate_kwargs_reach_every_generate_call(bundle, prompt, monkeypatch):
    from helpers.triage import run as triage_run

    seen = []
    original = bundle.model.generate

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(bundle.model, "generate", recording)
    compat.set_rope_state(bundle.model, None)
    base = triage_run.prepare(bundle, prompt, {"repetition_penalty": 1.0})
    triage_run.triage_all(base, triage_run.apply_all(base, triage_run.load_specs("identity", 4, 16)))
    assert len(seen) >= 8 and all(k.get("repetition_penalty") == 1.0 and k["max_new_tokens"] == 1 for k in seen)


def test_prompt_text_on_tiny_models_is_bytes_and_said_so(bundle, tmp_path):
    from helpers import models
    from helpers.triage import prompts

    assert prompts.byte_ids("Hi") == [10 + 72, 10 + 105]
    prompt, how = prompts.build(bundle, "Describe the image.", "", 0)
    assert prompt.is_multimodal and prompt.input_ids[0, -19:].tolist() == prompts.byte_ids("Describe the image.")
    assert "UTF-8 bytes" in how and "not a real tokenisation" in how
    text, how = prompts.build(models.load(models.TINY_DENSE), "abc", "", 0)
    assert text.input_ids.tolist() == [[107, 108, 109]] and not text.is_multimodal
    ids = tmp_path / "ids.json"
    ids.write_text("[[5, 6, 7]]")
    p, how = prompts.build(bundle, "", str(ids), 0)
    assert p.input_ids.tolist() == [[5, 6, 7]] and "ids.json" in how
    with pytest.raises(ValueError, match="generate_kwargs may not set"):
        prompts.generate_options({"attention_mask": 1})


@pytest.mark.parametrize("args,words", [
    (["-p", "generate_kwargs", "{bad"], ["generate_kwargs is not valid JSON"]),
    (["-p", "generate_kwargs", '{"max_new_tokens": 4}'], ["may not set max_new_tokens"]),
    (["-p", "generate_kwargs", '{"colour": 1}'], ["unknown generate() argument(s) 'colour'"]),
    (["-p", "generate_kwargs", "[1, 2]"], ["must be a JSON object"]),
    (["-p", "prompt_ids", "no_such_file.json"], ["file 'no_such_file.json' does not exist"]),
    (["-p", "prompt_ids", "README.md"], ["README.md is not valid JSON"]),
    (["-p", "prompt_text", "hi", "-p", "prompt_ids", "examples/my_rebuild.py"], ["not valid JSON"]),
], ids=["bad-json", "reserved", "unknown-key", "not-object", "missing-file", "not-json-file", "both"])
def test_new_parameters_are_refused_before_any_kernel(tmp_path, args, words):
    import subprocess
    import sys

    env = {**__import__("os").environ, "KVKIT_OUTPUT_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "helpers.pipeline.run", "run", "06", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("refused: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "notebooks").exists()  # nothing started


def test_prompt_text_and_prompt_ids_together_are_refused(tmp_path):
    from helpers.pipeline.run import params

    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, 3]")
    with pytest.raises(params.ParameterError, match="prompt_text and prompt_ids given together"):
        params.check([ROOT / "notebooks" / "06_rebuild_triage.ipynb"], {"prompt_text": "hi", "prompt_ids": str(ids)})


def test_per_layer_backend_prediction_and_its_contradictions():
    silent = {"ok": True, "max_abs_diff_vs_original": 0.9, "stage": ""}
    raised = {"ok": False, "error_type": "RuntimeError", "stage": "models/x/modeling_x.py:eager_attention_forward"}
    assert triage.decide_per_layer_backends({"sdpa": silent, "eager": raised}, FLOOR)[0]
    same = {"ok": True, "max_abs_diff_vs_original": 1e-7, "stage": ""}
    assert not triage.decide_per_layer_backends({"sdpa": same, "eager": raised}, FLOOR)[0]  # sdpa did not differ
    assert not triage.decide_per_layer_backends({"sdpa": silent, "eager": silent}, FLOOR)[0]  # eager did not raise
    elsewhere = {**raised, "stage": "generation/utils.py:_prepare_cache"}
    holds, why, _, deciding = triage.decide_per_layer_backends({"sdpa": silent, "eager": elsewhere}, FLOOR)
    assert not holds and deciding["eager_outcome"] == "error_elsewhere" and "predicted error" in why
