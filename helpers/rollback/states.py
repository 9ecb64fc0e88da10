"""Two caches compared by what they hold: K/V of the attention layers, conv and recurrent states of the linear
layers (max |diff|; inf where the shapes differ), and the length each reports."""
from __future__ import annotations

import math
from typing import Any

import torch

from kvresume import compat
from kvresume import layers


def max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """max |a - b| in float32; inf where the shapes differ; None where either is missing."""
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return math.inf
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def _worst(values: list[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def _held(t: torch.Tensor | None, held: int | None) -> torch.Tensor | None:
    return t if t is None or held is None else t[..., :held, :]


def state_diffs(cache: Any, reference: Any, held: int | None = None) -> dict[str, float | None]:
    """{'kv', 'kv_held', 'conv', 'recurrent'}: the largest max |diff| over the layers of that kind (None: no such
    layer); 'kv' over every stored slot, 'kv_held' over the first `held` slots (a static cache's slots past its length)."""
    kv, kv_held, conv, recurrent = [], [], [], []
    for a, b in zip(compat.cache_layers(cache), compat.cache_layers(reference)):
        if layers.has_kv(a) or layers.has_kv(b):
            ka, va = compat.layer_kv(a)
            kb, vb = compat.layer_kv(b)
            kv += [max_diff(ka, kb), max_diff(va, vb)]
            kv_held += [max_diff(_held(ka, held), _held(kb, held)), max_diff(_held(va, held), _held(vb, held))]
        if layers.has_linear_state(a) and layers.has_linear_state(b):
            conv += [max_diff(a.conv_states.get(i), b.conv_states.get(i)) for i in b.conv_states]
            recurrent += [max_diff(a.recurrent_states.get(i), b.recurrent_states.get(i)) for i in b.recurrent_states]
    return {"kv": _worst(kv), "kv_held": _worst(kv_held), "conv": _worst(conv), "recurrent": _worst(recurrent)}


def reported_length(cache: Any) -> int | None:
    """`get_seq_length()` as an int; None where it raises."""
    try:
        return int(cache.get_seq_length())
    except Exception:  # noqa: BLE001 - a cache that cannot say its length is a measurement
        return None
