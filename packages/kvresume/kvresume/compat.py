"""Every difference between supported transformers releases, in one place.

Notebooks and other helpers call these functions instead of touching attributes or keyword
names that moved between releases (5.14.1, 5.17.0, 5.24.0 are the ones the kit is run on).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from transformers import DynamicCache

TRANSFORMERS_VERSION = transformers.__version__


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def accepts(fn: Any, name: str) -> bool:
    """Whether callable `fn` takes a parameter called `name` on this release."""
    return name in _params(fn)


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the forward keyword that carries the cache (`past_key_values`, later `cache`; Mamba's `cache_params`
    before 5.25)."""
    params = _params(model.forward)
    if "cache" in params and "past_key_values" not in params:
        return "cache"
    return "cache_params" if "cache_params" in params and "past_key_values" not in params else "past_key_values"


def cache_from_kwargs(kwargs: dict[str, Any]) -> Any:
    """The cache object inside a forward call's kwargs, whatever the release calls it."""
    return next((kwargs[name] for name in ("past_key_values", "cache") if kwargs.get(name) is not None), None)


def output_cache(output: Any) -> Any:
    """The cache returned by a forward call (`past_key_values`, later `cache`, which is asked first so
    that newer releases do not warn about the deprecated name)."""
    values = (getattr(output, name, None) for name in ("cache", "past_key_values"))
    return next((value for value in values if value is not None), None)


def plain_generate(model: torch.nn.Module) -> Any:
    """The model class's own generate(), bound: a pool attached to the instance (kvresume.pool.attach) is not
    re-entered by kvresume's own calls."""
    return type(model).generate.__get__(model)


def generate_logits(output: Any) -> tuple[torch.Tensor, ...]:
    """Per-step raw logits of `generate(..., output_logits=True, return_dict_in_generate=True)`."""
    logits = getattr(output, "logits", None)
    if logits is None:
        raise AttributeError(f"{type(output).__name__} carries no per-step logits on transformers {TRANSFORMERS_VERSION}")
    return tuple(logits)


