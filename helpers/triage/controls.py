"""The decision tree's controls, run on one model instance: what reaches the model, and what comes out.

Every continuation gets a deep copy of its cache. Failures are data: a failing step records the
error, the stage that raised (the innermost transformers function) and the decoder layer it was in.
The capture reads the first real model call (input, mask, position ids), the positions that reach the
text rotary embedding, and the attention mask each decoder layer's attention receives.
"""
from __future__ import annotations

import copy
import itertools
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from kvresume import compat
from ..compare import logit_metrics
from ..continuation import GENERATION_VARIANTS, describe_call, generation_kwargs
from .patterns import Resume, mask_positions
from kvresume import layers

ARG_SETS = tuple(GENERATION_VARIANTS)  # the seed's generation variants
FULL = "mask_only"  # the argument set of the working path: the full mask = physical length + suffix


@dataclass
class Step:
    """One continuation: first-step logits or the error, with what reached the model."""

    ok: bool
    logits: torch.Tensor | None = None
    call: dict[str, Any] = field(default_factory=dict)
    error_type: str = ""
    error: str = ""
    stage: str = ""


def _last_position(pos: Any) -> int | None:
    """The last column's position of the first row (batched: row 0, the unpadded one; M-RoPE: its first component)."""
    if not isinstance(pos, torch.Tensor) or pos.numel() == 0:
        return None
    return int(pos.reshape(-1, pos.shape[-1])[0, -1])


def _values(value: Any) -> list | None:
    return value.detach().flatten().tolist() if isinstance(value, torch.Tensor) and value.numel() <= 16 else None


