"""The helpers behind notebooks 03 (model-side position state) and 04 (token boundary)."""
from __future__ import annotations

import pytest
import torch

from helpers import compare, continuation, inputs, models
from helpers.boundary import decisions as boundary_decisions, splits as boundary_splits
from helpers.rope import decisions as rope_decisions, perturbation as rope_perturbation

from kvresume import compat


@pytest.fixture()
def saved(bundle, prefix_cache) -> torch.Tensor:
    return compat.get_rope_state(bundle.model).clone()


def test_state_is_outside_the_cache(prefix_cache, saved):
    assert saved.flatten().tolist() == [-42]
    assert rope_perturbation.cache_mentions_state(prefix_cache, saved)["matches"] == []


def test_continuation_puts_the_state_back(bundle, prompt, prefix_cache, saved):
    out = rope_perturbation.continue_with_state(bundle.model, prompt, prefix_cache, None)  # generate() writes zeros here
    assert out.ok and torch.equal(compat.get_rope_state(bundle.model), saved)


def test_perturbations_as_the_seed_describes(bundle, prompt, prefix_cache, saved):
    table, reference = rope_perturbation.perturbation_table(bundle.model, prompt, prefix_cache, saved)
    assert table.loc["saved", "bitwise_equal"]
    assert table.loc["None", "max_abs_diff"] == table.loc["0", "max_abs_diff"]
    assert table.loc["None", "max_abs_diff"] > table.loc["saved + 1", "max_abs_diff"] > 0
    assert rope_perturbation.none_vs_zero(bundle.model, prompt, prefix_cache, saved)["bitwise_equal"]
    sweep = rope_perturbation.offset_sweep(bundle.model, prompt, prefix_cache, saved, reference, [-1, 0, 1])
    assert sweep.offset.tolist() == [-1, 0, 1] and sweep.set_index("offset").loc[0, "bitwise_equal"]


def test_fresh_instance_diverges_and_restored_matches(bundle, prompt, prefix_cache, saved, tmp_path):
    from kvresume import state as resume

    _, reference = rope_perturbation.perturbation_table(bundle.model, prompt, prefix_cache, saved)
    state = resume.capture(bundle.model, prefix_cache, prompt.last_token, prompt.attention_mask)
    table, info = rope_perturbation.instance_branch(bundle.fresh_instance(), state, prompt, prefix_cache, reference, tmp_path)
    bare, restored = table.iloc[0], table.iloc[1]
    assert bare.max_abs_diff > 1e-2 and restored.bitwise_equal
    floor = compare.noise_floor(reference, [reference], torch.float32)
    assert rope_decisions.decide_fresh_instance_diverges(dict(bare), floor).holds
    assert rope_decisions.decide_restored_state_matches(dict(restored), floor).holds
    assert info["fresh_state_before"] is None and info["restored_state"] == [-42] and info["mask_length"] == 82


def test_offset_widget_builds_without_a_frontend(bundle, prompt, prefix_cache, saved):
    pytest.importorskip("ipywidgets")
    states, reference = rope_perturbation.perturbation_table(bundle.model, prompt, prefix_cache, saved)
    widget = rope_perturbation.offset_widget(bundle.model, prompt, prefix_cache, saved, reference, -2, 2)
    slider = widget.children[0]
    assert (slider.description, slider.min, slider.max, slider.value) == ("offset", -2, 2, 0)
    widget.update()  # what a frontend does on display; headless, the result is still computed
    at_zero = widget.result
    assert list(at_zero.index) == ["saved +0"] and at_zero.iloc[0].max_abs_diff == 0 and at_zero.iloc[0].bitwise_equal
    slider.value = 1  # moving the slider re-runs the continuation with the shifted state
    moved = widget.result
    assert list(moved.index) == ["saved +1"]
    assert moved.iloc[0].max_abs_diff == pytest.approx(states.loc["saved + 1"].max_abs_diff)
    assert moved.iloc[0].max_abs_diff > 0


def _check_boundary(model, prompt):
    reference, runs, info = boundary_splits.run_all(model, prompt)
    table = boundary_splits.table(reference, runs)
    other, _ = continuation.other_attention_logits(model, prompt)
    floor = compare.noise_floor(reference, [other], torch.float32, what="sdpa vs eager")
    valid = table[table.boundary == "valid split"].iloc[0]
    assert boundary_decisions.decide_valid_split_matches(valid.to_dict(), floor).holds
    double = table[table.boundary == "double processing"]
    failed = double[double.result == "failed"]
    assert set(failed.args) == {"no mask"} and set(failed.call) == {"generate"}
    assert failed.input_ids_shape.map(tuple).tolist() == [(1, 0), (1, 0)]  # the suffix was sliced away (notebook 02)
    assert (double[double.result == "worked"].max_abs_diff > 1e-3).all()
    same = boundary_splits.rebuilt_vs_original(runs)
    assert same.same_status.all() and same.logits_bitwise_equal.dropna().astype(bool).all()
    assert info["full_cache_length"] == prompt.length == info["prefix_cache_length"] + 1
    assert info["rebuilt_kv_bitwise_equal"] and not info["rebuilt_shares_storage"]
    return info


def test_boundary_on_qwen3_vl(bundle, prompt):
    info = _check_boundary(bundle.model, prompt)
    assert info["rope_state_after_full_prefill"] == info["rope_state_after_prefix_prefill"] == [-42]
    assert info["explicit_positions"] == [prompt.length - 1 - 42] * 3


def test_boundary_on_a_text_only_model():
    lm = models.build_tiny_qwen3(0)
    bundle = models.ModelBundle(lm, "text-lm", None, torch.float32, "sdpa", "cpu", 0, False)
    prompt = inputs.build_prompt(bundle)
    assert not rope_perturbation.has_state(lm)
    info = _check_boundary(lm, prompt)
    assert info["rope_state_after_full_prefill"] is None and info["explicit_positions"] == [prompt.length - 1]


def test_no_fixed_tolerance_table_is_left():
    assert not any(hasattr(m, name) for m in (boundary_splits, boundary_decisions) for name in ("TOLERANCE", "tolerance"))
