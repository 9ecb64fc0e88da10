"""The guard's checks on a hybrid cache's linear-attention layers: what their state summarises, not only lengths.

`linear_rollback` (reads the ledger): the tracker notes, after every write, the token count and a fingerprint of
the linear layers' recurrent states (`note_linear`). A cache that now reports fewer tokens than the count whose
fingerprint its recurrent state still has was cropped below what its linear layers processed without rolling them
back (`crop(-k)` after `activate_past_recording()` on 5.14.1-5.24.0: #49036's mechanism). A crop that did roll them
back (5.25.0's `recurrent_states_to_keep`, assisted decoding's own rejections) leaves another state: passed.
`linear_length` (no ledger needed): a linear layer's own token count (5.25.0+) that differs from the full-attention
layers' (a hybrid rebuilt by hand: the conv width, 4), where generate() would re-feed cached tokens.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DynamicCache

from . import compat, layers
from .call import ResumeCall, refuse
from .fingerprint import bits
from .ledger import ledger_owner

ATTR = "kv_linear_marks"  # [(tokens the linear layers had processed, fingerprint of their recurrent states)]
KEEP = 64  # marks kept per cache
FP_VALUES = 16  # recurrent-state values per row in a fingerprint


def linear_layers(cache: Any) -> list[Any]:
    return [l for l in compat.cache_layers(ledger_owner(cache)) if layers.has_linear_state(l)]


def fingerprint(cache: Any) -> torch.Tensor | None:
    """Raw bits of the first FP_VALUES values per row of the last linear layer's recurrent state (a copy, on its
    device: no host sync); None without one. A rolled-back state is a bitwise copy of an earlier one."""
    states = [s for layer in linear_layers(cache) for s in getattr(layer, "recurrent_states", {}).values()
              if isinstance(s, torch.Tensor) and s.numel()]
    return bits(states[-1].detach().flatten(1)[:, :FP_VALUES]).clone() if states else None


def note_linear(cache: Any, length: int) -> None:
    """After a write: the linear layers' recurrent states now summarise `length` tokens."""
    mark = fingerprint(cache)
    if mark is None:
        return
    owner = ledger_owner(cache)
    marks = [m for m in getattr(owner, ATTR, []) if m[0] != length][-KEEP:]
    setattr(owner, ATTR, marks + [(int(length), mark)])


def _same(a: Any, b: Any) -> bool:
    """Two fingerprints are equal (tensors bitwise, tuples by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            a.dtype == b.dtype and torch.equal(a, b.to(a.device))
    return a == b


def _keeps_history() -> bool:
    """This release's activate_past_recording takes recurrent_states_to_keep (5.25.0+)."""
    return compat.accepts(getattr(DynamicCache, "activate_past_recording", None), "recurrent_states_to_keep")


def stale_length(marks: list[tuple[int, Any]], now: Any, held: int) -> int | None:
    """The tokens the linear layers' recurrent state `now` summarises (the longest noted with that fingerprint) where
    that is more than the `held` tokens the cache holds: a crop that did not roll it back; else None."""
    seen = [length for length, mark in marks if now is not None and _same(mark, now)]
    return max(seen) if seen and max(seen) > held else None


def stale_of(cache: Any, held: int) -> int | None:
    """`stale_length` of this cache's noted marks and its recurrent states now (None: untracked or not stale)."""
    marks = getattr(ledger_owner(cache), ATTR, None) if cache is not None else None
    return stale_length(marks, fingerprint(cache), held) if marks else None


def linear_rollback(call: ResumeCall) -> None:
    """A cache cropped below what its linear layers' recurrent state summarises (not rolled back)."""
    led = call.ledger
    if led is None:
        return
    held = led.length
    m = stale_of(call.cache, held)
    if m is None:
        return
    how = (f"; or, before the {m - held} draft token(s), cache.activate_past_recording(recurrent_states_to_keep="
           f"{m - held}) so crop(-{m - held}) rolls them back" if _keeps_history() else "")
    raise refuse("linear_rollback", f"the cache holds {held} tokens but its linear-attention layers' recurrent state is "
                  f"still the one after {m} tokens (a crop that did not roll it back: transformers "
                  f"{compat.TRANSFORMERS_VERSION} keeps no recurrent-state history): re-prefill the {held} kept tokens "
                  f"(the whole sequence with a new empty cache){how}",
                  cache=DynamicCache(config=compat.text_config(call.model.config)))


def _counts(cache: Any) -> tuple[list[int], list[int]]:
    """(the linear layers' own token counts where the release keeps them, the full-attention layers' lengths)."""
    linear, full = [], []
    for layer in compat.cache_layers(ledger_owner(cache)):
        own = getattr(layer, compat.LINEAR_LENGTH_ATTR, None)
        if isinstance(own, torch.Tensor):
            linear.append(int(own))
        elif isinstance(getattr(layer, "keys", None), torch.Tensor) and not getattr(layer, "is_sliding", False):
            full.append(int(layer.get_seq_length()))
    return linear, full


def count_mismatch(linear: list[int], full: list[int]) -> int | None:
    """The full-attention layers' length where a linear layer's own count differs from it; else None."""
    return max(full) if linear and full and set(linear) != {max(full)} else None


def linear_length(call: ResumeCall) -> None:
    """Linear layers counting other than the full-attention layers (5.25.0+: a hybrid rebuilt without its count)."""
    if call.cache is None:
        return
    linear, full = _counts(call.cache)
    want = count_mismatch(linear, full)
    if want is None:
        return
    fixed = _carried(call.cache, want)
    raise refuse("linear_length", f"the linear-attention layers count {sorted(set(linear))} token(s), the full-attention "
                  f"layers hold {want}: get_seq_length() answers from layer 0, so generate() would re-feed cached "
                  f"tokens; carry the linear layers' count (each linear layer's "
                  f"`cumulative_length_linear` set to {want}: kvresume.compat.carry_linear_length) or rebuild with "
                  f"kv_cache_from_tensors", cache=fixed)


def _carried(cache: Any, length: int) -> Any:
    """A copy of the cache with every linear layer's own count set to `length`."""
    out = copy.deepcopy(cache)
    for layer in compat.cache_layers(ledger_owner(out)):
        compat.carry_linear_length(layer, length)
    return out
