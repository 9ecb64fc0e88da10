"""Per-slot content fingerprints: what a cache slot holds, read from the cache itself, so a ledger follows its rows.

A slot's fingerprint is the raw bits of the first `WIDTH` key values of head 0 in the last full-attention layer that
stores keys (`keys[:, 0, slot, :WIDTH]`): past the first layer a key depends on the whole context before it and on
its position (RoPE), and `index_select` / `batch_repeat_interleave` / `reorder_cache` / `crop` copy it bit for bit,
so equality is exact (bits, so NaN in a padded slot still equals itself). Sliding-window layers hold only their last
slots and are not read; a cache whose chosen layer does not hold every slot (a QuantizedCache keeps most of them
quantized) cannot be fingerprinted. Everything here stays on the cache's device: no host sync.
"""
from __future__ import annotations  # upstream: drop

from typing import Any

import torch

WIDTH = 8  # key values per slot (fewer where head_dim is smaller)
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _layers(cache: Any) -> list[Any]:
    owner = getattr(cache, "self_attention_cache", None) or cache
    return list(getattr(owner, "layers", None) or [])


def print_layer(cache: Any) -> int | None:
    """The index of the last non-sliding layer that stores 4-D keys, or None."""
    found = None
    for i, layer in enumerate(_layers(cache)):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4 and not getattr(layer, "is_sliding", False):
            found = i
    return found


def grown_length(cache: Any) -> tuple[int, int] | None:
    """(slots, rows) of the fingerprint layer where its keys hold exactly the written slots (a dynamic full-attention
    layer: no static buffer, nothing quantized), read from shapes alone; None otherwise. `get_seq_length()` may read a
    tensor (a linear layer's own count, 5.25.0+): a host sync this avoids in the decode path."""
    layers = _layers(cache)
    i = print_layer(cache)
    if i is None:
        return None
    layer = layers[i]
    if hasattr(layer, "max_cache_len") or hasattr(layer, "residual_length"):
        return None
    return int(layer.keys.shape[-2]), int(layer.keys.shape[0])


def bits(values: torch.Tensor) -> torch.Tensor:
    """The raw bits of float values as integers of the same width (exact equality, NaN == NaN)."""
    return values.view(_INT[values.element_size()]) if values.is_floating_point() else values


def slot_prints(cache: Any, layer: int | None, start: int, stop: int) -> torch.Tensor | None:
    """Fingerprints [batch, stop - start, WIDTH] of slots start..stop-1, or None where the layer does not hold them."""
    layers = _layers(cache)
    if layer is None or layer >= len(layers):
        return None
    keys = getattr(layers[layer], "keys", None)
    if not isinstance(keys, torch.Tensor) or keys.dim() != 4 or keys.shape[-2] < stop:
        return None
    return bits(keys[:, 0, start:stop, :WIDTH])


def match(now: torch.Tensor, recorded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per cache row and slot, the recorded row holding the same fingerprint: (index [B, S], found [B, S]).
    `now` [B, S, W], `recorded` [L, S, W]."""
    same = (now.unsqueeze(1) == recorded.unsqueeze(0)).all(-1)  # [B, L, S]
    return same.to(torch.uint8).argmax(1), same.any(1)


def unfollowed(cache: Any) -> str | None:
    """Why the ledger cannot follow this cache's slots (a layer that keeps them quantized), or None."""
    for layer in _layers(cache):
        if hasattr(layer, "_quantized_keys") or hasattr(layer, "residual_length"):
            return (f"{type(layer).__name__} keeps its slots quantized (only the last residual_length ones as keys), "
                    f"and re-quantizes them as it grows: no slot's content can be fingerprinted")
    return None
