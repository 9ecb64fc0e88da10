"""The repairs each leaf prescribes, run by the kit on the rebuilt cache, and the localization of a copy defect.

Each repair is one generate() step (the notebook's greedy one-step contract) from a deep copy of the rebuilt cache,
measured against the full forward: the full mask; the saved model-side state restored; the same K/V re-registered
through `update()` on `DynamicCache(config=...)` (`helpers.families.rebuilds.layer_aware`); continuing at the
processed length (position_ids at it, the mask sized to the stored slots). A copy defect has no generic repair:
`localize` finds the first differing layer and slot and whether the keys differ only by a rotation.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from kvresume import compat
from ..compare import NoiseFloor, logit_metrics
from kvresume import layers
from ..families import rebuilds as family
from .controls import Step, diff, full_kwargs, generate_step, logical_positions
from .facts import Repair
from .state import stored_slots
from .slots import compare
from .walk import AT_PROCESSED, CROP, FULL_MASK, POSITION_ORDER, REFEED, REREGISTER, SAVED_STATE


def as_repair(name: str, step: Step, reference: torch.Tensor, unrepaired: Step | None = None) -> Repair:
    """A repaired step -> Repair (max |diff| vs the full forward; the error and stage when it raised)."""
    return Repair(name, diff(step, Step(True, reference)), step.ok, "" if step.ok else f"{step.error_type} at {step.stage}",
                  diff(step, unrepaired) if unrepaired is not None else None)


def reregistered(cache: Any, model: torch.nn.Module, processed: int | None = None) -> Any:
    """The same stored K/V (and linear states) registered through update() on DynamicCache(config=...); a sliding layer
    that then reports fewer tokens than were processed (its source never counted them) gets the processed length."""
    again = family.layer_aware(cache, model.config)
    for layer in compat.cache_layers(again):
        if processed is not None and hasattr(layer, "cumulative_length") and layers.layer_length(layer) < processed:
            layer.cumulative_length = processed
    return again


def cropped(cache: Any, original: Any, model: torch.nn.Module) -> Any:
    """`cache` with every attention layer cut back to the slots the original's layer stores (a DynamicCache's
    crop(processed length), through transformers' own layer classes so sliding and hybrid layers take it too)."""
    keep = [stored_slots(layer) for layer in compat.cache_layers(original)]
    return family.layer_aware(cache, model.config, lambda i, k, v: [(k[..., :keep[i], :], v[..., :keep[i], :])])


