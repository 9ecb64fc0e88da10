"""The rebuilds notebook 07 compares: the control's loop exactly as written, and the family-aware identity.

`control_rebuild` is the control's variant B verbatim (`DynamicCache()` + `update(layer.keys, layer.values, i)`):
on a sliding layer it rebuilds a plain `DynamicLayer` of the stored width, on a linear-attention layer it
raises (there are no keys to read). `attention_only_rebuild` is the variant a reporter would try next: the
attention layers' K/V `update()`d into a config-aware cache, the linear layers left empty. `family_rebuild`
is the identity done through each layer's own class: a config-aware `DynamicCache`, K/V `update()`d, a
sliding layer's `cumulative_length` copied, conv/recurrent states copied with `update_conv_state` /
`update_recurrent_state`. `layer_aware` is the same with a K/V transform (notebook 06's compressions).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from transformers import DynamicCache

from kvresume import compat
from kvresume.layers import copy_linear_state, copy_processed_length, has_kv, has_linear_state

# (layer index, keys, values) -> the (keys, values) chunks to update() in order
KVTransform = Callable[[int, torch.Tensor, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]

CONTROL_HOW = "DynamicCache() + update(layer.keys, layer.values, i) per layer (the control's loop)"


def control_rebuild(cache: Any) -> DynamicCache:
    """The control's rebuild, as it wrote it (detach/clone as in its variant B)."""
    rebuilt = DynamicCache()
    for layer_idx, layer in enumerate(cache.layers):
        rebuilt.update(layer.keys.detach().clone(), layer.values.detach().clone(), layer_idx)
    return rebuilt


def attention_only_rebuild(cache: Any, config: Any) -> DynamicCache:
    """K/V of the attention layers into a config-aware cache; linear-attention layers get no state."""
    rebuilt = compat.dynamic_cache(compat.text_config(config))
    for layer_idx, layer in enumerate(compat.cache_layers(cache)):
        if has_kv(layer):
            rebuilt.update(layer.keys.detach().clone(), layer.values.detach().clone(), layer_idx)
    return rebuilt


def _identity(_i: int, keys: torch.Tensor, values: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(keys.detach().clone(), values.detach().clone())]


def layer_aware(cache: Any, config: Any, transform: KVTransform = _identity) -> DynamicCache:
    """A config-aware cache built layer by layer through transformers' layer classes, K/V passed through `transform`.

    Attention layers: each chunk `transform` returns is `update()`d; a sliding layer then gets the source's
    `cumulative_length` (what it has processed, not what it stores). Linear-attention layers: conv and
    recurrent states copied with the layer's own update methods (never transformed).
    """
    rebuilt = compat.dynamic_cache(compat.text_config(config))
    layers = compat.cache_layers(rebuilt)
    for i, layer in enumerate(compat.cache_layers(cache)):
        if has_linear_state(layer):
            copy_linear_state(layer, layers[i])
        if has_kv(layer):
            for keys, values in transform(i, layer.keys, layer.values):
                rebuilt.update(keys, values, i)
            copy_processed_length(layer, layers[i])
    return rebuilt


def family_rebuild(cache: Any, config: Any) -> DynamicCache:
    """The family-aware identity rebuild: `layer_aware` with K/V copied as they are."""
    return layer_aware(cache, config)
