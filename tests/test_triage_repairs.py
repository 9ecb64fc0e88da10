"""Notebook 06's repairs on the tiny model: each restores a case built to need it and fails to restore a wrong one;
the copy localization (first layer/slot, keys or values, rotation or content) and the top-k check."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import rotate_half

from kvresume import compat
import copy

from helpers.triage import controls, rebuilds, repairs, slots
from helpers.triage import run as triage_run
from helpers.triage.facts import slot_kind, slot_verdict
from helpers.triage.walk import AT_PROCESSED, CROP, FULL_MASK, REFEED, REREGISTER, SAVED_STATE

EXAMPLE = "examples/my_rebuild.py"


@pytest.fixture(scope="module")
def base(bundle, prompt):
    compat.set_rope_state(bundle.model, None)
    return triage_run.prepare(bundle, prompt)


def assigned(cache, model, transform=lambda x: x):
    """The assignment rebuild of examples/my_rebuild.py, K/V through `transform` (identity: the example itself)."""
    new = DynamicCache(config=model.config.get_text_config(decoder=True))
    for layer, old in zip(new.layers, cache.layers):
        layer.keys, layer.values = transform(old.keys).clone(), transform(old.values).clone()
    return new


def repaired(base, cache, state_after=None, kind: str = "same") -> dict:
    """Every repair of `cache` (`kind`: the slot verdict), generate()'s own step (full mask) as the unrepaired one."""
    state = base.saved_state if state_after is None else state_after
    compat.put_rope_state(base.model, state)
    full = controls.generate_step(base.model, base.prompt, cache, {},
                                  attention_mask=controls.full_mask(base.prompt, int(cache.get_seq_length())))
    out = repairs.run_all(base, cache, {"full": full, "resumed": full}, state, slots=kind)
    compat.put_rope_state(base.model, base.saved_state)
    return out


def restores(base, cache, name, state_after=None) -> bool:
    return repaired(base, cache, state_after)[name].restores(base.floor)


def test_full_mask_restores_the_identity_rebuild_not_int8(base):
    assert restores(base, rebuilds.identity(base.prefix_cache, base.model, None), FULL_MASK)
    assert not restores(base, rebuilds.int8(base.prefix_cache, base.model, None), FULL_MASK)


def test_reregistering_restores_the_assignment_rebuild_not_an_assigned_int8_copy(base):
    cache = assigned(base.prefix_cache, base.model)
    assert cache.get_seq_length() == 0 and not restores(base, cache, FULL_MASK)  # the rebuild, unrepaired
    out = repaired(base, cache)
    assert out[REREGISTER].restores(base.floor) and out[REREGISTER].max_abs_diff <= base.floor.threshold
    wrong = assigned(base.prefix_cache, base.model, rebuilds._int8_roundtrip)
    assert not restores(base, wrong, REREGISTER)


def test_the_saved_state_restores_a_probe_that_moved_it_not_an_eviction(base):
    probe = rebuilds.load(f"{EXAMPLE}:probe_then_copy")
    compat.put_rope_state(base.model, base.saved_state)
    cache = probe(base.prefix_cache, base.model, base.prompt)
    after = compat.get_rope_state(base.model).clone()
    assert not torch.equal(after, base.saved_state)
    out = repaired(base, cache, after)
    assert not out[FULL_MASK].restores(base.floor) and out[SAVED_STATE].restores(base.floor)
    evicted = rebuilds.streaming(base.prefix_cache, base.model, None).cache
    assert not restores(base, evicted, SAVED_STATE)


def test_continuing_at_the_processed_length_restores_a_full_cache_and_removes_an_evictions_position_defect(base):
    assert restores(base, rebuilds.identity(base.prefix_cache, base.model, None), AT_PROCESSED)
    out = repaired(base, rebuilds.streaming(base.prefix_cache, base.model, None).cache)
    fix = out[AT_PROCESSED]
    assert not fix.restores(base.floor) and base.floor.differs(fix.vs_unrepaired)  # positions moved, loss remains


def test_the_refeed_restores_an_exact_prefix_one_short_not_a_cache_missing_its_first_slot(base):
    """copy.deepcopy + crop(n - 1) (what crop_short builds, bitwise): the whole ids re-feed the missing token; the same
    lengths with the first slot evicted do not restore."""
    short = copy.deepcopy(base.prefix_cache)
    short.crop(-1)  # drop one token (a negative count: the same on every 5.x)
    built = rebuilds.crop_short(base.prefix_cache, base.model, base.prompt)
    assert slots.compare(short, built) == slots.compare(short, short) and slot_verdict(slots.compare(base.prefix_cache, short)) == "prefix_short"
    assert repaired(base, short, kind="prefix_short")[REFEED].restores(base.floor)
    first = rebuilds._rebuild(base.prefix_cache, base.model, lambda _i, k, v: [(k[..., 1:, :].clone(), v[..., 1:, :].clone())])
    assert slot_verdict(slots.compare(base.prefix_cache, first)) == "evicted"
    n = base.prompt.processed  # control 0's cells: the same lengths, told apart by which slot is missing
    assert slots.described(base.prefix_cache, short)[0] == f"prefix_short: {n - 1} slots; original 0-{n - 2}; missing {n - 1} (last)"
    assert slots.described(base.prefix_cache, first)[0] == f"evicted: {n - 1} slots; original 1-{n - 1}; missing 0 (first)"
    assert not repaired(base, first, kind="prefix_short")[REFEED].restores(base.floor)


