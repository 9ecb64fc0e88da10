"""Every state tensor a cache holds, snapshotted after a call, and the per-step comparisons of the GPU arms.

A snapshot is taken after `torch.cuda.synchronize()` (a host wait), so the `.cpu()` loop and `generate()` arms are
snapshotted after every call; the report's loop is compared only at the end (after its final synchronize), so
that the snapshot adds no host wait to the loop it measures.
"""
from __future__ import annotations

from typing import Any

import torch

from kvresume import compat
from kvresume.layers import has_linear_state
from ..compare import noise_floor
from .loops import GreedyRun, step_table
from .tracking import _kv

ATTENTION_KV = "attention K/V"
LINEAR_STATE = "linear conv/recurrent state"
State = dict[str, tuple[int, str, torch.Tensor]]


def layer_states(i: int, layer: Any) -> State:
    """The state tensors cache layer `i` holds right now: its K/V, then its conv/recurrent states."""
    out: State = {f"layer {i} {name}": (i, ATTENTION_KV, t) for name, t in zip(("keys", "values"), _kv(layer))}
    for kind in ("conv_states", "recurrent_states") if has_linear_state(layer) else ():
        for j, tensor in getattr(layer, kind).items():
            if tensor is not None and tensor.numel() > 0:
                out[f"layer {i} {kind}[{j}]"] = (i, LINEAR_STATE, tensor)
    return out


def state_tensors(cache: Any) -> State:
    """Every state tensor a cache holds: name -> (layer, kind, tensor), in layer order."""
    layers = compat.cache_layers(cache) if cache is not None else []
    return {name: t for i, layer in enumerate(layers) for name, t in layer_states(i, layer).items()}


def snapshot(cache: Any) -> State:
    """After torch.cuda.synchronize(): every state tensor copied to the host as float32."""
    torch.cuda.synchronize()
    return {k: (i, kind, t.detach().float().cpu().clone()) for k, (i, kind, t) in state_tensors(cache).items()}


def tagged(frame: Any, at: int = 0, **cols: Any) -> Any:
    """`frame` with the columns `cols` inserted in order from position `at` on."""
    for i, (k, v) in enumerate(cols.items()):
        frame.insert(at + i, k, v)
    return frame


def compare_logits(base: GreedyRun, again: GreedyRun, other: GreedyRun, dtype: torch.dtype, name: str) -> Any:
    """Per step: max |logit diff| of `other` vs offloading=False, the noise floor (the same run twice), matches/differs."""
    steps = step_table(base, other, noise=again)
    floors = [noise_floor(r, [a], dtype, what="offloading=False run twice") for r, a in zip(base.logits, again.logits)]
    steps["noise_threshold"] = [f.threshold for f in floors]
    steps["matches"] = [f.matches(v) for f, v in zip(floors, steps.max_abs_diff)]
    steps["differs"] = [f.differs(v) for f, v in zip(floors, steps.max_abs_diff)]
    return tagged(steps, variant=name)


def compare_states(base: list[State], again: list[State], other: list[State], dtype: torch.dtype, name: str,
                   calls: list[str], order: dict[tuple[int, int], int] | None = None) -> Any:
    """Per snapshot (taken after the call labelled in `calls`) and state tensor: max |diff| vs offloading=False against
    that tensor's noise floor, with the host-order index of the write that produced it ((call index, layer) -> index)."""
    import pandas as pd

    rows = []
    for label, ref, rep, oth in zip(calls, base, again, other):
        step = int(label.split()[-1]) if label.startswith("decode") else 0
        for tensor_name, (layer, kind, tensor) in ref.items():
            mine = oth.get(tensor_name)
            floor = noise_floor(tensor, [rep[tensor_name][2]], dtype, what="offloading=False run twice")
            same_shape = mine is not None and mine[2].shape == tensor.shape
            diff = float((mine[2] - tensor).abs().max()) if same_shape and tensor.numel() else float("inf")
            rows.append({"variant": name, "step": step, "call": label, "tensor": tensor_name, "layer": layer,
                         "kind": kind, "write_order": (order or {}).get((step, layer), layer),
                         "max_abs_diff": diff, "noise_threshold": floor.threshold,
                         "differs": (not same_shape) or floor.differs(diff)})
    return pd.DataFrame(rows, columns=["variant", "step", "call", "tensor", "layer", "kind", "write_order",
                                       "max_abs_diff", "noise_threshold", "differs"])


def first_difference(states: Any) -> dict[str, Any] | None:
    """The first state tensor beyond its floor: earliest snapshot, then the earliest write in host order (the wrap
    prefetch of the first offloaded layer comes after the last layer's update), then the lower layer."""
    bad = states.loc[states.differs.astype(bool)].sort_values(["step", "write_order", "layer"])  # lexsort: stable
    keys = ("variant", "call", "tensor", "layer", "kind", "write_order", "max_abs_diff", "noise_threshold")
    if bad.empty:
        return None
    row = bad.iloc[0]
    return {k: row[k].item() if hasattr(row[k], "item") else row[k] for k in keys}