@contextmanager
def watch(model: torch.nn.Module) -> Iterator[dict[str, Any]]:
    """Record the first model call, the first rotary positions, and per-layer attention masks of that call."""
    rec: dict[str, Any] = {"attention_masks": [], "layers_run": 0}

    def top(_m: torch.nn.Module, _a: tuple, kwargs: dict[str, Any]) -> None:
        if "input_ids_shape" not in rec:
            rec.update(describe_call(kwargs))
            rec["position_ids"] = _values(kwargs.get("position_ids"))
            rec["cache_position"] = _values(kwargs.get("cache_position"))
            cache = compat.cache_from_kwargs(kwargs)
            rec["layer_lengths"] = layers.lengths(cache) if cache is not None else None

    def rotary(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if "rotary_position" not in rec:
            rec["rotary_position"] = _last_position(kwargs.get("position_ids", args[1] if len(args) > 1 else None))

    def attention(index: int) -> Callable[..., None]:
        def hook(_m: torch.nn.Module, _a: tuple, kwargs: dict[str, Any]) -> None:
            rec["layers_run"], rec["last_layer"] = rec["layers_run"] + 1, index
            if len(rec["attention_masks"]) <= index:
                mask = kwargs.get("attention_mask")
                rec["attention_masks"].append(list(mask.shape) if isinstance(mask, torch.Tensor) else None)
        return hook

    attentions = [m for n, m in model.named_modules()
                  if n.endswith(".self_attn") and not any(v in n for v in ("visual", "vision"))]
    rope = compat.rotary_embedding(model)
    handles = [model.register_forward_pre_hook(top, with_kwargs=True),
               *([rope.register_forward_pre_hook(rotary, with_kwargs=True)] if rope is not None else []),
               *(mod.register_forward_pre_hook(attention(i), with_kwargs=True) for i, mod in enumerate(attentions))]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def _stage(exc: BaseException) -> str:
    """'path/inside/transformers.py:function' of the innermost transformers frame (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    inner = [f for f in frames if "/transformers/" in f.filename.replace("\\", "/")] or frames[-1:]
    if not inner:
        return ""
    f = inner[-1]
    return f"{f.filename.replace(chr(92), '/').rpartition('/transformers/')[2] or f.filename.rpartition('/')[2]}:{f.name}"


def run_step(model: torch.nn.Module, call: Callable[[], torch.Tensor]) -> Step:
    """Run one continuation under `watch`; the logits, or the error with its stage and layer."""
    with watch(model) as rec:
        try:
            logits = call()
        except Exception as exc:  # noqa: BLE001 - a failing continuation is a measurement
            rec["error_layer"] = rec.pop("last_layer", None)
            text = str(exc).strip().splitlines()
            return Step(False, None, rec, type(exc).__name__, (text[0] if text else "")[:300], _stage(exc))
    rec.pop("last_layer", None)
    return Step(True, logits, rec)


def full_mask(prompt: Resume, physical_length: int) -> torch.Tensor:
    """The full mask of a resume: the prompt's own mask (padding included) when the cache holds every processed
    column; otherwise one column per cached slot plus the suffix's mask."""
    mask = prompt.attention_mask
    if physical_length == prompt.processed:
        return mask
    return F.pad(mask[:, prompt.processed:], (physical_length, 0), value=1)


def full_kwargs(prompt: Resume, cache: Any) -> dict[str, torch.Tensor]:
    """generate()'s full mask for a resume from `cache` (its stored slots + the suffix), as keyword arguments."""
    return {"attention_mask": full_mask(prompt, int(cache.get_seq_length()))}


def logical_positions(model: torch.nn.Module, prompt: Resume, processed_length: int) -> torch.Tensor:
    """Explicit positions of the suffix tokens when `processed_length` tokens have passed: M-RoPE [3, batch, k] with
    the model's offset for a multimodal prompt, else the mask's positions [batch, k] (what generate() derives)."""
    shift = processed_length - prompt.processed
    delta = compat.get_rope_state(model) if prompt.is_multimodal else None
    if delta is None:
        return mask_positions(prompt.attention_mask)[:, prompt.processed:] + shift
    device = prompt.input_ids.device
    cols = torch.arange(prompt.processed, prompt.length, device=device) + shift
    return cols.view(1, 1, -1).expand(3, 1, -1) + delta.view(1, -1, 1).to(device)


def arg_kwargs(name: str, prompt: Resume, physical_length: int, positions: torch.Tensor) -> dict[str, Any]:
    """The seed's argument sets for a cache holding `physical_length` slots (identical rule for every cache)."""
    return generation_kwargs(name, prompt, positions, full_mask(prompt, physical_length))


# The one-step greedy contract every control's generate() keeps; a reporter's generate_kwargs go on top.
STEP_KWARGS = {"max_new_tokens": 1, "do_sample": False, "return_dict_in_generate": True, "output_logits": True}


@torch.no_grad()
def generate_step(model: torch.nn.Module, prompt: Resume, cache: Any, extra: dict[str, Any] | None = None,
                  copy_cache: bool = True, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Step:
    """generate(max_new_tokens=1, greedy) from a copy of `cache` (copy_cache=False: the object itself, as a reuse
    without deepcopy does) with the suffix (or `input_ids`); first-step logits.

    `extra`: the reporter's generate_kwargs, passed to this (and every) control's generate()."""
    options = {**STEP_KWARGS, **(extra or {}), **kwargs}
    ids = prompt.last_token if input_ids is None else input_ids

    def call() -> torch.Tensor:
        given = copy.deepcopy(cache) if copy_cache else cache
        out = model.generate(input_ids=ids, **{compat.generate_cache_kwarg(model): given}, **options)
        return compat.generate_logits(out)[0].detach().clone()

    return run_step(model, call)


@torch.no_grad()
def explicit_step(model: torch.nn.Module, prompt: Resume, cache: Any, positions: torch.Tensor) -> Step:
    """A direct forward from a copy of `cache` with explicit logical positions and the full mask (an engine's resume)."""
    physical = int(cache.get_seq_length())

    def call() -> torch.Tensor:
        out = model(input_ids=prompt.last_token, attention_mask=full_mask(prompt, physical), position_ids=positions,
                    use_cache=True, **{compat.cache_kwarg(model): copy.deepcopy(cache)})
        return out.logits[:, -1, :].detach().clone()

    return run_step(model, call)


def arg_set_steps(model: torch.nn.Module, prompt: Resume, cache: Any, positions: torch.Tensor,
                  extra: dict[str, Any] | None = None) -> dict[str, Step]:
    """generate() from `cache` under each of the seed's argument sets (`extra`: the reporter's generate_kwargs)."""
    physical = int(cache.get_seq_length())
    return {name: generate_step(model, prompt, cache, extra, **arg_kwargs(name, prompt, physical, positions)) for name in ARG_SETS}


def diff(a: Step | None, b: Step | None) -> float | None:
    """max |logit diff| between two steps that both ran (None otherwise)."""
    if a is None or b is None or not (a.ok and b.ok):
        return None
    return float(logit_metrics(a.logits, b.logits)["max_abs_diff"])


def spans(positions: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0-2, 5-6' (the original positions a layer kept)."""
    runs = [[p for _, p in run] for _, run in itertools.groupby(enumerate(positions), lambda ip: ip[1] - ip[0])]
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)

