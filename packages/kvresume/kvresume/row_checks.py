"""The guard's checks on which rows and slots the cache holds, read by fingerprint (kvresume.fingerprint).

`ledger_rows`: the ids have another number of rows than the cache (beam search returns one cache row per beam; a
batch's rows selected or repeated): generate() would fail on tensor sizes, or pair rows wrongly. Where the cache is
tracked, each ids row is matched to the cache row holding the longest common prefix with it, and the fix is the cache
with those rows selected (`batch_select_indices`). Where generate() itself makes the rows differ
(`num_return_sequences`, `num_beams`: it repeats the ids and the mask per beam, else per returned sequence, and not
the cache), that is the cause named, before any work; the fix is a copy of the cache with each row repeated as
generate() repeats the ids (`batch_repeat_interleave`), which equals a no-cache run with the same arguments.
`ledger_stale`: a ledger whose fingerprints contradict what the cache holds (written while the model was not
tracked, e.g. cropped and refilled, or edited by hand): its tokens are not read as the cache's; the fix crops to the
first slots that still match, so the whole sequence's rest is fed.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from . import compat
from .call import ResumeCall, refuse
from .ledger import UNKNOWN, Ledger, cache_held, ledger_owner, stale_prefix
from .whole import EXPANDS_ROWS, effective_config


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


EXPANSION = "kv_expansion"  # the ResumeCall attribute naming the call's row-expanding settings (note_expansion)


def note_expansion(call: ResumeCall, model: Any, kwargs: dict[str, Any]) -> None:
    """Name on the call the generate() settings that expand its rows (num_beams, num_return_sequences), if any."""
    try:
        config = effective_config(model, kwargs)
    except Exception:  # noqa: BLE001 - an invalid config is generate()'s own error to raise
        return
    named = [f"{k}={getattr(config, k)}" for k, neutral in EXPANDS_ROWS.items()
             if getattr(config, k, neutral) not in (None, neutral)]
    setattr(call, EXPANSION, ", ".join(named))


def _repeatable(cache: Any) -> bool:
    """Whether every layer of the (self-attention) cache can select and repeat its rows."""
    return all(hasattr(layer, "batch_select_indices") for layer in compat.cache_layers(ledger_owner(cache)))


def _expanded(call: ResumeCall, ids: torch.Tensor, rows: int, fed: int) -> None:
    """generate() repeated the ids (num_return_sequences / num_beams) and not the cache: the cache rows repeated alike."""
    b, k = int(ids.shape[0]), fed // int(ids.shape[0])
    setting = getattr(call, EXPANSION, "") or "num_return_sequences / num_beams"
    why = (f"generate() expands the {b} input_ids row(s) to {fed} ({setting}: it repeats the ids and the mask {k} "
           f"times, once per beam, else once per returned sequence), but not the cache, which holds {rows} row(s)")
    led, crop, order = call.ledger, None, list(range(b))
    if rows != b:  # the cache's rows are not the ids': the rows holding each ids row's longest prefix, then repeated
        if led is None or led.batch != rows:
            raise refuse("ledger_rows", f"{why}, and {rows} is not one row per ids row: select the cache rows these "
                         f"ids continue (cache.batch_select_indices([...]), one per ids row; track(model) lets the "
                         f"guard find them), then repeat each {k} times (cache.batch_repeat_interleave({k}))")
        lengths = prefix_lengths(led, ids)
        order, keep = lengths.argmax(0).tolist(), int(lengths.max(0).values.min())
        if keep == 0:
            raise refuse("ledger_rows", f"{why}, and no cache row starts with some ids row's tokens: pass the whole "
                         f"sequence of each row, with the cache rows it continues selected and repeated {k} times")
        crop = keep if keep < led.length else None
    index = [r for r in order for _ in range(k)]
    if not _repeatable(call.cache):
        raise refuse("ledger_rows", f"{why}; this cache's layers cannot repeat rows ({type(call.cache).__name__}): "
                     f"pass the whole sequence through kvresume.resume(model, whole_ids, cache), which re-prefills "
                     f"it, or generate without the cache", resume=True)
    how = (f"cache.batch_repeat_interleave({k})" if order == list(range(rows))
           else f"cache.batch_select_indices({index})")
    cut = f", then crop it to the {crop} token(s) all rows share (cache.crop({crop - led.length}))" if crop else ""
    raise refuse("ledger_rows", f"{why}: generate() would fail on tensor sizes or pair rows wrongly. Pass the same "
                 f"arguments with a copy of the cache expanded to the {fed} rows generate() feeds (copy.deepcopy(cache), "
                 f"then {how}){cut}{_apart(setting, k)}", cache=_selected(call.cache, index), crop=crop)


def _apart(setting: str, k: int) -> str:
    """The other way where the rows are returned sequences, not beams: one call per sequence."""
    if "num_beams" in setting:
        return ""
    return (f"; or call generate() {k} times with num_return_sequences=1, each with its own copy of the cache "
            f"(sampling then draws other tokens than one call of {k} sequences)")


def ledger_rows(call: ResumeCall) -> None:
    """Ids rows that are not the cache's rows: the cache rows holding each ids row's longest prefix, selected."""
    ids = call.given_ids
    rows = cache_held(call.cache)[1] if call.cache is not None else None
    fed = call.fed_ids if call.fed_ids is not None else ids  # generate() expands the ids per beam (num_beams)
    if ids is None or rows is None or int(fed.shape[0]) == rows:
        return
    b = int(ids.shape[0])
    if int(fed.shape[0]) > b and int(fed.shape[0]) % b == 0:
        _expanded(call, ids, rows, int(fed.shape[0]))
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