def in_position_order(cache: Any, original: Any) -> Any:
    """A copy of `cache` with each layer's retained slots put back in the original's position order (per KV head where
    each head keeps its own): the same K/V, only their order changes."""
    again = copy.deepcopy(cache)
    for layer, s in zip(compat.cache_layers(again), compare(original, cache)):
        idx = s.heads or ([[m[1] for m in s.matches]] if s.matches and None not in s.matches else None)
        if not layers.has_kv(layer) or not idx:
            continue
        order = torch.tensor(idx, device=layer.keys.device).argsort(dim=-1).expand(layer.keys.shape[1], -1)
        gather = order[None, :, :, None].expand(layer.keys.shape[0], -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return again


def run_all(base: Any, cache: Any, unrepaired: dict[str, Step], state_after: torch.Tensor | None,
            fresh: dict[str, Step] | None = None, resume_on: str = "same_instance", slots: str = "same") -> dict[str, Repair]:
    """Every repair that applies to `cache` (a `run.Baseline` for the model, prompt, reference and saved state);
    `unrepaired`: generate()'s steps from the rebuilt cache as the user resumes it ('full' and 'resumed'); `slots`:
    the slot comparison's verdict (a short prefix gets the re-feed, extra slots the crop)."""
    model, prompt, ref, kw = base.model, base.prompt, base.reference, base.generate_kwargs
    out = {FULL_MASK: as_repair(FULL_MASK, unrepaired["full"], ref)}
    mask = full_kwargs(prompt, cache)

    def repair(name: str, fixed: Any, against: str = "full", **kwargs: Any) -> None:
        """generate() from `fixed` (the full mask sized to it unless given); then the rebuild's state put back."""
        kwargs = kwargs or full_kwargs(prompt, fixed)
        out[name] = as_repair(name, generate_step(model, prompt, fixed, kw, **kwargs), ref, unrepaired[against])
        compat.put_rope_state(model, state_after)

    if base.saved_state is not None and resume_on == "fresh_instance" and fresh:
        out[SAVED_STATE] = as_repair(SAVED_STATE, fresh["fresh instance, state restored"], ref, unrepaired["full"])
    elif base.saved_state is not None:
        compat.put_rope_state(model, base.saved_state)
        repair(SAVED_STATE, cache)
    compat.put_rope_state(model, state_after)
    try:
        again = reregistered(cache, model, prompt.processed)
    except Exception as exc:  # noqa: BLE001 - a cache transformers' path cannot take is a measurement
        out[REREGISTER] = Repair(REREGISTER, None, False, f"{type(exc).__name__} while re-registering: {str(exc)[:120]}")
    else:
        repair(REREGISTER, again)
    if slots == "prefix_short":  # the whole ids: generate() feeds what the cache lacks
        repair(REFEED, cache, input_ids=prompt.input_ids, attention_mask=prompt.attention_mask)
    if slots == "extra":
        repair(CROP, cropped(cache, base.prefix_cache, model))
    if slots == "reordered":  # the order shown harmless (or not): the same slots in position order
        repair(POSITION_ORDER, in_position_order(cache, base.prefix_cache), **mask)
    repair(AT_PROCESSED, cache, "resumed", position_ids=logical_positions(model, prompt, prompt.processed), **mask)
    compat.put_rope_state(model, base.saved_state)
    return out


def rotation_only(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    """Keys per rotary pair (i, i + d/2, transformers' rotate_half): norms equal within the dtype's resolution while
    the angles differ means RoPE applied at other positions; norms that differ mean other content."""
    half = a.shape[-1] // 2
    fa, fb = a.float(), b.float()
    na = torch.hypot(fa[..., :half], fa[..., half:2 * half])
    nb = torch.hypot(fb[..., :half], fb[..., half:2 * half])
    tol = 16 * torch.finfo(a.dtype).eps * float(na.abs().max().clamp_min(1e-30))
    norm_gap = float((na - nb).abs().max())
    angle = torch.atan2(fa[..., half:2 * half], fa[..., :half]) - torch.atan2(fb[..., half:2 * half], fb[..., :half])
    angle = torch.remainder(angle + torch.pi, 2 * torch.pi) - torch.pi
    norms_equal = norm_gap <= tol
    angles_differ = float(angle.abs().max()) > 0
    return {"keys_differ_by": "rotation only (RoPE applied at other positions)" if norms_equal and angles_differ else "content",
            "pair_norm_max_gap": norm_gap, "pair_norm_tolerance": tol, "pair_angle_max_gap": float(angle.abs().max())}


def localize(original: Any, rebuilt: Any) -> dict[str, Any]:
    """The first layer and slot where the stored K/V differ (same shapes), keys or values, and for keys whether only
    a rotation tells them apart; {} when no layer of matching shape differs (the slot comparison says what differs)."""
    for i, (a, b) in enumerate(zip(compat.cache_layers(original), compat.cache_layers(rebuilt))):
        if not (layers.has_kv(a) and layers.has_kv(b)) or a.keys.shape != b.keys.shape or a.values.shape != b.values.shape:
            continue
        kd, vd = (a.keys != b.keys), (a.values != b.values)
        if not (kd.any() or vd.any()):
            continue
        slots = (kd.flatten(0, 1).any(0).any(-1) | vd.flatten(0, 1).any(0).any(-1)).nonzero()
        which = "keys and values" if kd.any() and vd.any() else "keys" if kd.any() else "values"
        out = {"layer": i, "slot": int(slots[0]), "differs_in": which,
               "keys_max_abs_diff": float((a.keys.float() - b.keys.float()).abs().max()),
               "values_max_abs_diff": float((a.values.float() - b.values.float()).abs().max())}
        if kd.any():
            out.update(rotation_only(a.keys, b.keys))
        return out
    return {}


def topk_kept(reference: torch.Tensor, step: Step, floor: NoiseFloor, k: int = 5) -> dict[str, Any]:
    """Whether the rebuilt step keeps the full forward's top-1 and top-k, and its max |diff| against the floor."""
    if not step.ok:
        return {"ran": False, "error": f"{step.error_type} at {step.stage}"}
    m = logit_metrics(reference, step.logits, k)
    return {"top1_kept": m["top1_equal"], f"top{k}_kept": m[f"top{k}_overlap"] == k, f"top{k}_overlap": m[f"top{k}_overlap"],
            "max_abs_diff": m["max_abs_diff"], "noise_threshold": floor.threshold,
            "times_threshold": m["max_abs_diff"] / floor.threshold if floor.threshold else None}
