"""Cache layers as transformers defines them: which hold K/V, which hold linear-attention state, what length.

Everything goes through transformers' own layer classes, attributes and methods (`update`,
`update_conv_state`, `update_recurrent_state`, `cumulative_length`); nothing of transformers is copied.
"""
from __future__ import annotations

from typing import Any

import torch

from . import compat


def has_kv(layer: Any) -> bool:
    """The layer stores attention keys/values (a full, sliding or mixed attention layer)."""
    keys = getattr(layer, "keys", None)
    return isinstance(keys, torch.Tensor)


def has_linear_state(layer: Any) -> bool:
    """The layer holds linear-attention conv/recurrent states (`LinearAttentionCacheLayerMixin`)."""
    return isinstance(getattr(layer, "conv_states", None), dict)


def is_sliding(layer: Any) -> bool:
    """A sliding-window attention layer (its class says `is_sliding`)."""
    return bool(getattr(layer, "is_sliding", False))


def layer_length(layer: Any) -> int | None:
    """What the layer reports as its processed length (`get_seq_length()`); None for a linear-only layer."""
    if not has_kv(layer) and has_linear_state(layer):
        return None
    return int(layer.get_seq_length())


def stored_width(layer: Any) -> int | None:
    """How many K/V slots the layer physically stores (None: no K/V)."""
    return int(layer.keys.shape[-2]) if has_kv(layer) else None  # pragma: no mutate - 4-D keys: axis 2 is axis -2


def lengths(cache: Any) -> list[int | None]:
    """Per layer: the reported processed length."""
    return [layer_length(layer) for layer in compat.cache_layers(cache)]


def widths(cache: Any) -> list[int | None]:
    """Per layer: the stored K/V width."""
    return [stored_width(layer) for layer in compat.cache_layers(cache)]


def copy_linear_state(source: Any, target: Any) -> None:
    """Copy every conv and recurrent state of `source` into `target` through the layer's own update methods,
    and the layer's own token count where the release keeps one (`compat.carry_linear_length`)."""
    for idx, conv in source.conv_states.items():
        if conv is not None:
            target.update_conv_state(conv.detach().clone(), idx, conv_kernel_size=source.conv_kernel_size.get(idx))
        recurrent = source.recurrent_states.get(idx)
        if recurrent is not None:
            target.update_recurrent_state(recurrent.detach().clone(), idx)
    compat.carry_linear_length(target, source)


def copy_processed_length(source: Any, target: Any) -> None:
    """A sliding layer's processed length (`cumulative_length`) set from the source layer's own attribute."""
    if hasattr(source, "cumulative_length") and hasattr(target, "cumulative_length"):
        value = source.cumulative_length
        target.cumulative_length = value.clone() if isinstance(value, torch.Tensor) else int(value)


def _equal(x: Any, y: Any) -> bool:
    """Both None, or tensors of one shape, bitwise equal."""
    if x is None or y is None:
        return x is None and y is None
    return x.shape == y.shape and torch.equal(x, y)


def layer_state_equal(a: Any, b: Any) -> bool:
    """Same layer class, K/V bits, reported length, linear states (bitwise) and linear token count where kept."""
    if type(a) is not type(b) or layer_length(a) != layer_length(b) or has_kv(a) != has_kv(b):
        return False
    if has_kv(a) and not (_equal(a.keys, b.keys) and _equal(a.values, b.values)):
        return False
    if not has_linear_state(a):
        return True
    own = (getattr(x, compat.LINEAR_LENGTH_ATTR, None) for x in (a, b))  # 5.25.0+: the layer's own count
    states = [(getattr(a, n), getattr(b, n)) for n in ("conv_states", "recurrent_states")]
    return _equal(*own) and all(sa.keys() == sb.keys() and all(_equal(sa[k], sb[k]) for k in sa) for sa, sb in states)


def cache_state_equal(a: Any, b: Any) -> bool:
    """Every layer equal as `layer_state_equal` says."""
    la, lb = compat.cache_layers(a), compat.cache_layers(b)
    return len(la) == len(lb) and all(layer_state_equal(x, y) for x, y in zip(la, lb))
