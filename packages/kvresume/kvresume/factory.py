"""A validated K/V factory: the control's proposed `DynamicCache.from_kv_tensors()`, prototyped outside transformers.

`kv_cache_from_tensors(kv_pairs, config)` checks the tensors against the config and against each other, refuses
with one `FactoryError` naming the first mismatch, and returns transformers' own `DynamicCache(config=...)`:
the layer classes come from the config (`layer_types`), K/V go in through `update()`, a sliding layer's processed
length through its own `cumulative_length`, a linear-attention layer's conv/recurrent states through
`update_conv_state` / `update_recurrent_state` (kvresume.layers). Nothing of transformers is copied.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

import torch

from . import compat
from .compat import kv_geometry
from . import layers
from .ledger import attach_ledger, ledger_from_tensors

LinearStates = dict[str, dict[int, torch.Tensor]]  # {"conv": {state_idx: t}, "recurrent": {state_idx: t}}


class FactoryError(ValueError):
    """K/V tensors that do not fit the config (or each other); the message names the first mismatch."""


def layer_types(text: Any) -> list[str]:
    """The decoder's per-layer types (`full_attention` everywhere where the config lists none)."""
    types = getattr(text, "layer_types", None)
    return list(types) if types else ["full_attention"] * int(text.num_hidden_layers)