def test_the_crop_restores_a_reused_cache_not_one_whose_shared_slots_changed(base):
    reused = rebuilds.reused_no_copy(copy.deepcopy(base.prefix_cache), base.model, base.prompt)
    compat.put_rope_state(base.model, base.saved_state)
    matched = slots.compare(base.prefix_cache, reused)
    assert slot_verdict(matched) == "extra" and len(matched[0].matches) == base.prompt.processed + 5
    assert "5 slots no original slot holds" in slots.describe(0, matched[0])
    assert repaired(base, reused, kind="extra")[CROP].restores(base.floor)
    wrong = rebuilds.int8(reused, base.model, None)
    assert slot_verdict(slots.compare(base.prefix_cache, wrong)) == "content"
    assert not repaired(base, wrong, kind="extra")[CROP].restores(base.floor)


def test_the_slot_comparison_names_exchanged_layers_and_which_slots_are_missing(base):
    pairs = [(layer.keys, layer.values) for layer in base.prefix_cache.layers]
    swapped = DynamicCache(config=base.model.config.get_text_config(decoder=True))
    for i, (k, v) in enumerate([pairs[1], pairs[0], *pairs[2:]]):
        swapped.update(k.clone(), v.clone(), i)
    matched = slots.compare(base.prefix_cache, swapped)
    assert [slot_kind(i, s) for i, s in enumerate(matched)] == ["exchanged", "exchanged", "same", "same"]
    assert "holds layer 1's slots" in slots.describe(0, matched[0])
    evicted = slots.compare(base.prefix_cache, rebuilds.streaming(base.prefix_cache, base.model, None).cache)
    assert slots.describe(0, evicted[0]).endswith("missing 4-64 (middle)")
    assert slots.where([0, 1, 40, 80], 81) == ["first", "middle", "last"] and slots.where([80], 81) == ["last"]
    assert slots.where(list(range(81)), 81) == ["all"] and slots.where([0], 81) == ["first"]


def test_a_repair_that_raises_is_recorded_with_its_stage(bundle, prompt):
    from helpers import inputs, models

    eager = models.load(models.TINY_VL, attn_implementation="eager")
    b = triage_run.prepare(eager, inputs.build_prompt(eager))
    out = repaired(b, rebuilds.per_layer(b.prefix_cache, b.model, None).cache)
    assert not out[AT_PROCESSED].ok and out[AT_PROCESSED].error.endswith("eager_attention_forward")
    assert out[AT_PROCESSED].record(b.floor) == {"name": AT_PROCESSED, "max_abs_diff": None, "restores": False,
                                                 "error": out[AT_PROCESSED].error}


def _rotated(keys: torch.Tensor, delta: float) -> torch.Tensor:
    """RoPE applied again at `delta` more positions (transformers' rotate_half layout)."""
    d = keys.shape[-1]
    theta = delta / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    cos, sin = torch.cat([theta.cos(), theta.cos()]), torch.cat([theta.sin(), theta.sin()])
    return (keys * cos + rotate_half(keys) * sin).to(keys.dtype)


def _copy(cache, change) -> DynamicCache:
    new = DynamicCache()
    for i, layer in enumerate(cache.layers):
        k, v = change(i, layer.keys.clone(), layer.values.clone())
        new.update(k, v, i)
    return new


def test_localize_tells_rotation_from_content_and_finds_the_first_slot(prefix_cache):
    def rotate_from_slot_5_of_layer_2(i, k, v):
        if i == 2:
            k[..., 5:, :] = _rotated(k[..., 5:, :], 3.0)
        return k, v
    loc = repairs.localize(prefix_cache, _copy(prefix_cache, rotate_from_slot_5_of_layer_2))
    assert (loc["layer"], loc["slot"], loc["differs_in"]) == (2, 5, "keys")
    assert loc["keys_differ_by"].startswith("rotation only") and loc["values_max_abs_diff"] == 0.0
    quantized = repairs.localize(prefix_cache, _copy(prefix_cache, lambda i, k, v: (rebuilds._int8_roundtrip(k), v)))
    assert quantized["keys_differ_by"] == "content" and quantized["pair_norm_max_gap"] > quantized["pair_norm_tolerance"]

    def values_of_layer_1(i, k, v):
        if i == 1:
            v[..., 7, :] += 1.0
        return k, v
    loc = repairs.localize(prefix_cache, _copy(prefix_cache, values_of_layer_1))
    assert (loc["layer"], loc["slot"], loc["differs_in"]) == (1, 7, "values") and "keys_differ_by" not in loc
    assert repairs.localize(prefix_cache, _copy(prefix_cache, lambda i, k, v: (k, v))) == {}
    longer = _copy(prefix_cache, lambda i, k, v: (torch.cat([k, k[..., -1:, :]], -2), torch.cat([v, v[..., -1:, :]], -2)))
    assert repairs.localize(prefix_cache, longer) == {}, "a shape change is the slot comparison's to name"
    assert slot_kind(0, slots.compare(prefix_cache, longer)[0]) == "repeated"


def test_topk_kept_against_the_floor(base):
    ref = base.reference
    same = repairs.topk_kept(ref, controls.Step(True, ref.clone()), base.floor)
    assert same["top1_kept"] and same["top5_kept"] and same["max_abs_diff"] == 0.0
    swapped = ref.clone()
    top = swapped[0].topk(2).indices
    swapped[0, top[0]], swapped[0, top[1]] = ref[0, top[1]], ref[0, top[0]]
    out = repairs.topk_kept(ref, controls.Step(True, swapped), base.floor)
    assert not out["top1_kept"] and out["top5_kept"] and out["times_threshold"] > 1
    assert repairs.topk_kept(ref, controls.Step(False, error_type="E", stage="s"), base.floor) == {"ran": False, "error": "E at s"}