def layer_kv(layer: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(keys, values) of one cache layer."""
    return getattr(layer, "keys", None), getattr(layer, "values", None)


def cache_layers(cache: Any) -> list[Any]:
    """The per-layer objects of a cache."""
    return list(getattr(cache, "layers", []))


def has_tensor_data_constructor() -> bool:
    """Whether `DynamicCache(ddp_cache_data=..., config=...)` exists on this release."""
    params = _params(DynamicCache.__init__)
    return "ddp_cache_data" in params and "config" in params


def dynamic_cache_from_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]], config: Any) -> DynamicCache:
    """The release's tensor-data constructor; NotImplementedError where it has none."""
    if not has_tensor_data_constructor():
        raise NotImplementedError(f"DynamicCache has no ddp_cache_data/config constructor on transformers {TRANSFORMERS_VERSION}")
    return DynamicCache(ddp_cache_data=pairs, config=config)


def dynamic_cache(config: Any | None = None, **kwargs: Any) -> DynamicCache:
    """An empty DynamicCache, config-aware when a config is given."""
    return DynamicCache(config=config, **kwargs)


def text_config(config: Any) -> Any:
    """The decoder (text) config of a multimodal or text-only model config."""
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if getter is not None else getattr(config, "text_config", config)


# --- Qwen3-VL model-side multimodal position state -------------------------------------------------

ROPE_STATE_ATTR = "rope_deltas"


def rope_state_owner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module that keeps the multimodal position state (`rope_deltas`), or None for text-only models."""
    candidates = (getattr(model, "model", None), getattr(model, "base_model", None), model)
    return next((c for c in candidates if c is not None and hasattr(c, ROPE_STATE_ATTR)), None)


def get_rope_state(model: torch.nn.Module) -> torch.Tensor | None:
    """Current model-side multimodal position state, None where the model has none set."""
    owner = rope_state_owner(model)
    return None if owner is None else getattr(owner, ROPE_STATE_ATTR)


def set_rope_state(model: torch.nn.Module, value: torch.Tensor | None) -> None:
    """Overwrite the model-side multimodal position state."""
    owner = rope_state_owner(model)
    if owner is None:
        raise AttributeError(f"{type(model).__name__} keeps no {ROPE_STATE_ATTR} on transformers {TRANSFORMERS_VERSION}")
    setattr(owner, ROPE_STATE_ATTR, value)


def put_rope_state(model: torch.nn.Module, value: torch.Tensor | None) -> None:
    """A copy of `value` as the model-side position state where the model keeps one; nothing where it keeps none."""
    if rope_state_owner(model) is not None:
        set_rope_state(model, None if value is None else value.clone())


def accepts_mm_token_type_ids(model: torch.nn.Module) -> bool:
    """Whether the multimodal forward takes `mm_token_type_ids` (needed for M-RoPE on newer releases)."""
    return accepts(model.forward, "mm_token_type_ids")


def image_processor_class() -> type:
    """A Qwen2-VL-family image processor class that works without torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil


def describe_release() -> dict[str, Any]:
    """What the compat layer resolved on the installed release (shown in notebooks, tested)."""
    return {
        "transformers": TRANSFORMERS_VERSION,
        "tensor_data_constructor": has_tensor_data_constructor(),
        "image_processor": image_processor_class().__name__,
    }


# the name under which `generate()` takes a starting cache: it follows the forward signature (`generate()` itself
# takes **kwargs; 5.24 deprecates `past_key_values` there in favour of `cache`)
generate_cache_kwarg = cache_kwarg


# --- linear-attention layers' own token count (5.25.0+) -------------------------------------------

LINEAR_LENGTH_ATTR = "cumulative_length_linear"


def carry_linear_length(target: Any, source: Any) -> bool:
    """Set a linear-attention layer's own token count from `source` (a layer, or a token count) where this
    release keeps one (`cumulative_length_linear`, 5.25.0+, which `get_seq_length()` answers from when the
    layer is layer 0); False, changing nothing, where the release (or `source`) has none."""
    current = getattr(target, LINEAR_LENGTH_ATTR, None)
    value = getattr(source, LINEAR_LENGTH_ATTR, None) if not isinstance(source, (int, torch.Tensor)) else source
    if not isinstance(current, torch.Tensor) or value is None:
        return False
    current.fill_(int(value))
    return True


def kv_geometry(text: Any) -> tuple[int, int]:
    """(key/value heads, head dim) a text config's attention layers store."""
    heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)  # pragma: no mutate - int(a / b)
    return heads, head_dim


def kv_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detached clones of every layer's (keys, values)."""
    return [(keys.detach().clone(), values.detach().clone()) for keys, values in map(layer_kv, cache_layers(cache))]


def cache_from_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]], config: Any | None = None) -> DynamicCache:
    """`update()` each (keys, values) pair into a new DynamicCache (config-aware when config is given)."""
    cache = dynamic_cache(config)
    for layer_idx, (keys, values) in enumerate(pairs):
        cache.update(keys, values, layer_idx)
    return cache


def rotary_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    """The text model's rotary embedding (the first `rotary_emb` that is not a vision tower's), or None."""
    return next((module for name, module in model.named_modules() if name.endswith("rotary_emb")
                 and "visual" not in name and "Vision" not in type(module).__name__), None)


# --- caches and models a resume cannot continue as generate() would ---------------------------------

# model types whose mixer continues the cached SSM state for one token only: a multi-token call on a filled cache
# runs the full-sequence scan from a zero state (Mamba / FalconMamba, 5.17 and 5.25: `recurrent_state` is read only
# where `seq_len == 1`), so it differs from the no-cache run (a 6-token suffix: max |logit diff| 0.023)
SCAN_RESTARTS = ("mamba", "falcon_mamba")


def restarts_scan(model: torch.nn.Module) -> bool:
    """Whether the model's multi-token forward on a filled cache restarts its SSM scan (SCAN_RESTARTS)."""
    return getattr(text_config(model.config), "model_type", None) in SCAN_RESTARTS


def static_capacity(cache: Any) -> int | None:
    """The tokens a static cache can hold (its smallest full-attention layer's max_cache_len); None where no layer
    has a fixed length (a sliding static layer wraps around)."""
    owner = getattr(cache, "self_attention_cache", None) or cache
    sizes = [int(layer.max_cache_len) for layer in cache_layers(owner)
             if isinstance(getattr(layer, "max_cache_len", None), int) and not getattr(layer, "is_sliding", False)]
    return min(sizes) if sizes else None
