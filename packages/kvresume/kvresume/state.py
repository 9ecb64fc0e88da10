"""A documented resume-state object: everything a one-step continuation needs, saved and restored.

The seed's "documented resume-state object" made concrete. A `ResumeState` holds

* the K/V tensors of every cache layer (the *processed* tokens only);
* `processed_length`: how many tokens have logically passed through the model. For the identity
  `DynamicLayer` caches used here it equals every layer's K/V length, and that is validated;
* `suffix_ids`: the not-yet-processed tokens the continuation feeds (for the seed: `prompt[-1]`);
* `attention_mask`: the **full** mask the continuation passes, covering
  ``processed_length + suffix_length`` columns (cached prefix + unprocessed suffix), as the
  Transformers cache contract and the seed's working path require;
* `model_metadata`: model-side state outside the K/V tensors: for Qwen3-VL the multimodal position
  state (`rope_deltas`, read and written only through `kvresume.compat`). A text-only model has none.

`save()` writes ``<dir>/tensors.safetensors`` (all tensors) and ``<dir>/state.json`` (the rest);
`load()` reads them back. `restore()` validates the state against a model instance (layer count, K/V
shapes, dtype, device, batch size, lengths, metadata) and raises `ResumeStateError` naming the first
mismatch, then builds a config-aware `DynamicCache` and writes the model-side state into the model.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import compat

FORMAT_VERSION = 1
ROPE_KEY = "rope_deltas"
TENSOR_FILE, JSON_FILE = "tensors.safetensors", "state.json"


class ResumeStateError(ValueError):
    """A resume state that does not fit (itself or a model instance); the message names what differs."""


@dataclass
class ResumeState:
    """Cache K/V, processed length, unprocessed suffix, full mask and model-side metadata."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    processed_length: int
    suffix_ids: torch.Tensor
    attention_mask: torch.Tensor
    model_metadata: dict[str, torch.Tensor | None] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.kv)

    @property
    def suffix_length(self) -> int:
        return int(self.suffix_ids.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.attention_mask.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return self.kv[0][0].dtype

    @property
    def device(self) -> torch.device:
        return self.kv[0][0].device

    def generate_kwargs(self) -> dict[str, Any]:
        """`input_ids` (the suffix) and the full `attention_mask` for `generate()` from the restored cache."""
        return {"input_ids": self.suffix_ids, "attention_mask": self.attention_mask}

    def check(self) -> None:
        """Internal consistency: batch sizes, per-layer lengths and mask length = processed + suffix."""
        _require(bool(self.kv), "layer count: the state holds no cache layers")
        _require(self.attention_mask.dim() == 2 and self.suffix_ids.dim() == 2, f"attention_mask and suffix_ids must "
                 f"be 2-D [batch, length]; got {list(self.attention_mask.shape)} and {list(self.suffix_ids.shape)}")
        for i, (k, v) in enumerate(self.kv):
            _require(k.shape == v.shape, f"K/V shapes: layer {i} keys {list(k.shape)} != values {list(v.shape)}")
            _require(k.dtype == v.dtype == self.dtype,
                     f"dtype: layer {i} is {k.dtype}/{v.dtype}, layer 0 is {self.dtype}")
            _require(k.device == v.device == self.device,
                     f"device: layer {i} is on {k.device}, layer 0 on {self.device}")
            _require(int(k.shape[0]) == self.batch_size,
                     f"batch size: layer {i} K/V batch {k.shape[0]} != attention_mask batch {self.batch_size}")
            _require(int(k.shape[-2]) == self.processed_length, f"processed length: layer {i} holds {k.shape[-2]} "
                     f"K/V slots but processed_length is {self.processed_length} (identity DynamicLayer caches keep "
                     f"one slot per token)")
        _require(int(self.suffix_ids.shape[0]) == self.batch_size, f"batch size: suffix_ids batch "
                 f"{self.suffix_ids.shape[0]} != attention_mask batch {self.batch_size}")
        want = self.processed_length + self.suffix_length
        _require(int(self.attention_mask.shape[1]) == want, f"mask length: attention_mask covers "
                 f"{self.attention_mask.shape[1]} tokens, but must cover processed_length + suffix_length = "
                 f"{self.processed_length} + {self.suffix_length} = {want}")


def _require(ok: bool, message: str) -> None:
    """Raise ResumeStateError(message) unless `ok`."""
    if not ok:
        raise ResumeStateError(message)


def capture(model: torch.nn.Module, cache: Any, suffix_ids: torch.Tensor, attention_mask: torch.Tensor) -> ResumeState:
    """Snapshot a prefix cache, the suffix still to feed, the full mask and the model-side state."""
    metadata: dict[str, torch.Tensor | None] = {}
    if compat.rope_state_owner(model) is not None:
        value = compat.get_rope_state(model)
        metadata[ROPE_KEY] = None if value is None else value.detach().clone()
    state = ResumeState(kv=compat.kv_pairs(cache), processed_length=int(cache.get_seq_length()),
                        suffix_ids=suffix_ids.detach().clone(), attention_mask=attention_mask.detach().clone(),
                        model_metadata=metadata,
                        info={"format_version": FORMAT_VERSION, "transformers": compat.TRANSFORMERS_VERSION,
                              "model_class": type(model).__name__,
                              "layer_classes": sorted({type(layer).__name__ for layer in compat.cache_layers(cache)})})
    state.check()
    return state


def validate(model: torch.nn.Module, state: ResumeState) -> None:
    """Raise ResumeStateError naming the first thing in `state` that does not fit `model`."""
    state.check()
    cfg = compat.text_config(model.config)
    heads, head_dim = compat.kv_geometry(cfg)
    param, keeps = next(model.parameters()), compat.rope_state_owner(model) is not None
    _require(state.n_layers == int(cfg.num_hidden_layers),
             f"layer count: state has {state.n_layers} layers, model has {cfg.num_hidden_layers}")
    for i, (k, _) in enumerate(state.kv):
        _require(int(k.shape[1]) == heads and int(k.shape[-1]) == head_dim, f"K/V shapes: layer {i} is "
                 f"{list(k.shape)}, model expects [batch, {heads}, length, {head_dim}]")
    _require(state.dtype == param.dtype, f"dtype: state K/V are {state.dtype}, model runs in {param.dtype}")
    _require(state.device == param.device, f"device: state K/V are on {state.device}, model is on {param.device} "
             f"(load the state with device={str(param.device)!r})")
    _require(not keeps or ROPE_KEY in state.model_metadata, f"model metadata: {type(model).__name__} keeps multimodal "
             f"position state ({ROPE_KEY}) but the state carries none")
    _require(keeps or ROPE_KEY not in state.model_metadata,
             f"model metadata: the state carries {ROPE_KEY} but {type(model).__name__} keeps no such state")
    rope = state.model_metadata.get(ROPE_KEY)
    _require(rope is None or int(rope.shape[0]) == state.batch_size,
             f"batch size: {ROPE_KEY} batch {None if rope is None else rope.shape[0]} != attention_mask batch "
             f"{state.batch_size}")


def restore(model: torch.nn.Module, state: ResumeState) -> Any:
    """Validate, write the model-side state into `model`, and return a new config-aware DynamicCache."""
    validate(model, state)
    if ROPE_KEY in state.model_metadata:  # (validated: the model keeps it)
        compat.put_rope_state(model, state.model_metadata[ROPE_KEY])
    return compat.cache_from_pairs([(k.clone(), v.clone()) for k, v in state.kv], compat.text_config(model.config))


def save(state: ResumeState, directory: str | Path) -> Path:
    """Write tensors.safetensors (K/V, mask, suffix, tensor metadata) and state.json (the rest)."""
    from safetensors.torch import save_file

    state.check()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"attention_mask": state.attention_mask, "suffix_ids": state.suffix_ids,
               **{f"layers.{i}.{part}": t for i, kv in enumerate(state.kv) for part, t in zip(("keys", "values"), kv)},
               **{f"metadata.{name}": v for name, v in state.model_metadata.items() if v is not None}}
    metadata_json = {name: None if v is None else "tensor" for name, v in state.model_metadata.items()}
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(directory / TENSOR_FILE))
    doc = {"format_version": FORMAT_VERSION, "n_layers": state.n_layers, "processed_length": state.processed_length,
           "suffix_length": state.suffix_length, "batch_size": state.batch_size, "dtype": str(state.dtype).replace("torch.", ""),
           "saved_from_device": str(state.device), "model_metadata": metadata_json, "info": state.info}
    (directory / JSON_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return directory


def _read_doc(directory: Path) -> dict[str, Any]:
    """state.json as a dict, or ResumeStateError naming the file."""
    path = directory / JSON_FILE
    _require(path.is_file(), f"{JSON_FILE}: missing from {directory.name}/ (not a folder written by resume.save())")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResumeStateError(f"{JSON_FILE}: unreadable ({type(exc).__name__}: {exc})") from None
    _require(isinstance(doc, dict), f"{JSON_FILE}: top level is a {type(doc).__name__}, not an object")
    _require(doc.get("format_version") == FORMAT_VERSION, f"{JSON_FILE}: field format_version: file has "
             f"{doc.get('format_version')!r}, this kit reads {FORMAT_VERSION}")
    return doc


def _field(doc: dict[str, Any], name: str, kind: type, minimum: int | None = None) -> Any:
    """One field of state.json, type-checked (bool is not an int here); ResumeStateError naming it."""
    _require(name in doc, f"{JSON_FILE}: field {name} is missing")
    value = doc[name]
    _require(isinstance(value, kind) and not isinstance(value, bool), f"{JSON_FILE}: field {name} is {value!r} "
             f"({type(value).__name__}), expected {kind.__name__}")
    _require(minimum is None or value >= minimum, f"{JSON_FILE}: field {name} is {value}, must be at least {minimum}")
    return value


def _read_tensors(directory: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """tensors.safetensors as a dict, or ResumeStateError naming the file (truncated, not safetensors, absent)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / TENSOR_FILE
    _require(path.is_file(), f"{TENSOR_FILE}: missing from {directory.name}/")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ResumeStateError(f"{TENSOR_FILE}: unreadable, truncated or not a safetensors file "
                               f"({type(exc).__name__}: {first})") from None


def _tensor(tensors: dict[str, torch.Tensor], name: str, why: str) -> torch.Tensor:
    """The tensor `name` of the file, or ResumeStateError saying why it should be there."""
    _require(name in tensors, f"{TENSOR_FILE}: field {name} is missing ({why})")
    return tensors[name]


def _layer_count(tensors: dict[str, torch.Tensor]) -> int:
    """How many layers.<i>.keys the tensor file holds."""
    found = [int(m.group(1)) for k in tensors if (m := re.fullmatch(r"layers\.(\d+)\.(?:keys|values)", k))]
    return max(found) + 1 if found else 0


def load(directory: str | Path, device: str | torch.device = "cpu") -> ResumeState:
    """Read a state written by `save()`, tensors placed on `device`.

    A truncated or edited folder raises ResumeStateError naming the file and the field, never a raw
    SafetensorError/KeyError/TypeError, and state.json must agree with the tensors it describes.
    """
    directory = Path(directory)
    doc = _read_doc(directory)
    n_layers = _field(doc, "n_layers", int, minimum=1)
    processed = _field(doc, "processed_length", int, minimum=0)
    meta_doc = _field(doc, "model_metadata", dict)
    info = _field(doc, "info", dict) if "info" in doc else {}
    tensors = _read_tensors(directory, device)
    held = _layer_count(tensors)
    _require(held == n_layers, f"{JSON_FILE}: field n_layers is {n_layers}, but {TENSOR_FILE} holds {held} layers "
             f"(layers.0 .. layers.{held - 1})")
    kv = [(_tensor(tensors, f"layers.{i}.keys", f"{JSON_FILE} n_layers is {n_layers}"),
           _tensor(tensors, f"layers.{i}.values", f"{JSON_FILE} n_layers is {n_layers}")) for i in range(n_layers)]
    metadata: dict[str, torch.Tensor | None] = {}
    for name, kind in meta_doc.items():
        _require(kind in ("tensor", None),
                 f"{JSON_FILE}: field model_metadata.{name} is {kind!r}, expected \"tensor\" or null")
        metadata[name] = _tensor(tensors, f"metadata.{name}", f"{JSON_FILE} model_metadata.{name} says tensor") \
            if kind == "tensor" else None
    state = ResumeState(kv, processed, _tensor(tensors, "suffix_ids", "the unprocessed suffix"),
                        _tensor(tensors, "attention_mask", "the full mask"), metadata, info)
    try:
        state.check()
    except ResumeStateError as exc:
        raise ResumeStateError(f"{TENSOR_FILE} / {JSON_FILE}: {exc}") from None
    _agree(doc, state)
    return state


def _agree(doc: dict[str, Any], state: ResumeState) -> None:
    """The descriptive fields of state.json (when present) match the tensors they describe."""
    measured = {"suffix_length": state.suffix_length, "batch_size": state.batch_size,
                "dtype": str(state.dtype).replace("torch.", "")}
    for name, value in measured.items():
        _require(doc.get(name, value) == value,
                 f"{JSON_FILE}: field {name} is {doc.get(name)!r}, but {TENSOR_FILE} holds {value!r}")


def round_trip(state: ResumeState, directory: str | Path, device: str | torch.device = "cpu") -> ResumeState:
    """save() then load(): what another process would get."""
    return load(save(state, directory), device)
