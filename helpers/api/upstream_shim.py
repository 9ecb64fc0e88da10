"""The few cache and model readers the guard uses (helpers.compat, helpers.regress.layers), standalone for the
upstream file: torch and transformers only. tests/test_api.py checks they read every family's cache as the kit's own do."""
from __future__ import annotations  # upstream: drop

import inspect
from types import SimpleNamespace
from typing import Any

import torch
import transformers


def _cache_from_kwargs(kwargs: dict[str, Any]) -> Any:
    """The cache among a call's keyword arguments (`past_key_values`, later `cache`)."""
    for name in ("past_key_values", "cache"):
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def _rope_state_owner(model: torch.nn.Module) -> Any:
    for candidate in (getattr(model, "model", None), getattr(model, "base_model", None), model):
        if candidate is not None and hasattr(candidate, "rope_deltas"):
            return candidate
    return None


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else getattr(config, "text_config", config)


def _has_kv(layer: Any) -> bool:
    return isinstance(getattr(layer, "keys", None), torch.Tensor)


def _has_linear_state(layer: Any) -> bool:
    return isinstance(getattr(layer, "conv_states", None), dict)


def _layer_length(layer: Any) -> int | None:
    if not _has_kv(layer) and _has_linear_state(layer):
        return None
    return int(layer.get_seq_length())


def _output_cache(output: Any) -> Any:
    for name in ("cache", "past_key_values"):
        if getattr(output, name, None) is not None:
            return getattr(output, name)
    return None


def rotary_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    """The text model's rotary embedding (the first `rotary_emb` that is not a vision tower's), or None."""
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") and "visual" not in name and "Vision" not in type(module).__name__:
            return module
    return None


compat = SimpleNamespace(output_cache=_output_cache,
    TRANSFORMERS_VERSION=transformers.__version__, LINEAR_LENGTH_ATTR="cumulative_length_linear", accepts=lambda fn, name: name in inspect.signature(fn).parameters,
    cache_from_kwargs=_cache_from_kwargs, cache_layers=lambda cache: list(getattr(cache, "layers", [])),
    rope_state_owner=_rope_state_owner, text_config=_text_config,
    get_rope_state=lambda m: getattr(_rope_state_owner(m), "rope_deltas", None),
    set_rope_state=lambda m, v: setattr(_rope_state_owner(m), "rope_deltas", v))
layers = SimpleNamespace(
    has_kv=_has_kv, has_linear_state=_has_linear_state, is_sliding=lambda l: bool(getattr(l, "is_sliding", False)),
    layer_length=_layer_length, lengths=lambda cache: [_layer_length(l) for l in getattr(cache, "layers", [])])
