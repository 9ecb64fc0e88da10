"""Per-slot content fingerprints: what a cache slot holds, read from the cache itself, so a ledger follows its rows.

A slot's fingerprint is the raw bits of the first `WIDTH` key values of head 0 in the last full-attention layer that
stores keys (`keys[:, 0, slot, :WIDTH]`): past the first layer a key depends on the whole context before it and on
its position (RoPE), and `index_select` / `batch_repeat_interleave` / `reorder_cache` / `crop` copy it bit for bit,
so equality is exact (bits, so NaN in a padded slot still equals itself). Sliding-window layers hold only their last
slots and are not read; a cache whose chosen layer does not hold every slot (a QuantizedCache keeps most of them
quantized) cannot be fingerprinted. Everything here stays on the cache's device: no host sync.
"""
from __future__ import annotations

from typing import Any

import torch

WIDTH = 8  # key values per slot (fewer where head_dim is smaller)
LAYER_ATTR = "kv_print_layer"  # on the cache: the layer its fingerprints are read from
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _layers(cache: Any) -> list[Any]:
    owner = getattr(cache, "self_attention_cache", None) or cache
    return list(getattr(owner, "layers", None) or [])


def print_layer(cache: Any) -> int | None:
    """The index of the last non-sliding layer that stores 4-D keys; else of the last sliding one (it shows only its
    window: `window_start`); None without either."""
    found = sliding = None
    for i, layer in enumerate(_layers(cache)):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:
            if getattr(layer, "is_sliding", False):
                sliding = i
            else:
                found = i
    return found if found is not None else sliding


def window_start(cache: Any, layer: int, held: int) -> int | None:
    """The first slot a sliding layer's keys show (it keeps its last ones) when the cache holds `held`; None for a
    layer that shows every slot from 0."""
    lay = _layers(cache)[layer]
    return held - int(lay.keys.shape[-2]) if getattr(lay, "is_sliding", False) else None  # pragma: no mutate - 4-D keys


def known_layer(cache: Any) -> int | None:
    """`print_layer`, remembered on the cache (checked to still hold 4-D keys; searched again otherwise)."""
    owner = getattr(cache, "self_attention_cache", None) or cache
    layers = getattr(owner, "layers", None) or []
    i = owner.__dict__.get(LAYER_ATTR)
    if i is not None and i < len(layers):
        keys = getattr(layers[i], "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:
            return i
    i = print_layer(cache)
    if i is not None:
        owner.__dict__[LAYER_ATTR] = i
    return i


def bits(values: torch.Tensor) -> torch.Tensor:
    """The raw bits of float values as integers of the same width (exact equality, NaN == NaN)."""
    return values.view(_INT[values.element_size()]) if values.is_floating_point() else values  # pragma: no mutate - ints view as themselves


def window_prints(cache: Any, layer: int, start: int, stop: int) -> torch.Tensor | None:
    """A sliding layer's fingerprints of slots start..stop-1 (stop: the slots held), zeros for those it no longer
    shows (a prefill longer than its window: never compared, they are gone); a copy. None: nothing shown."""
    keys = _layers(cache)[layer].keys
    first = stop - int(keys.shape[-2])  # pragma: no mutate - 4-D keys: axis 2 is axis -2
    if first >= stop:
        return None
    shown = key_prints(keys, max(start, first) - first, stop - first).clone()
    if start >= first:  # pragma: no mutate - at start == first the zeros below are 0 wide
        return shown
    return torch.cat([shown.new_zeros(shown.shape[0], first - start, shown.shape[-1]), shown], 1)


def slot_prints(cache: Any, layer: int | None, start: int, stop: int) -> torch.Tensor | None:
    """Fingerprints [batch, stop - start, WIDTH] of slots start..stop-1 (a view of the keys: compared as `bits`), or
    None where the layer does not hold them."""
    owner = getattr(cache, "self_attention_cache", None) or cache
    layers = owner.layers
    if layer is None or layer >= len(layers):
        return None
    keys = getattr(layers[layer], "keys", None)
    if not isinstance(keys, torch.Tensor) or keys.dim() != 4 or keys.shape[-2] < stop:  # pragma: no mutate - 4-D keys
        return None
    return key_prints(keys, start, stop)


def key_prints(keys: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """keys[:, 0, start:stop, :WIDTH] as one view op (the decode path's cost is per op)."""
    s = keys.stride()
    return keys.as_strided((keys.shape[0], stop - start, min(WIDTH, keys.shape[-1])), (s[0], s[2], s[3]),
                           keys.storage_offset() + start * s[2])


def grown_layer(cache: Any, i: int | None) -> Any:
    """The fingerprint layer where its keys grow with the writes (no static buffer, nothing quantized), else None."""
    if i is None:
        return None
    layer = (getattr(cache, "self_attention_cache", None) or cache).layers[i]
    return None if hasattr(layer, "max_cache_len") or hasattr(layer, "residual_length") or \
        getattr(layer, "is_sliding", False) else layer


def match(now: torch.Tensor, recorded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per cache row and slot, the recorded row holding the same fingerprint: (index [B, S], found [B, S]).
    `now` [B, S, W], `recorded` [L, S, W]."""
    same = (bits(now).unsqueeze(1) == bits(recorded).unsqueeze(0)).all(-1)  # [B, L, S]
    return same.to(torch.uint8).argmax(1), same.any(1)


def unfollowed(cache: Any) -> str | None:
    """Why the ledger cannot follow this cache's slots (a layer that keeps them quantized), or None."""
    for layer in _layers(cache):
        if hasattr(layer, "_quantized_keys") or hasattr(layer, "residual_length"):
            return (f"{type(layer).__name__} keeps its slots quantized (only the last residual_length ones as keys), "
                    f"and re-quantizes them as it grows: no slot's content can be fingerprinted")
    return None
