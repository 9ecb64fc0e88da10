"""`resume(model, input_ids, cache, **generate_kwargs)`: the prefix-aware resume a user calls instead of generate().

With a ledger (helpers.api.ledger): keep the longest common prefix of `input_ids` (the whole sequence) and the cached
tokens (crop the rest, keeping at least one token to feed), feed what is not cached with the mask the cached slots
were written with + ones, and position_ids continuing each row's last kept position (the M-RoPE rows where the model
has them; the model's rope_deltas put back to the ledger's), then return generate()'s output. Without a ledger:
`guarded_generate` with the same arguments. A hybrid cache cropped below what its linear layers' recurrent state
summarises (helpers.api.linear_checks) is not reused: everything is re-prefilled into a new cache of its class. `apply_fix` applies a refusal's `fix` (crop / attention_mask /
position_ids / decoder_attention_mask) to a copy of a call's arguments: what notebook 08 runs for every refusal (a fix
`resume`: the whole sequence through `resume`, which the caller runs with its whole ids).
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from . import compat
from .guard import ResumeInputError, check_resume_inputs, guarded_generate
from .ledger import attach_ledger, cache_held, ledger_of, stored_ledger
from . import images
from .ledger_checks import next_positions
from .linear_checks import stale_of


def crop_to(cache: Any, n: int) -> Any:
    """Keep the first n cached tokens (a negative crop: the removal count, which every release takes), the ledger
    trimmed with it; returns the cache."""
    held = cache_held(cache)[0]
    if n < held:
        led = stored_ledger(cache)
        target = getattr(cache, "self_attention_cache", None) or cache
        target.crop(n - held)
        if led is not None:
            attach_ledger(cache, led.first(n))
    return cache


def resume(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **generate_kwargs: Any) -> Any:
    """generate() from `cache` for the whole sequence `input_ids`, reusing the longest cached common prefix."""
    led = ledger_of(cache)
    name = compat.generate_cache_kwarg(model)
    if led is None or led.batch != int(input_ids.shape[0]):  # untracked or stale, or rows to select: the guard says
        return guarded_generate(model, input_ids, **{name: cache}, **generate_kwargs)
    n = int(input_ids.shape[-1])
    keep = min(led.common_prefix(input_ids), n - 1)
    if generate_kwargs.get("assistant_model") is not None:
        keep = 0  # assisted decoding (5.17) re-feeds every given id and narrows the mask beside a cache: reuse nothing
    if stale_of(cache, led.length) is not None:  # linear layers cropped without rolling back: re-prefill all
        cache, keep = type(cache)(config=compat.text_config(model.config)), 0
    keep, generate_kwargs, mm_positions, mm_deltas = images.fit(model, cache, input_ids, generate_kwargs, keep,
                                                                led.length)  # images keyed by their pixels
    crop_to(cache, keep)
    kept = led.first(keep)
    suffix = input_ids[:, keep:]
    mask = torch.cat([kept.mask.to(input_ids.device), torch.ones_like(suffix)], 1)
    kwargs = {k: v for k, v in generate_kwargs.items() if k not in ("attention_mask", "position_ids")}
    if keep:
        positions = mm_positions if mm_positions is not None else _positions(model, kept, suffix, kwargs)
        kwargs["position_ids"] = positions.to(input_ids.device)
        deltas = mm_deltas if mm_deltas is not None else kept.rope_deltas
        if compat.rope_state_owner(model) is not None and deltas is not None:
            compat.set_rope_state(model, deltas.clone())
    kwargs["attention_mask"] = mask
    try:  # what this release's generate() feeds for these arguments, checked against the ledger (e.g. assisted
        check_resume_inputs(model, suffix, **{name: cache}, **kwargs)  # decoding re-feeds every given token)
    except ResumeInputError as exc:
        if not exc.fix or exc.fix.get("resume"):  # resume's own advice: nothing further to apply here
            raise
        cache, kwargs = apply_fix(exc.fix, cache, {"input_ids": suffix, **kwargs})
        suffix = kwargs.pop("input_ids")
    return model.generate(suffix, **{name: cache}, **kwargs)


def _positions(model: torch.nn.Module, kept: Any, suffix: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """The suffix's positions after the kept slots: text positions, or, where new images or videos come with it, the
    model's own M-RoPE positions of the suffix (get_rope_index from 0) shifted to each row's next position."""
    owner = compat.rope_state_owner(model)
    grids = {k: kwargs[k] for k in ("image_grid_thw", "video_grid_thw") if kwargs.get(k) is not None}
    if owner is None or not grids or not hasattr(owner, "get_rope_index"):
        return next_positions(kept, int(suffix.shape[-1]))
    extra = {"mm_token_type_ids": kwargs["mm_token_type_ids"]} if kwargs.get("mm_token_type_ids") is not None and \
        compat.accepts(owner.get_rope_index, "mm_token_type_ids") else {}
    local, _ = owner.get_rope_index(suffix, **grids, attention_mask=torch.ones_like(suffix), **extra)
    return local + kept.next_positions().view(1, -1, 1).to(local.device)


def apply_fix(fix: dict[str, Any], cache: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(a copy of the cache cropped where the fix says, the call's keyword arguments with the fix's replacements);
    `cache`: another cache (a rebuild with what was missing), `call`: other (input_ids, kwargs) altogether."""
    cache = copy.deepcopy(fix.get("cache", cache))
    if fix.get("crop") is not None:
        crop_to(cache, int(fix["crop"]))
    out = dict(kwargs)
    if fix.get("call") is not None:
        ids, other = fix["call"]
        keep = {k: v for k, v in kwargs.items() if k == "generation_config"}
        out = {**keep, "input_ids": ids, **other}
    for name in ("attention_mask", "position_ids", "decoder_attention_mask"):
        if fix.get(name) is not None:
            out[name] = fix[name]
    return cache, out
