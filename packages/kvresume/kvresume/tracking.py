"""`track(model)`: record a token ledger (kvresume.ledger) for every forward call and generate() that writes to a cache.

Hooks only, nothing patched: a forward pre-hook on the model reads the cache, the ids (the decoder's for an
encoder-decoder; embeddings are recorded as unknown ids), the mask and the cache's length before the call
(kvresume.steps); a pre-hook on the text rotary embedding reads the positions the model actually rotates with (the 3
M-RoPE rows where the model has them; a model without a rotary embedding: the given or the cache positions), taken
off once it saw the model pass the given 2-D position ids on as they are (a text model without rope_deltas: the call's
own are read then, and the hook comes back for a call given none); the forward hook adds one chunk of entries for the
written slots, with their fingerprints (kvresume.fingerprint; one `narrow_copy` per write) and the model-side state
(`rope_deltas`) after the call. A text model's decode step skips all that: read from its kwargs, kept as it is
(kvresume.steps.decode_step, kvresume.writes.Steps). The decode path keeps every tensor on the cache's device and
decides on Python ints only (no host sync): rows that beam search reorders are followed when the ledger is read, by
fingerprint. A cache written before tracking started
(or while untracked) gets no ledger: it stays untracked. Pending writes are kept per thread.
"""
from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import compat
from .compat import rotary_embedding
from . import images
from .call import fed_ids, is_encoder_decoder  # (fed_ids: the tests' import)
from .linear_checks import linear_layers, note_linear
from .fingerprint import grown_layer, known_layer, slot_prints, unfollowed, window_prints, window_start
from .writes import Write, add_chunk, as_rows  # (as_rows: the guard's import)
from .ledger import attach_ledger, cache_held, ledger_owner
from .steps import continued, decode_step, started
from .pickling import Hook, nothing

HANDLE_ATTR = "_kv_ledger_tracker"


def eager(hook: Callable[..., None]) -> Callable[..., None]:
    """The hook, skipped while torch.compile traces: traced, the ledger's Python state would guard the graph and
    recompile it every decode step (transformers' test_static_cache_no_recompile_with_smaller_length), and a
    torch.compiler.disable'd hook is a graph break that fullgraph=True refuses (its
    test_generate_compile_model_forward_fullgraph). A compiled call is thus not recorded: the cache it writes is
    longer than its ledger, which is then never read as the cache's (kvresume.steps.rebase: untracked)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        return None if compiling() else hook(*args, **kwargs)
    return run


compiling = torch.compiler.is_compiling  # eager's check, made by the model's two hooks themselves: a frame less a step
UNFOLLOWED = "kv_ledger_unfollowed"  # on a cache the tracker met but could not follow: why


def rotary_positions(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The position ids a rotary embedding's forward received."""
    value = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    return value if isinstance(value, torch.Tensor) else None


@dataclass(slots=True)
class _Pending:
    cache: Any
    past: int
    ids: torch.Tensor | None
    batch: int
    f: int
    mask: Any
    positions: torch.Tensor | None = None
    layer: int | None = None
    grown: Any = None  # the fingerprint layer, where its keys' shape is the cache's length
    images: Any = None  # the pictures behind its placeholders (kvresume.images.note)
    given: torch.Tensor | None = None  # the position ids the call was given


