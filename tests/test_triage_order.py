"""Notebook 06 on score-ordered slots: a cache holding a subset of the original's slots in another order (a press
that gathers its kept slots by top-k score) is an eviction. The order is shown harmless by the repair that puts the
slots back in position order (it must leave generate()'s step within the floor), and the positions cause is named
when continuing at the processed length moves the step. Each decision with its contradicting case, then two kvpress
presses rebuilt (examples/kvpress_presses.py; kvpress itself: test_triage_kvpress.py) on the tiny Qwen3-VL."""
from __future__ import annotations

import copy
import runpy
from typing import Any

import pytest
import torch
from test_kill_tree import ABOVE, T, ctl, layer_states, sets

from helpers.pipeline.paths import repo_root
from helpers.triage import rebuilds, repairs, slots, tree
from helpers.triage import run as triage_run
from kvresume import compat

KEPT = [*range(4), *range(81, 45, -1)]  # score order: the sinks, then the recent slots newest first (40 of 82)


def _layers(kept: list[int], n: int = 82, heads: list[list[int]] | None = None) -> list[tree.SlotLayer]:
    matches = [None] * len(kept) if heads else [(0, k) for k in kept]
    return [tree.SlotLayer(n, [m if m is None else (i, m[1]) for m in matches], heads=heads) for i in range(4)]


def _ctl(kept: list[int], order_vs: float | None, at_vs: float = 0.34, **kw: Any) -> tree.Controls:
    fixes = {"full_mask": tree.Repair("full_mask", 0.6, True, "", 0.0),
             "continue_at_processed_length": tree.Repair("continue_at_processed_length", 0.54, True, "", at_vs)}
    if order_vs is not None:
        fixes["position_order"] = tree.Repair("position_order", 0.6, True, "", order_vs)
    return ctl(arg_sets=sets(0.6), rebuilt_lengths=[40] * 4, slots=_layers(kept, **kw), repairs=fixes,
               original_state=layer_states([82] * 4), rebuilt_state=layer_states([40] * 4),
               extra={"generate_position": -2, "logical_position": 39})


def _path(c: tree.Controls) -> list[tuple[str, bool]]:
    return [(d["node"], d["answer"]) for d in tree.choose_branch(c)["path"]]


def test_a_subset_out_of_position_order_is_an_eviction_whose_positions_cause_is_named():
    v = tree.choose_branch(_ctl(KEPT, order_vs=T))
    assert v["branch"] == "compression_positions_and_loss"
    steps = {d["node"]: d for d in v["path"]}
    assert steps["compressed"]["numbers"]["slots"] == "reordered" and steps["order_harmless"]["answer"]
    assert steps["order_harmless"]["numbers"]["position_order_vs_generate"] == T
    assert [r["name"] for r in v["repairs"]] == ["full_mask", "position_order", "continue_at_processed_length"]
    assert "kv_differ" not in steps
    same_leaf = _ctl(sorted(KEPT), order_vs=None)  # the same eviction in position order: no order question asked
    assert tree.choose_branch(same_leaf)["branch"] == "compression_positions_and_loss"
    assert "order_harmless" not in dict(_path(same_leaf))
    assert tree.choose_branch(_ctl(KEPT, order_vs=T, at_vs=T))["branch"] == "compression_information_loss", \
        "continuing at the processed length changes nothing: no positions cause"


def test_an_order_that_changes_the_step_or_was_not_measured_is_not_called_harmless():
    assert _path(_ctl(KEPT, order_vs=ABOVE))[-2:] == [("order_harmless", False), ("kv_differ", True)]
    assert tree.choose_branch(_ctl(KEPT, order_vs=ABOVE))["branch"] == "reconstruction_copy"
    assert tree.choose_branch(_ctl(KEPT, order_vs=None))["branch"] == "reconstruction_copy", "not run: not shown"
    repeated = [*KEPT[:-1], KEPT[0]]
    assert tree.slot_kind(0, _layers(repeated)[0]) == "repeated"
    assert tree.choose_branch(_ctl(repeated, order_vs=T))["branch"] == "reconstruction_copy", "a slot stored twice"


def test_each_kv_head_keeping_its_own_slots_is_decided_per_head():
    heads = [[0, 1, 2, *range(81, 44, -1)], [*range(80, 41, -1), 3]]
    c = _ctl([0] * 40, order_vs=T, heads=heads)
    assert tree.slot_verdict(c.slots) == "reordered" and tree.choose_branch(c)["branch"] == "compression_positions_and_loss"
    ordered = _ctl([0] * 40, order_vs=None, heads=[sorted(h) for h in heads])
    assert tree.slot_verdict(ordered.slots) == "evicted"


# --------------------------------------------------------------------------- measured on the tiny Qwen3-VL

PRESSES = ("examples/kvpress_presses.py:streaming_llm", "examples/kvpress_presses.py:knorm")


@pytest.fixture(scope="module")
def measured(bundle, prompt) -> dict[str, Any]:
    compat.set_rope_state(bundle.model, None)
    base = triage_run.prepare(bundle, prompt)
    specs = {"identity": rebuilds.load("identity"), **{rebuilds.label(s): rebuilds.load(s, 4, 16) for s in PRESSES}}
    return {"base": base, **{k: r.verdict for k, r in triage_run.triage_all(base, triage_run.apply_all(base, specs)).items()}}


@pytest.mark.parametrize("spec", PRESSES)
def test_kvpress_presses_land_on_an_eviction_with_its_positions_cause(measured, spec):
    assert_eviction_with_positions_cause(measured[rebuilds.label(spec)], measured["base"].floor)


def assert_eviction_with_positions_cause(v: dict[str, Any], floor: Any) -> None:
    """A score-ordered press (4 layers of 40 kept slots) on 06: the eviction's order harmless, the positions cause named."""
    steps = {d["node"]: d["numbers"] for d in v["path"]}
    assert v["branch"] == "compression_positions_and_loss", v["branch"]
    assert steps["compressed"]["slots"] == "reordered" and steps["compressed"]["stored_slots"] == [40] * 4
    assert floor.matches(steps["order_harmless"]["position_order_vs_generate"]), "putting them in order changes nothing"
    assert steps["positions_restore"]["generate_position"] != steps["positions_restore"]["logical_position"]
    assert floor.differs(steps["positions_and_loss"]["repaired_vs_generate"]), "the processed length moves the step"


def test_the_position_order_repair_keeps_every_slot_and_orders_them(prefix_cache):
    knorm = runpy.run_path(str(repo_root() / PRESSES[1].split(":")[0]))["knorm"]
    pressed = knorm(copy.deepcopy(prefix_cache), None, None)
    ordered = repairs.in_position_order(pressed, prefix_cache)
    for i, (a, b, o) in enumerate(zip(*(compat.cache_layers(c) for c in (pressed, ordered, prefix_cache)))):
        s = slots.compare(prefix_cache, ordered)[i]
        assert tree.slot_kind(i, s) == "evicted", "the same slots, now in position order"
        assert torch.equal(a.keys.sort(dim=2).values, b.keys.sort(dim=2).values), "nothing added or lost"
        keep = torch.tensor(s.heads)  # per head, the original slots in order
        assert torch.equal(b.keys, o.keys.gather(2, keep[None, :, :, None].expand(1, -1, -1, o.keys.shape[-1])))
