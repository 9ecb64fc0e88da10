"""`track(model)`: record a token ledger (helpers.api.ledger) for every forward call and generate() that writes to a cache.

Hooks only, nothing patched: a forward pre-hook on the model reads the cache, the ids (the decoder's for an
encoder-decoder; embeddings are recorded as unknown ids), the mask and the cache's length before the call; a pre-hook
on the text rotary embedding reads the positions the model actually rotates with (the 3 M-RoPE rows where the model
has them; a model without a rotary embedding: the cache positions); the forward hook appends one ledger entry per
written slot and the model-side state (`rope_deltas`) after the call. A cache that was written before tracking started
(or while untracked) gets no ledger: it stays untracked. `first_positions(model)` is the same rotary read for one call.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import compat
from .compat import rotary_embedding
from .linear_checks import note_linear
from .ledger import (UNKNOWN, Ledger, attach_ledger, cache_held, empty_ledger,
                     ledger_of)

HANDLE_ATTR = "_kv_ledger_tracker"


def _decoder(model: torch.nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def fed_ids(model: torch.nn.Module, kwargs: dict[str, Any]) -> tuple[torch.Tensor | None, int | None, int | None]:
    """(ids or None for embeddings, batch, tokens) of one forward call."""
    prefix = "decoder_" if _decoder(model) else ""
    ids, embeds = kwargs.get(f"{prefix}input_ids"), kwargs.get(f"{prefix}inputs_embeds")
    if isinstance(ids, torch.Tensor):
        ids = ids.view(1, -1) if ids.dim() == 1 else ids
        return ids, int(ids.shape[0]), int(ids.shape[-1])
    if isinstance(embeds, torch.Tensor):
        return None, int(embeds.shape[0]), int(embeds.shape[1])
    return None, None, None


def as_rows(positions: torch.Tensor, batch: int, f: int) -> torch.Tensor:
    """Positions as [rows, batch, f]: 1-D/2-D ids as one row, 3-row M-RoPE ids as they are, 4 rows less the text row."""
    p = positions.long()
    if p.dim() == 3 and p.shape[0] == 4:
        p = p[1:]
    if p.dim() == 1:
        p = p.view(1, 1, -1)
    elif p.dim() == 2:
        p = p.unsqueeze(0)
    p = p[..., -f:]
    return p.expand(p.shape[0], batch, p.shape[-1]) if p.shape[1] == 1 and batch != 1 else p


def rotary_positions(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The position ids a rotary embedding's forward received."""
    value = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    return value if isinstance(value, torch.Tensor) else None


@dataclass
class _Pending:
    cache: Any
    base: Ledger
    past: int
    ids: torch.Tensor | None
    batch: int
    f: int
    mask: Any
    positions: torch.Tensor | None = None


@dataclass
class Tracker:
    """The hooks `track` put on one model; `remove()` takes them off."""

    model: torch.nn.Module
    handles: list[Any] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.model.__dict__.pop(HANDLE_ATTR, None)

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _slot_mask(mask: Any, batch: int, f: int) -> torch.Tensor:
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] >= f and mask.shape[0] == batch:
        return mask[:, -f:].long()
    return torch.ones(batch, f, dtype=torch.long)


def _pre(tracker: Tracker) -> Callable[..., None]:
    def pre(_m: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        cache = compat.cache_from_kwargs(kwargs)  # None: the model makes its own (read from the output)
        ids, batch, f = fed_ids(tracker.model, kwargs)
        tracker.pending[:] = [None]  # type: ignore[list-item]
        if f is None or f == 0 or kwargs.get("use_cache") is False:
            return
        past = cache_held(cache)[0] if cache is not None else 0
        base = ledger_of(cache) if past else empty_ledger(batch)
        if base is None or base.batch != batch:
            return  # written while untracked, or rows the ledger cannot map: the cache stays untracked
        mask = kwargs.get("decoder_attention_mask" if _decoder(tracker.model) else "attention_mask")
        given = kwargs.get("decoder_position_ids" if _decoder(tracker.model) else "position_ids")
        pending = _Pending(cache, base, past, ids, batch, f, mask)
        if isinstance(given, torch.Tensor) and rotary_embedding(tracker.model) is None:
            pending.positions = as_rows(given, batch, f)
        tracker.pending[:] = [pending]  # type: ignore[list-item]
    return pre


def _rotary(tracker: Tracker) -> Callable[..., None]:
    def rotary(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        pending = tracker.pending[-1] if tracker.pending else None
        positions = rotary_positions(args, kwargs)
        if pending is not None and pending.positions is None and positions is not None:
            pending.positions = as_rows(positions, pending.batch, pending.f)
    return rotary


def _post(tracker: Tracker) -> Callable[..., None]:
    def post(_m: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], out: Any) -> None:
        pending = tracker.pending.pop() if tracker.pending else None
        if pending is None:
            return
        if pending.cache is None:
            pending.cache = compat.output_cache(out)
            if pending.cache is None:
                return
        written = cache_held(pending.cache)[0] - pending.past
        if written != pending.f:  # the cache did not take f slots (a layout the ledger cannot follow): untracked
            attach_ledger(pending.cache, None)
            return
        ids = pending.ids if pending.ids is not None else torch.full((pending.batch, pending.f), UNKNOWN)
        positions = pending.positions
        if positions is None:
            positions = (pending.past + torch.arange(pending.f)).view(1, 1, -1).expand(1, pending.batch, pending.f)
        state = compat.get_rope_state(tracker.model) if compat.rope_state_owner(tracker.model) is not None else None
        state = state.detach().clone() if isinstance(state, torch.Tensor) else state
        new = pending.base.append(ids.detach().long().cpu(), positions.detach().long().cpu(),
                                  _slot_mask(pending.mask, pending.batch, pending.f).cpu(), state)
        attach_ledger(pending.cache, new)
        note_linear(pending.cache, new.length)
    return post


def track(model: torch.nn.Module) -> Tracker:
    """Record a ledger on every cache this model's forward calls write to (generate()'s included) until `remove()`."""
    existing = model.__dict__.get(HANDLE_ATTR)
    if existing is not None:
        return existing
    tracker = Tracker(model)
    tracker.handles += [model.register_forward_pre_hook(_pre(tracker), with_kwargs=True),
                        model.register_forward_hook(_post(tracker), with_kwargs=True)]
    rope = rotary_embedding(model)
    if rope is not None:
        tracker.handles.append(rope.register_forward_pre_hook(_rotary(tracker), with_kwargs=True))
    model.__dict__[HANDLE_ATTR] = tracker
    return tracker


def is_tracked(model: torch.nn.Module) -> bool:
    return model.__dict__.get(HANDLE_ATTR) is not None


@contextmanager
def rotary_hook(model: torch.nn.Module, on_positions: Callable[[torch.Tensor | None], None]) -> Iterator[bool]:
    """`on_positions(position ids)` at the text rotary embedding's first call inside the block; yields whether the
    model has one."""
    rope = rotary_embedding(model)
    if rope is None:
        yield False
        return
    seen: list[bool] = []

    def pre(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not seen:
            seen.append(True)
            on_positions(rotary_positions(args, kwargs))

    handle = rope.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield True
    finally:
        handle.remove()
