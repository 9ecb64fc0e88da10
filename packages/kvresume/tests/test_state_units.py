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
