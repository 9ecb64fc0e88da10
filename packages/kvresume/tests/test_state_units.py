"""kvresume.state on a hand-made state (no model runs): the state.json a save writes (into a folder it makes), the
descriptive fields a load checks against the tensors (batch size too, and a field left out), the boundaries of its
counts (no processed token, no layer in the file), and the reading error named with its exception."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from kvresume import state as st


def small(processed=2, batch=1) -> st.ResumeState:
    k = torch.arange(batch * processed * 4, dtype=torch.float32).view(batch, 1, processed, 4)
    return st.ResumeState(kv=[(k, k + 1)], processed_length=processed, suffix_ids=torch.ones(batch, 1, dtype=torch.long),
                          attention_mask=torch.ones(batch, processed + 1, dtype=torch.long), info={"a": 1})


def edit(folder, **changes):
    doc = json.loads((folder / st.JSON_FILE).read_text())
    doc.update(changes)
    (folder / st.JSON_FILE).write_text(json.dumps(doc))


def test_a_save_writes_its_document_into_a_folder_it_makes(tmp_path):
    folder = st.save(small(batch=2), tmp_path / "a" / "b")
    assert folder == tmp_path / "a" / "b"
    assert json.loads((folder / st.JSON_FILE).read_text()) == {
        "format_version": 1, "n_layers": 1, "processed_length": 2, "suffix_length": 1, "batch_size": 2,
        "dtype": "float32", "saved_from_device": "cpu", "model_metadata": {}, "info": {"a": 1}}
    got = st.round_trip(small(batch=2), tmp_path / "c", "cpu")
    assert got.processed_length == 2 and got.batch_size == 2 and got.info == {"a": 1}
    assert torch.equal(got.kv[0][1], small(batch=2).kv[0][1]) and got.device == torch.device("cpu")
    st.save(small(), folder)  # again, into the folder that now exists
    assert json.loads((folder / st.JSON_FILE).read_text())["batch_size"] == 1


def test_a_state_of_no_processed_token_loads(tmp_path):
    got = st.load(st.save(small(processed=0), tmp_path))
    assert got.processed_length == 0 and got.kv[0][0].shape == (1, 1, 0, 4)


@pytest.mark.parametrize("field, value, holds", [("batch_size", 3, 1), ("suffix_length", 4, 1), ("dtype", "int8", "'float32'")])
def test_a_descriptive_field_that_disagrees_with_the_tensors_is_named(tmp_path, field, value, holds):
    st.save(small(), tmp_path)
    edit(tmp_path, **{field: value})
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == (f"state.json: field {field} is {value!r}, but tensors.safetensors holds {holds}")


def test_descriptive_fields_left_out_are_not_read(tmp_path):
    st.save(small(), tmp_path)
    doc = json.loads((tmp_path / st.JSON_FILE).read_text())
    for name in ("batch_size", "suffix_length", "dtype", "saved_from_device", "info"):
        doc.pop(name)
    (tmp_path / st.JSON_FILE).write_text(json.dumps(doc))
    got = st.load(tmp_path)
    assert got.batch_size == 1 and got.info == {}


def test_a_file_without_layers_holds_none(tmp_path):
    st.save(small(), tmp_path)
    save_file({"suffix_ids": torch.ones(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.long)},
              str(tmp_path / st.TENSOR_FILE))
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == ("state.json: field n_layers is 1, but tensors.safetensors holds 0 layers "
                               "(layers.0 .. layers.-1)")
    assert st._layer_count({}) == 0 and st._layer_count({"layers.4.values": None, "layers.12.keys": None}) == 13


def test_an_unreadable_tensor_file_is_named_with_its_error(tmp_path):
    st.save(small(), tmp_path)
    (tmp_path / st.TENSOR_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    message = str(info.value)
    assert message.startswith("tensors.safetensors: unreadable, truncated or not a safetensors file (")
    kind, _, first = message.partition("(")[2].partition(": ")
    assert kind in ("SafetensorError", "OSError", "ValueError", "RuntimeError") and first.strip(")") and "None" not in first
    assert first.strip(")") != kind  # its message, not its type again


def test_an_error_without_a_message_is_named_by_its_type(tmp_path, monkeypatch):
    import safetensors.torch

    def fail(path, device):
        raise OSError()

    monkeypatch.setattr(safetensors.torch, "load_file", fail)
    st.save(small(), tmp_path)
    with pytest.raises(st.ResumeStateError, match=r"\(OSError: OSError\)$"):
        st.load(tmp_path)


def test_the_tensors_are_placed_on_the_device_asked(tmp_path, monkeypatch):
    import safetensors.torch

    seen = []
    real = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda path, device: seen.append(device) or real(path, device))
    st.load(st.save(small(), tmp_path), device=torch.device("cpu"))
    assert seen == ["cpu"]


def test_the_document_is_sorted_and_indented(tmp_path):
    st.save(small(), tmp_path)
    text = (tmp_path / st.JSON_FILE).read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n" and text.startswith('{\n  "batch_size": 1,')


def test_an_unreadable_or_other_format_document_is_named(tmp_path):
    st.save(small(), tmp_path)
    (tmp_path / st.JSON_FILE).write_text('{"n_layers": 1,')
    with pytest.raises(st.ResumeStateError, match=r"^state.json: unreadable \(JSONDecodeError: "):
        st.load(tmp_path)
    st.save(small(), tmp_path)
    edit(tmp_path, format_version=99)
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == "state.json: field format_version: file has 99, this kit reads 1"


def test_a_negative_processed_length_and_a_missing_layer_tensor_are_named(tmp_path):
    from safetensors.torch import load_file

    st.save(small(), tmp_path)
    edit(tmp_path, processed_length=-1)
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == "state.json: field processed_length is -1, must be at least 0"
    st.save(small(), tmp_path)
    tensors = load_file(str(tmp_path / st.TENSOR_FILE))
    tensors.pop("layers.0.keys")
    save_file(tensors, str(tmp_path / st.TENSOR_FILE))
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == "tensors.safetensors: field layers.0.keys is missing (state.json n_layers is 1)"


def test_a_round_trip_loads_on_the_device_asked(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(st, "load", lambda directory, device="cpu": seen.append(device) or "loaded")
    assert st.round_trip(small(), tmp_path, "cuda:7") == "loaded" and seen == ["cuda:7"]


def broken(**change) -> st.ResumeState:
    import dataclasses

    return dataclasses.replace(small(batch=2), **change)


K4 = torch.zeros(2, 1, 2, 4)


@pytest.mark.parametrize("change, message", [
    (dict(kv=[]), "layer count: the state holds no cache layers"),
    (dict(kv=[(K4, torch.zeros(2, 1, 2, 3))]), "K/V shapes: layer 0 keys [2, 1, 2, 4] != values [2, 1, 2, 3]"),
    (dict(kv=[(K4, K4), (K4.half(), K4.half())]), "dtype: layer 1 is torch.float16/torch.float16, layer 0 is torch.float32"),
    (dict(kv=[(K4, K4), (K4, K4.to("meta"))]), "device: layer 1 is on cpu, layer 0 on cpu"),
    (dict(kv=[(torch.zeros(3, 1, 2, 4), torch.zeros(3, 1, 2, 4))]),
     "batch size: layer 0 K/V batch 3 != attention_mask batch 2"),
    (dict(kv=[(torch.zeros(2, 1, 5, 4),) * 2]), "processed length: layer 0 holds 5 K/V slots but processed_length is 2 "
                                                "(identity DynamicLayer caches keep one slot per token)"),
    (dict(suffix_ids=torch.ones(3, 1, dtype=torch.long)), "batch size: suffix_ids batch 3 != attention_mask batch 2"),
    (dict(suffix_ids=torch.ones(2, dtype=torch.long)), "attention_mask and suffix_ids must be 2-D [batch, length]; got "
                                                       "[2, 3] and [2]"),
    (dict(attention_mask=torch.ones(2, 3, 1)), "attention_mask and suffix_ids must be 2-D [batch, length]; got "
                                               "[2, 3, 1] and [2, 1]"),
])
def test_each_inconsistency_is_named(change, message):
    with pytest.raises(st.ResumeStateError) as info:
        broken(**change).check()
    assert str(info.value) == message


@pytest.mark.parametrize("name, why", [("suffix_ids", "the unprocessed suffix"), ("attention_mask", "the full mask"),
                                       ("layers.0.values", "state.json n_layers is 1")])
def test_a_missing_tensor_is_named_with_why_it_should_be_there(tmp_path, name, why):
    from safetensors.torch import load_file

    st.save(small(), tmp_path)
    tensors = load_file(str(tmp_path / st.TENSOR_FILE))
    tensors.pop(name)
    save_file(tensors, str(tmp_path / st.TENSOR_FILE))
    with pytest.raises(st.ResumeStateError) as info:
        st.load(tmp_path)
    assert str(info.value) == f"tensors.safetensors: field {name} is missing ({why})"
