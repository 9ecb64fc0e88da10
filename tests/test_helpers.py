"""Unit tests for the foundation helpers on the installed release."""
from __future__ import annotations

import json
import logging
import time
import warnings

import pytest
import torch
from transformers import DynamicCache

from helpers import caches, compare, continuation, models, results
from helpers.mask_matrix import decisions as matrix_decisions, tables as matrix_tables

from kvresume import compat
from helpers.continuation import IN_FIRST_CALL, trace


def test_tiny_model_is_deterministic_and_sized_as_the_seed(bundle, prompt):
    other = models.TINY_MODELS[models.TINY_VL](0, "sdpa")
    for (name, a), (_, b) in zip(bundle.model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    assert prompt.length == 82  # 12 text + 51 image block + 19 text: the control's full length
    assert int(prompt.mm_kwargs["image_grid_thw"].prod()) // 4 == 49


def test_prefill_sets_the_seeds_rope_deltas(bundle, prefix_cache):
    assert compat.get_rope_state(bundle.model).flatten().tolist() == [-42]
    assert prefix_cache.get_seq_length() == 81  # the control's cached prefix


def test_variants_are_built_the_way_their_names_say(bundle, prefix_cache, monkeypatch):
    calls = []
    original_update = DynamicCache.update

    def spy(self, keys, values, layer_idx, *args, **kwargs):
        calls.append((id(self), layer_idx))
        return original_update(self, keys, values, layer_idx, *args, **kwargs)

    monkeypatch.setattr(DynamicCache, "update", spy)
    variants = caches.build_variants(prefix_cache, bundle.model.config)
    n = len(compat.cache_layers(prefix_cache))
    assert variants["original"].cache is not prefix_cache
    assert [i for c, i in calls if c == id(variants["rebuilt_update"].cache)] == list(range(n))
    assert [i for c, i in calls if c == id(variants["rebuilt_config"].cache)] == list(range(n))
    assert not [i for c, i in calls if c == id(variants["original"].cache)]
    assert variants["rebuilt_config"].cache.layer_class_to_replicate is None  # config-aware: layers pre-created
    assert variants["rebuilt_update"].cache.layer_class_to_replicate is not None
    if compat.has_tensor_data_constructor():
        assert caches.kv_bitwise_equal(variants["rebuilt_ctor"].cache, prefix_cache)
    for v in variants.values():
        assert caches.describe(v.cache)["seq_length"] == 81


def test_kv_pairs_are_copies(prefix_cache):
    pairs = caches.kv_pairs(prefix_cache)
    keys, _ = compat.layer_kv(compat.cache_layers(prefix_cache)[0])
    assert pairs[0][0].data_ptr() != keys.data_ptr()
    pairs[0][0].add_(1)
    assert not caches.kv_bitwise_equal(compat.cache_from_pairs(compat.kv_pairs(prefix_cache)), DynamicCache())


def test_bitwise_equality_detects_a_single_changed_value(prefix_cache):
    rebuilt = compat.cache_from_pairs(compat.kv_pairs(prefix_cache))
    assert caches.kv_bitwise_equal(rebuilt, prefix_cache)
    keys, _ = compat.layer_kv(compat.cache_layers(rebuilt)[-1])
    keys[0, 0, -1, 0] += 1e-3
    assert not caches.kv_bitwise_equal(rebuilt, prefix_cache)


def test_logit_metrics():
    a = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    same = compare.logit_metrics(a, a.clone())
    assert same["bitwise_equal"] and same["max_abs_diff"] == 0.0 and same["top5_overlap"] == 5
    b = a.clone()
    b[0, 0] = 10.0
    diff = compare.logit_metrics(a, b)
    assert diff["max_abs_diff"] == 10.0 and not diff["top1_equal"] and diff["top1"] == 0 and diff["cosine"] < 1
    with pytest.raises(ValueError):
        compare.logit_metrics(a, a[:, :3])


def test_first_call_capture_sees_the_empty_suffix(bundle, prompt, prefix_cache):
    out = continuation.generate_first_step(bundle.model, prompt.last_token, prefix_cache)
    assert not out.ok and out.error_type
    assert out.first_call["input_ids_shape"] == [1, 0]
    assert out.first_call["past_length"] == 81
    assert out.stage == IN_FIRST_CALL and out.raised_at


def test_trace_hooks_are_removed(bundle, prompt):
    with trace(bundle.model) as record:
        pass
    assert record.started == 0 and not bundle.model._forward_pre_hooks and not bundle.model._forward_hooks
    assert not any(m._forward_pre_hooks for m in bundle.model.modules())


def test_forward_quirk_captures_the_positions_it_computed(bundle, prompt, prefix_cache):
    variant = caches.Variant("original", "copy", prefix_cache)
    positions = continuation.current_position_ids(bundle.model, prompt)
    runs = matrix_tables.forward_quirk_outcomes(bundle.model, prompt, variant, positions)
    plain, sliced, gen = (runs[k] for k in matrix_tables.QUIRK_CALLS)
    assert not plain.ok and plain.stage == IN_FIRST_CALL and plain.rotary_position_shapes == [[3, 1, 82]]
    assert sliced.ok and sliced.rotary_position_shapes == [[3, 1, 1]] and gen.ok
    assert matrix_decisions.decide_forward_needs_positions(runs, 1, 82).holds


def test_rebuilt_caches_do_not_alias_the_original(prefix_cache):
    assert not caches.shares_storage(compat.cache_from_pairs(compat.kv_pairs(prefix_cache)), prefix_cache)
    aliased = compat.cache_from_pairs(compat.kv_pairs(prefix_cache))  # update() concatenates, so alias by hand
    for mine, theirs in zip(compat.cache_layers(aliased), compat.cache_layers(prefix_cache)):
        mine.keys, mine.values = theirs.keys[:, :, 1:], theirs.values  # a view into the original's storage
    assert caches.shares_storage(aliased, prefix_cache)
    for layer in compat.cache_layers(aliased):
        layer.keys = layer.keys.clone()
    assert caches.shares_storage(aliased, prefix_cache)  # the values still alias
    for layer in compat.cache_layers(aliased):
        layer.values = layer.values.clone()
    assert not caches.shares_storage(aliased, prefix_cache)


def test_greedy_step_ignores_a_checkpoints_sampling_settings(bundle, prompt, prefix_cache, tmp_path, monkeypatch):
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    GenerationConfig(do_sample=True, top_k=20, top_p=0.8, temperature=0.7).save_pretrained(tmp_path)
    monkeypatch.setattr(bundle.model, "generation_config", GenerationConfig.from_pretrained(tmp_path))
    merged, _ = bundle.model._prepare_generation_config(continuation.greedy_config(bundle.model))
    assert merged.do_sample is False and (merged.top_k, merged.top_p, merged.temperature) == (50, 1.0, 1.0)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    hf_logging.get_logger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = continuation.generate_first_step(bundle.model, prompt.last_token, prefix_cache, attention_mask=prompt.attention_mask)
    finally:
        hf_logging.get_logger("transformers").removeHandler(handler)
    assert out.ok and not [r.getMessage() for r in records]


def test_full_mask_continuation_matches_full_forward(bundle, prompt, prefix_cache):
    full, _ = continuation.prefill(bundle.model, prompt, end=None)
    out = continuation.generate_first_step(bundle.model, prompt.last_token, prefix_cache, attention_mask=prompt.attention_mask)
    assert out.ok and out.first_call["input_ids_shape"] == [1, 1]
    other, kernel = continuation.other_attention_logits(bundle.model, prompt)
    floor = compare.noise_floor(full, [other], bundle.dtype, what=f"sdpa vs {kernel}")
    assert kernel == "eager" and bundle.model.config._attn_implementation == "sdpa"
    assert floor.matches(compare.max_abs_diff(full, out.logits))


def test_compat_layer_on_installed_release(bundle, prefix_cache):
    info = compat.describe_release()
    assert info["transformers"] == compat.TRANSFORMERS_VERSION
    assert compat.cache_kwarg(bundle.model) in ("past_key_values", "cache")
    assert compat.generate_cache_kwarg(bundle.model) in ("past_key_values", "cache")
    assert compat.rope_state_owner(bundle.model) is bundle.model.model
    assert compat.text_config(bundle.model.config).num_hidden_layers == 4
    keys, values = compat.layer_kv(compat.cache_layers(prefix_cache)[0])
    assert keys.shape == values.shape and keys.shape[-2] == 81
    assert compat.image_processor_class().__name__.startswith("Qwen2VLImageProcessor")
    compat.set_rope_state(bundle.model, torch.tensor([[5]]))
    assert compat.get_rope_state(bundle.model).item() == 5


def test_bad_model_id_fails_fast_with_one_clear_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(models.ModelUnavailableError) as err:
        models.load("no-such-org/no-such-model")
    assert time.perf_counter() - start < 10
    assert "tiny-qwen3-vl" in str(err.value) and "no-such-org/no-such-model" in str(err.value)
    assert err.value.__cause__ is None
    with pytest.raises(models.ModelUnavailableError):
        models.load("tiny-not-a-model")


def test_unreachable_hub_is_detected_quickly(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    start = time.perf_counter()
    with pytest.raises(models.ModelUnavailableError, match="not reachable"):
        models.load("Qwen/Qwen3-VL-2B-Instruct", revision="89644892e4d85e24eaac8bacfd4f463576704203")
    assert time.perf_counter() - start < 10


def test_real_loading_code_on_a_local_checkpoint(tmp_path, bundle):
    bundle.model.save_pretrained(tmp_path / "vl")
    loaded = models.load(str(tmp_path / "vl"))
    assert loaded.is_multimodal and not loaded.is_tiny and loaded.processor is not None
    for a, b in zip(bundle.model.state_dict().values(), loaded.model.state_dict().values()):
        assert torch.equal(a, b)
    assert loaded.environment()["model_id"].endswith("vl")  # no absolute machine path in what a user shares


def test_results_file_is_written_at_start_and_after_each_decision(tmp_path):
    path = tmp_path / "r.json"
    res = results.Results("nb", {"a": "A holds", "b": "B holds"}, path=path)
    data = results.load(path)
    assert [c["verdict"] for c in data["claims"]] == ["error", "error"]
    res.decide("a", torch.tensor(True).item(), {"x": torch.tensor([1.5])})
    res.decide("b", False, {"y": float("nan")})
    data = json.loads(path.read_text())
    assert [c["verdict"] for c in data["claims"]] == ["reproduced", "not_reproduced"]
    assert data["claims"][0]["evidence"] == {"x": [1.5]} and data["claims"][1]["evidence"] == {"y": None}
    with res.guard("a"):
        raise RuntimeError("boom")
    assert results.load(path)["claims"][0]["verdict"] == "reproduced"  # a decided claim is not overwritten
    res2 = results.Results("nb", {"c": "C"}, path=tmp_path / "r2.json")
    with res2.guard("c"):
        raise RuntimeError("boom")
    assert results.load(tmp_path / "r2.json")["claims"][0]["verdict"] == "error"
    with pytest.raises(KeyError):
        res.decide("zzz", True, {})