def _check_pair(i: int, pair: Any, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention layer's (keys, values): tensors, rank 4, [batch, heads, length, head_dim], K and V alike."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise FactoryError(f"layer {i}: expected a (keys, values) pair of tensors, got {type(pair).__name__}")
    keys, values = pair
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise FactoryError(f"layer {i}: keys and values must be tensors, got {type(keys).__name__}/{type(values).__name__}")
    if keys.dim() != 4:
        raise FactoryError(f"layer {i}: K/V rank: keys have rank {keys.dim()} {list(keys.shape)}, "
                           f"expected 4 [batch, {heads}, length, {head_dim}]")
    if keys.shape != values.shape:
        raise FactoryError(f"layer {i}: K vs V shapes: keys {list(keys.shape)} != values {list(values.shape)}")
    if int(keys.shape[1]) != heads:
        raise FactoryError(f"layer {i}: K/V heads: {keys.shape[1]} in {list(keys.shape)}, the config has "
                           f"num_key_value_heads={heads}")
    if int(keys.shape[-1]) != head_dim:
        raise FactoryError(f"layer {i}: head_dim: {keys.shape[-1]} in {list(keys.shape)}, the config has head_dim={head_dim}")
    if keys.dtype != values.dtype or keys.device != values.device:
        raise FactoryError(f"layer {i}: keys are {keys.dtype} on {keys.device}, values {values.dtype} on {values.device}")
    return keys, values


def _check_linear(i: int, pair: Any, states: LinearStates | None) -> None:
    """A linear-attention layer takes conv/recurrent states, never K/V."""
    if pair is not None:
        raise FactoryError(f"layer {i}: linear-attention layer (layer_types[{i}] = 'linear_attention') given K/V; "
                           f"pass None here and its conv/recurrent states in linear_states[{i}]")
    if not states or not isinstance(states, dict) or not (states.get("conv") or states.get("recurrent")):
        raise FactoryError(f"layer {i}: linear-attention layer without conv/recurrent states: pass linear_states[{i}] = "
                           f"{{'conv': {{0: tensor}}, 'recurrent': {{0: tensor}}}}")


def _check_common(checked: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """dtype, device and batch size agree across the attention layers."""
    first = min(checked, default=None)
    for i, (keys, _) in sorted(checked.items()):
        k0 = checked[first][0]
        for what, got, want in (("dtype", keys.dtype, k0.dtype), ("device", keys.device, k0.device),
                                ("batch size", int(keys.shape[0]), int(k0.shape[0]))):
            if got != want:
                raise FactoryError(f"layer {i}: {what} {got}, layer {first} has {want}")


def _check_lengths(text: Any, types: list[str], checked: dict[int, tuple[torch.Tensor, torch.Tensor]],
                   processed_length: int | None) -> None:
    """Sliding layers hold at most their window; the processed length is at least every layer's stored slots."""
    window = getattr(text, "sliding_window", None)
    for i, (keys, _) in sorted(checked.items()):
        slots = int(keys.shape[2])  # rank 4 (_check_pair): [batch, heads, slots, head_dim]
        if types[i] == "sliding_attention" and window is not None and slots > int(window):
            raise FactoryError(f"layer {i}: sliding layer given {slots} slots, more than its window sliding_window={window}")
        if processed_length is not None and processed_length < slots:
            raise FactoryError(f"layer {i}: processed_length {processed_length} is smaller than the {slots} slots it stores")
    if processed_length is None and any(types[i] == "sliding_attention" and window is not None
                                        and int(k.shape[2]) >= int(window) - 1 for i, (k, _) in checked.items()):
        raise FactoryError("processed_length: a sliding layer holds a full window, so how many tokens it has seen "
                           "is not in its K/V; pass processed_length")


def validate(kv_pairs: Sequence[Any], config: Any, processed_length: int | None = None,
             linear_states: dict[int, LinearStates] | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Raise FactoryError naming the first mismatch; returns {attention layer index: (keys, values)}."""
    text = compat.text_config(config)
    types = layer_types(text)
    if len(kv_pairs) != len(types):
        raise FactoryError(f"layer count: {len(kv_pairs)} entries given, the config has {len(types)} layers")
    if processed_length is not None and (isinstance(processed_length, bool) or not isinstance(processed_length, int)
                                         or processed_length < 0):
        raise FactoryError(f"processed_length: {processed_length!r} is not a non-negative int")
    heads, head_dim = kv_geometry(text)
    checked: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i, pair in enumerate(kv_pairs):
        if types[i] == "linear_attention":
            _check_linear(i, pair, (linear_states or {}).get(i))
        elif pair is None:
            raise FactoryError(f"layer {i}: attention layer (layer_types[{i}] = {types[i]!r}) given no K/V")
        else:
            checked[i] = _check_pair(i, pair, heads, head_dim)
    _check_common(checked)
    _check_lengths(text, types, checked, processed_length)
    return checked


def kv_cache_from_tensors(kv_pairs: Sequence[Any], config: Any, *, processed_length: int | None = None,
                          linear_states: dict[int, LinearStates] | None = None, token_ids: torch.Tensor | None = None,
                          positions: torch.Tensor | None = None) -> Any:
    """A validated `DynamicCache(config=...)` holding these K/V (and linear states); FactoryError on a mismatch.
    `token_ids` [batch, slots] (and `positions` [batch, slots] or [3, batch, slots], default 0..slots-1): the token
    ledger the guard reads (kvresume.ledger), one entry per stored slot."""
    checked = validate(kv_pairs, config, processed_length, linear_states)
    ledger = _ledger(checked, token_ids, positions)
    cache = compat.dynamic_cache(compat.text_config(config))
    built = compat.cache_layers(cache)
    for i, states in sorted((linear_states or {}).items()):
        source = SimpleNamespace(conv_states=dict(states.get("conv") or {}),
                                 recurrent_states=dict(states.get("recurrent") or {}),
                                 conv_kernel_size=dict(states.get("conv_kernel_size") or {}))
        layers.copy_linear_state(source, built[i])
        compat.carry_linear_length(built[i], processed_length if processed_length is not None
                                   else max((int(k.shape[2]) for k, _ in checked.values()), default=0))
    for i, (keys, values) in sorted(checked.items()):
        cache.update(keys.detach().clone(), values.detach().clone(), i)
        if processed_length is not None and layers.is_sliding(built[i]):
            layers.copy_processed_length(SimpleNamespace(cumulative_length=processed_length), built[i])
    return attach_ledger(cache, ledger)  # None: a fresh cache, nothing to remove


def _ledger(checked: dict[int, tuple[torch.Tensor, torch.Tensor]], token_ids: torch.Tensor | None,
            positions: torch.Tensor | None) -> Any:
    """The ledger of the given ids and positions, checked against the stored slots (None where no ids are given)."""
    if token_ids is None:
        if positions is not None:
            raise FactoryError("positions given without token_ids: the ledger needs both (or token_ids alone)")
        return None
    ledger = ledger_from_tensors(token_ids, positions)
    if checked:
        keys = checked[min(checked)][0]
        if (ledger.batch, ledger.length) != (int(keys.shape[0]), int(keys.shape[2])):
            raise FactoryError(f"token_ids: {ledger.batch} rows x {ledger.length} slots, the K/V hold "
                               f"{keys.shape[0]} x {keys.shape[2]}")
    if ledger.positions.shape[1:] != ledger.token_ids.shape:
        raise FactoryError(f"positions: shape {list(ledger.positions.shape)} does not match token_ids "
                           f"{list(ledger.token_ids.shape)}")
    return ledger


def export_tensors(cache: Any) -> tuple[list[Any], dict[int, LinearStates], int]:
    """(kv_pairs, linear_states, processed_length) of a cache: what `kv_cache_from_tensors` takes back."""
    pairs: list[Any] = []
    states: dict[int, LinearStates] = {}
    for i, layer in enumerate(compat.cache_layers(cache)):
        pairs.append((layer.keys.detach().clone(), layer.values.detach().clone()) if layers.has_kv(layer) else None)
        if layers.has_linear_state(layer):
            states[i] = {"conv": {k: v.detach().clone() for k, v in layer.conv_states.items() if v is not None},
                         "recurrent": {k: v.detach().clone() for k, v in layer.recurrent_states.items() if v is not None},
                         "conv_kernel_size": dict(getattr(layer, "conv_kernel_size", None) or {})}
    return pairs, states, int(cache.get_seq_length())
