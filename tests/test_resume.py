"""The resume-state object: file round trip, restore into a fresh instance, and every validation error."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers import caches, compare, continuation

from kvresume import compat, state as resume


@pytest.fixture()
def state(bundle, prompt, prefix_cache) -> resume.ResumeState:
    return resume.capture(bundle.model, prefix_cache, prompt.last_token, prompt.attention_mask)


def test_capture_records_what_a_continuation_needs(state, prompt):
    assert state.processed_length == prompt.length - 1 == 81
    assert state.suffix_length == 1 and state.batch_size == 1 and state.n_layers == 4
    assert state.attention_mask.shape[1] == state.processed_length + state.suffix_length
    assert state.model_metadata[resume.ROPE_KEY].flatten().tolist() == [-42]
    assert torch.equal(state.generate_kwargs()["input_ids"], prompt.last_token)


def test_round_trip_through_safetensors_and_json(state, tmp_path):
    back = resume.round_trip(state, tmp_path / "s")
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted([resume.TENSOR_FILE, resume.JSON_FILE])
    doc = json.loads((tmp_path / "s" / resume.JSON_FILE).read_text())
    assert doc["processed_length"] == 81 and doc["model_metadata"] == {resume.ROPE_KEY: "tensor"}
    assert back.processed_length == state.processed_length and back.info == state.info
    for (k1, v1), (k2, v2) in zip(state.kv, back.kv):
        assert compare.tensors_bitwise_equal(k1, k2) and compare.tensors_bitwise_equal(v1, v2)
    assert torch.equal(back.attention_mask, state.attention_mask) and torch.equal(back.suffix_ids, state.suffix_ids)
    assert torch.equal(back.model_metadata[resume.ROPE_KEY], state.model_metadata[resume.ROPE_KEY])


def test_round_trip_keeps_a_none_state(state, tmp_path):
    state.model_metadata[resume.ROPE_KEY] = None
    back = resume.round_trip(state, tmp_path)
    assert resume.ROPE_KEY in back.model_metadata and back.model_metadata[resume.ROPE_KEY] is None


def test_restore_into_a_fresh_instance_matches_the_same_instance(bundle, prompt, prefix_cache, state, tmp_path):
    rebuilt = compat.cache_from_pairs(compat.kv_pairs(prefix_cache))
    reference = continuation.generate_first_step(bundle.model, prompt.last_token, rebuilt, attention_mask=prompt.attention_mask)
    fresh = bundle.fresh_instance()
    assert compat.get_rope_state(fresh) is None
    cache = resume.restore(fresh, resume.round_trip(state, tmp_path))
    assert caches.kv_bitwise_equal(cache, prefix_cache)
    assert compat.get_rope_state(fresh).flatten().tolist() == [-42]
    kwargs = state.generate_kwargs()
    out = continuation.generate_first_step(fresh, kwargs.pop("input_ids"), cache, **kwargs)
    assert out.ok and torch.equal(out.logits, reference.logits)


def _replace_kv(state, fn):
    return dataclasses.replace(state, kv=[(fn(k), fn(v)) for k, v in state.kv])


@pytest.mark.parametrize("broken, message", [
    (lambda s: dataclasses.replace(s, kv=s.kv[:-1]), "layer count: state has 3 layers, model has 4"),
    (lambda s: _replace_kv(s, lambda t: t[:, :1]), "K/V shapes"),
    (lambda s: _replace_kv(s, lambda t: t[..., :16]), "K/V shapes"),
    (lambda s: _replace_kv(s, lambda t: t.half()), "dtype: state K/V are torch.float16"),
    (lambda s: _replace_kv(s, lambda t: t.to("meta")), "device: state K/V are on meta"),
    (lambda s: dataclasses.replace(s, attention_mask=s.attention_mask.repeat(2, 1)), "batch size"),
    (lambda s: dataclasses.replace(s, suffix_ids=s.suffix_ids.repeat(2, 1)), "batch size"),
    (lambda s: dataclasses.replace(s, attention_mask=s.attention_mask[:, :-1]), "mask length: attention_mask covers 81 tokens"),
    (lambda s: dataclasses.replace(s, processed_length=82), "processed length: layer 0 holds 81"),
    (lambda s: dataclasses.replace(s, model_metadata={}), "model metadata"),
    (lambda s: dataclasses.replace(s, model_metadata={resume.ROPE_KEY: torch.tensor([[-42], [-42]])}), "batch size: rope_deltas"),
])
def test_restore_names_what_does_not_match(bundle, state, broken, message):
    before = compat.get_rope_state(bundle.model)
    with pytest.raises(resume.ResumeStateError, match=message.replace("[", r"\[")):
        resume.restore(bundle.fresh_instance(), broken(state))
    assert compat.get_rope_state(bundle.model) is before


def test_text_only_model_rejects_multimodal_metadata(state):
    from kvresume import testing
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(testing.text_config("dense", head_dim=32)).eval()  # the tiny VL's K/V geometry
    with pytest.raises(resume.ResumeStateError, match="keeps no such state"):
        resume.validate(lm, state)
    resume.validate(lm, dataclasses.replace(state, model_metadata={}))  # same K/V geometry: fits


def test_load_rejects_another_format_version(state, tmp_path):
    resume.save(state, tmp_path)
    doc = json.loads((tmp_path / resume.JSON_FILE).read_text())
    doc["format_version"] = 99
    (tmp_path / resume.JSON_FILE).write_text(json.dumps(doc))
    with pytest.raises(resume.ResumeStateError, match="state.json: field format_version"):
        resume.load(tmp_path)


# --------------------------------------------------------------------------- a truncated or edited folder

def _edit_json(directory, **changes):
    doc = json.loads((directory / resume.JSON_FILE).read_text())
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key)
        else:
            doc[key] = value
    (directory / resume.JSON_FILE).write_text(json.dumps(doc))


_DROP = object()


def _truncate(directory, keep: float = 0.5):
    path = directory / resume.TENSOR_FILE
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _drop_tensor(directory, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(directory / resume.TENSOR_FILE))
    tensors.pop(name)
    save_file(tensors, str(directory / resume.TENSOR_FILE))


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: _truncate(d), "tensors.safetensors: unreadable, truncated"),
    (lambda d: _truncate(d, 0.001), "tensors.safetensors: unreadable, truncated"),
    (lambda d: (d / resume.TENSOR_FILE).write_bytes(b"not a safetensors file"), "tensors.safetensors: unreadable"),
    (lambda d: (d / resume.TENSOR_FILE).unlink(), "tensors.safetensors: missing"),
    (lambda d: (d / resume.JSON_FILE).unlink(), "state.json: missing"),
    (lambda d: (d / resume.JSON_FILE).write_text('{"n_layers": 4,'), "state.json: unreadable"),
    (lambda d: (d / resume.JSON_FILE).write_text("[1, 2]"), "state.json: top level is a list"),
    (lambda d: _edit_json(d, n_layers=5), "state.json: field n_layers is 5, but tensors.safetensors holds 4 layers"),
    (lambda d: _edit_json(d, n_layers=3), "state.json: field n_layers is 3, but tensors.safetensors holds 4 layers"),
    (lambda d: _edit_json(d, n_layers="4"), "state.json: field n_layers is '4' \\(str\\), expected int"),
    (lambda d: _edit_json(d, n_layers=0), "state.json: field n_layers is 0, must be at least 1"),
    (lambda d: _edit_json(d, n_layers=_DROP), "state.json: field n_layers is missing"),
    (lambda d: _edit_json(d, processed_length=None), "state.json: field processed_length is None"),
    (lambda d: _edit_json(d, processed_length=82), "processed_length is 82"),
    (lambda d: _edit_json(d, model_metadata=None), "state.json: field model_metadata is None"),
    (lambda d: _edit_json(d, model_metadata={resume.ROPE_KEY: "tensr"}), "field model_metadata.rope_deltas is 'tensr'"),
    (lambda d: _edit_json(d, model_metadata={"other": "tensor"}), "tensors.safetensors: field metadata.other is missing"),
    (lambda d: _edit_json(d, dtype="float16"), "state.json: field dtype is 'float16', but tensors.safetensors holds 'float32'"),
    (lambda d: _edit_json(d, suffix_length=2), "state.json: field suffix_length is 2"),
    (lambda d: _drop_tensor(d, "layers.3.values"), "tensors.safetensors: field layers.3.values is missing"),
    (lambda d: _drop_tensor(d, "attention_mask"), "tensors.safetensors: field attention_mask is missing"),
])
def test_load_names_the_file_and_field_of_a_broken_folder(state, tmp_path, corrupt, message):
    resume.save(state, tmp_path)
    corrupt(tmp_path)
    with pytest.raises(resume.ResumeStateError, match=message):
        resume.load(tmp_path)


def test_load_of_an_untouched_folder_still_works(state, tmp_path):
    back = resume.load(resume.save(state, tmp_path))
    assert back.n_layers == state.n_layers and back.processed_length == state.processed_length
