"""The guard's checks on which rows and slots the cache holds, read by fingerprint (kvresume.fingerprint).

`ledger_rows`: the ids have another number of rows than the cache (beam search returns one cache row per beam; a
batch's rows selected or repeated): generate() would fail on tensor sizes, or pair rows wrongly. Where the cache is
tracked, each ids row is matched to the cache row holding the longest common prefix with it, and the fix is the cache
with those rows selected (`batch_select_indices`). `ledger_stale`: a ledger whose fingerprints contradict what the
cache holds (written while the model was not tracked, e.g. cropped and refilled, or edited by hand): its tokens are
not read as the cache's; the fix crops to the first slots that still match, so the whole sequence's rest is fed.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from .call import ResumeCall, refuse
from .ledger import UNKNOWN, Ledger, cache_held, stale_prefix


def prefix_lengths(led: Ledger, ids: torch.Tensor) -> torch.Tensor:
    """[cache rows, ids rows]: how many first tokens of each ids row each cache row holds (embedding slots match)."""
    m = min(int(ids.shape[-1]), led.length)
    cached = led.token_ids[:, None, :m]
    same = (cached == ids.cpu()[None, :, :m]) | (cached == UNKNOWN)
    return same.long().cumprod(-1).sum(-1)


def _selected(cache: Any, rows: list[int]) -> Any:
    """A copy of the cache holding these rows, in this order (its ledger follows by fingerprint)."""
    out = copy.deepcopy(cache)
    out.batch_select_indices(torch.tensor(rows, dtype=torch.long))  # (a host index selects rows on any device)
    return out


def ledger_rows(call: ResumeCall) -> None:
    """Ids rows that are not the cache's rows: the cache rows holding each ids row's longest prefix, selected."""
    ids = call.given_ids
    rows = cache_held(call.cache)[1] if call.cache is not None else None
    fed = call.fed_ids if call.fed_ids is not None else ids  # generate() expands the ids per beam (num_beams)
    if ids is None or rows is None or int(fed.shape[0]) == rows:
        return
    b = int(ids.shape[0])
    led = call.ledger
    if led is None or led.batch != rows:
        raise refuse("ledger_rows", f"input_ids have {b} row(s) but the cache holds {rows} (beam search keeps one per "
                     f"beam): generate() would fail on tensor sizes or pair rows wrongly; select the cache rows these "
                     f"ids continue (cache.batch_select_indices([...]), one index per ids row; track(model) before the "
                     f"cache is written lets the guard find them)")
    lengths = prefix_lengths(led, ids)
    best, longest = lengths.argmax(0).tolist(), lengths.max(0).values.tolist()
    if min(longest) == 0:
        raise refuse("ledger_rows", f"input_ids have {b} row(s) but the cache holds {rows}, and no cache row starts "
                     f"with ids row {longest.index(0)}'s tokens: pass the whole sequence of each row, with the cache "
                     f"rows it continues selected (cache.batch_select_indices([...]))")
    keep = min(longest)
    crop = f"; then crop it to the {keep} token(s) all of them share (cache.crop({keep - led.length}))" if keep < led.length else ""
    raise refuse("ledger_rows", f"input_ids have {b} row(s) but the cache holds {rows} (beam search keeps one per beam): "
                 f"generate() would fail on tensor sizes; the cache rows {best} hold the longest common prefixes "
                 f"({longest} tokens) of the ids rows: select them (cache.batch_select_indices({best})){crop}",
                 cache=_selected(call.cache, best), crop=keep if keep < led.length else None)


def ledger_stale(call: ResumeCall) -> None:
    """A ledger that the cache's content contradicts (written while untracked): crop to the slots that still match."""
    if call.ledger is not None or call.cache is None:
        return
    stale = stale_prefix(call.cache)
    if stale is None:
        return
    k, held, row = stale
    raise refuse("ledger_stale", f"the cache holds {held} tokens, but from slot {k} on (row {row}) not the ones its "
                 f"token ledger recorded: it was written while the model was not tracked (cropped and refilled, or "
                 f"edited by hand) after its last tracked write, so which tokens it holds there is unknown; crop it to "
                 f"the {k} token(s) that still match (cache.crop({k - held})) and pass the whole sequence, whose rest "
                 f"generate() then feeds (or track(model) before every write)", crop=k)
