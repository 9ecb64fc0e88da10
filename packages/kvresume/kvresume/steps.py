"""Where a tracked forward call's write starts: the slots the cache holds before it, the fingerprint layer, and the
stored ledger fitted to the cache (kvresume.tracking's pre-hook). A decode step that continues the last tracked write
(`continued`) is told from a few attribute reads; a text model's (`decode_step`) is then read from its kwargs alone and
recorded with no tensor op (`kvresume.writes.Tail.step`); anything else goes through `started`. No host sync.
"""
from __future__ import annotations

from typing import Any

import torch

from .images import KINDS
from .fingerprint import LAYER_ATTR, grown_layer, known_layer
from .ledger import ATTR, adopt_prints, attach_ledger, cache_held, fitted, ledger_owner, stored_ledger
from .writes import TAIL, Tail, recorded


def rebase(cache: Any, past: int, batch: int) -> bool:
    """Fit the stored ledger to the cache before a write of `batch` rows after `past` tokens: trimmed to a crop, rows
    followed by fingerprint where the cache's batch changed, fingerprints adopted where it has none (all on the
    device, no host sync; the common decode step only compares Python ints). False: the cache stays untracked."""
    have = recorded(cache)
    if have is None or have[0] < past:  # untracked, or written while untracked
        return False
    owner = ledger_owner(cache)
    base = owner.__dict__.get(ATTR) if owner.__dict__.get(TAIL) is None else None
    if have == (past, batch) and (base is None or getattr(base, "prints", None) is not None):
        return True
    led = stored_ledger(cache).first(past)
    if led.prints is None:
        led = adopt_prints(cache, led)
    if led.batch != batch:
        fit = fitted(led, cache)
        if fit is not None:
            led = fit[0]
        elif batch % led.batch == 0:
            led = led.rows(torch.arange(led.batch, device=led.token_ids.device).repeat_interleave(batch // led.batch))
        else:
            attach_ledger(cache, None)
            return False
    attach_ledger(cache, led)
    return True


def continued(cache: Any, batch: int) -> Tail | None:
    """The unfolded writes (`Tail`) this call continues where it continues the last tracked write to `cache` and
    nothing changed since: its fingerprint layer as left, holding the very keys tensor that write left (a crop, a
    write, a row selection all replace it), the same rows. Its `length`, `layer` and `grown` are then what `started`
    finds, from a few attribute reads (generate()'s decode steps). None: ask `started`."""
    owner = ledger_owner(cache)
    tail = owner.__dict__.get(TAIL)
    if tail is None or tail.keys is None or tail.batch != batch:
        return None
    grown, layer, layers = tail.grown, tail.layer, owner.layers
    if grown.keys is tail.keys and layer < len(layers) and layers[layer] is grown and \
            owner.__dict__.get(LAYER_ATTR) == layer:
        return tail
    return None


def started(cache: Any, batch: int) -> tuple[int, int | None, Any] | None:
    """(past, fingerprint layer, grown layer) of a write of `batch` rows to `cache` (None: the model makes one), its
    stored ledger fitted first (`rebase`); None: nothing is recorded."""
    layer = known_layer(cache) if cache is not None else None
    grown = grown_layer(cache, layer)
    if grown is not None:
        past, rows = grown.keys.shape[-2], grown.keys.shape[0]
    else:
        past, rows = cache_held(cache) if cache is not None else (0, None)
    if rows is not None and rows != batch:
        return None  # the cache's rows are not the fed rows (generate() fails on it): nothing recorded
    if cache is not None and not past:
        attach_ledger(cache, None)
    elif past and not rebase(cache, past, batch):
        return None
    return past, layer, grown


PIXELS = frozenset(kind[0] for kind in KINDS)


def decode_step(kwargs: dict[str, Any], cache_name: str) -> tuple | None:
    """A decode step read from a forward call's kwargs alone: 2-D ids with their own positions, no pictures, continuing
    the last tracked write (`continued`): (tail, cache, ids, positions, mask); None: the full path."""
    ids, given, cache = kwargs.get("input_ids"), kwargs.get("position_ids"), kwargs.get(cache_name)
    if cache is None or not isinstance(ids, torch.Tensor) or not isinstance(given, torch.Tensor):
        return None
    shape = ids.shape
    if len(shape) != 2 or given.shape != shape or not shape[1] or kwargs.get("use_cache") is False or \
            not PIXELS.isdisjoint(kwargs):
        return None
    tail = continued(cache, shape[0])
    return None if tail is None else (tail, cache, ids, given, kwargs.get("attention_mask"))