@dataclass
class Tracker:
    """The hooks `track` put on one model; `remove()` takes them off. What a forward call will record is kept per
    thread (`pending`), so two threads generating on one model keep their own ledgers."""

    model: torch.nn.Module
    handles: list[Any] = field(default_factory=list)
    local: threading.local = field(default_factory=threading.local, repr=False)
    rope: Any = None  # the text rotary embedding (None: the model has none)
    rope_state: bool = False  # the model keeps a position state (rope_deltas)
    decoder: bool = False  # an encoder-decoder: the decoder's ids, mask and positions are read
    linear: bool | None = None  # its caches have linear-attention layers (None: not seen yet)
    rope_handle: Any = None  # the rotary pre-hook while it is on
    passthrough: bool | None = None  # the rotary got the given position ids themselves (None: not seen yet)
    text: bool = False  # no encoder-decoder, no position state: decode steps read from kwargs (steps.decode_step)
    cache_name: str = "past_key_values"  # the forward's cache keyword (kvresume.compat.cache_kwarg)

    @property
    def pending(self) -> list[_Pending | None]:
        """This thread's pending write (a one-entry list while a forward call runs)."""
        stack = getattr(self.local, "pending", None)
        if stack is None:
            stack = self.local.pending = []
        return stack

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.model.__dict__.pop(HANDLE_ATTR, None)

    def __deepcopy__(self, memo: dict) -> "Tracker":
        """One tracker for a model and its deep copies: torch copies the hooks as they are (this tracker's)."""
        return self

    def __reduce__(self) -> tuple:
        """Pickled (with its model, or alone): nothing, the copy untracked (kvresume.pickling)."""
        return (nothing, ())

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _named(model: torch.nn.Module) -> list[str]:
    """The forward's positional parameter names (positional arguments are read as these)."""
    try:
        return [p.name for p in inspect.signature(model.forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def _pre(tracker: Tracker) -> Callable[..., None]:
    names = _named(tracker.model)

    def pre(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if compiling():
            return
        if not args and tracker.text and tracker.rope_handle is None:  # the given positions are what it rotates with
            step = decode_step(kwargs, tracker.cache_name)
            if step is not None:
                tracker.local.pending = [step]
                return
        stack = tracker.pending
        stack[:] = [None]
        if args:
            kwargs = {**dict(zip(names, args)), **kwargs}
        cache = compat.cache_from_kwargs(kwargs)  # None: the model makes its own (read from the output)
        ids, batch, f = fed_ids(tracker.model, kwargs, tracker.decoder)
        if f is None or f == 0 or kwargs.get("use_cache") is False:
            return
        tail = continued(cache, batch) if cache is not None else None
        if tail is not None:
            past, layer, grown = tail.length, tail.layer, tail.grown
        else:
            start = started(cache, batch)
            if start is None:
                return
            past, layer, grown = start
        decoder = tracker.decoder
        mask = kwargs.get("decoder_attention_mask" if decoder else "attention_mask")
        given = kwargs.get("decoder_position_ids" if decoder else "position_ids")
        given = given if isinstance(given, torch.Tensor) else None
        pictures = images.note(tracker.model, images.encoded(kwargs, tracker.local), past)
        pending = _Pending(cache, past, ids, batch, f, mask, None, layer, grown, pictures, given)
        if given is not None and (tracker.rope is None or (tracker.passthrough and given.dim() == 2)):
            pending.positions = given  # what the rotary embedding would get (kvresume.tracking._rotary learnt it)
            if tracker.rope_handle is not None:
                _unhook_rotary(tracker)
        elif tracker.rope is not None and tracker.rope_handle is None:
            _hook_rotary(tracker)
        stack[:] = [pending]
    return pre


def _hook_rotary(tracker: Tracker) -> None:
    """Put the rotary pre-hook on (again)."""
    tracker.rope_handle = tracker.rope.register_forward_pre_hook(Hook(eager(_rotary(tracker))), with_kwargs=True)
    tracker.handles.append(tracker.rope_handle)


def _unhook_rotary(tracker: Tracker) -> None:
    """Take the rotary pre-hook off (the handles keep no stale entry)."""
    handle, tracker.rope_handle = tracker.rope_handle, None
    handle.remove()
    if handle in tracker.handles:
        tracker.handles.remove(handle)


def _rotary(tracker: Tracker) -> Callable[..., None]:
    def rotary(_m: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        stack = tracker.pending
        pending = stack[-1] if stack else None
        positions = rotary_positions(args, kwargs)
        if pending is not None and pending.positions is None and positions is not None:
            pending.positions = positions  # shaped when the ledger is folded (kvresume.writes.as_rows)
            if tracker.passthrough is None and pending.given is not None and pending.given.dim() == 2:
                # a text model passing its position ids on as they are: read from the call's kwargs from now on
                tracker.passthrough = positions is pending.given and not tracker.rope_state and not tracker.decoder
    return rotary


def _chunk(tracker: Tracker, pending: _Pending, cache: Any) -> Write | None:
    """This write as seen (references, a copy of its fingerprints), or None where the cache cannot show its slots."""
    layer = pending.layer
    grown = pending.grown
    slab = grown is not None
    if slab:  # a copy (one op; cut to fingerprints when folded): reset() zeroes keys in place, a view keeps them alive
        prints = grown.keys.narrow_copy(-2, pending.past, pending.f)
    elif layer is not None and window_start(cache, layer, pending.past + pending.f) is not None:  # a sliding layer
        prints = window_prints(cache, layer, pending.past, pending.past + pending.f)
    else:
        prints = slot_prints(cache, layer, pending.past, pending.past + pending.f)
        prints = None if prints is None else prints.clone()
    if prints is None and (layer is not None or unfollowed(cache)):
        ledger_owner(cache).__dict__[UNFOLLOWED] = unfollowed(cache) or "its last full-attention layer lacks the slots"
        return None  # the layer does not hold the written slots as keys (a QuantizedCache): not followed
    return Write(pending.ids, pending.positions, pending.mask, prints, layer, _state(tracker), pending.past,
                 pending.batch, pending.f, slab)


def _state(tracker: Tracker) -> Any:
    """A copy of the model-side position state (rope_deltas) after the call; None where the model keeps none."""
    state = compat.get_rope_state(tracker.model) if tracker.rope_state else None
    return state.detach().clone() if isinstance(state, torch.Tensor) else state


def _post(tracker: Tracker) -> Callable[..., None]:
    def post(_m: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], out: Any) -> None:
        if compiling():
            return
        stack = getattr(tracker.local, "pending", None)
        pending = stack.pop() if stack else None
        if type(pending) is tuple:  # a decode step (kvresume.steps.decode_step)
            tail, cache, ids, positions, mask = pending
            if not tail.step(ids, positions, mask):
                attach_ledger(cache, None)  # the cache did not take its f slots after the tail: untracked
            elif tracker.linear:
                note_linear(cache, tail.length)
            return
        if tracker.passthrough and tracker.rope_handle is not None:
            _unhook_rotary(tracker)  # now, not at the next call: a compiled decode step is traced without it
        if pending is None:
            return
        if pending.cache is None:
            pending.cache = compat.output_cache(out)
            if pending.cache is None:
                return
        if pending.layer is None:
            pending.layer = known_layer(pending.cache)
            pending.grown = grown_layer(pending.cache, pending.layer)
        grown = pending.grown
        written = (grown.keys.shape[-2] if grown is not None else cache_held(pending.cache)[0]) - pending.past
        chunk = _chunk(tracker, pending, pending.cache) if written == pending.f else None
        if chunk is None:  # the cache did not take f slots, or cannot show them: untracked
            attach_ledger(pending.cache, None)
            return
        tail = add_chunk(pending.cache, chunk)
        if grown is not None:  # where the next decode step continues (steps.continued)
            tail.layer, tail.grown, tail.keys = pending.layer, grown, grown.keys
        if pending.images is not None or ledger_owner(pending.cache).__dict__.get(images.ATTR):
            images.attach(pending.cache, pending.past, pending.images)
        if tracker.linear is None:
            tracker.linear = bool(linear_layers(pending.cache))
        if tracker.linear:
            note_linear(pending.cache, pending.past + pending.f)
    return post


def track(model: torch.nn.Module) -> Tracker:
    """Record a ledger on every cache this model's forward calls write to (generate()'s included) until `remove()`;
    a tracked module inside it is untracked (each write is recorded once, by the outermost model: track that one)."""
    existing = model.__dict__.get(HANDLE_ATTR)
    if existing is not None:
        return existing
    for inner in [m.__dict__[HANDLE_ATTR] for m in model.modules() if m.__dict__.get(HANDLE_ATTR) is not None]:
        inner.remove()
    tracker = Tracker(model, rope=rotary_embedding(model), rope_state=compat.rope_state_owner(model) is not None,
                      decoder=is_encoder_decoder(model))
    tracker.text, tracker.cache_name = not tracker.rope_state and not tracker.decoder, compat.cache_kwarg(model)
    tracker.handles += [model.register_forward_pre_hook(Hook(_pre(tracker)), with_kwargs=True),
                        model.register_forward_hook(Hook(_post(tracker)), with_kwargs=True),
                        *images.hook_encoders(model, tracker.local)]
    if tracker.rope is not None:
        _hook_rotary(tracker)
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
