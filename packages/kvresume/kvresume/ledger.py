"""The token ledger: per cache, per batch row, the token id, position and mask bit each stored slot was written with,
and the slot's content fingerprint (kvresume.fingerprint) that ties the entry to what the cache holds.
The tracker's writes wait on the cache as a `kvresume.writes.Tail` (TAIL) until `stored_ledger` folds them in.

A `Ledger` is kept as an attribute of the (self-attention) cache object, so `copy.deepcopy`, `pickle` and
`torch.save`/`torch.load(weights_only=False)` carry it with the cache. It stays on the cache's device; the tracker
adds each write as a chunk (`add_chunk`, folded in every `FOLD` writes), so a decode step costs no host sync and no
re-concatenation. Nothing of the cache is wrapped: `ledger_of(cache)` reads the ledger against what the cache holds
now: its first `get_seq_length()` slots (a crop trims lazily), and per slot the recorded row whose fingerprint the
cache's row holds (rows selected, repeated, reordered, beams: followed; written while untracked, or changed by hand:
no match, so the ledger is stale and not read, and `stale_prefix` says how many first slots still match). A ledger
without fingerprints (the factory's, from token ids) is trusted by count. A cache with only sliding layers shows
its window alone: read where every row still holds its own entries there, else untracked (rows not followed).
An eviction keeps the retained slots' entries (`keep_slots`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from .fingerprint import bits, match, print_layer, slot_prints, window_start

ATTR = "kv_ledger"
TAIL = "kv_ledger_tail"
UNKNOWN = -1  # the token id of a slot written from embeddings


@dataclass
class Ledger:
    """token_ids [batch, slots]; positions [rows, batch, slots] (1 text row, or the 3 M-RoPE rows); mask [batch, slots]
    (1 where the slot was attended, 0 for padding); rope_deltas: the model-side state the last write ran under;
    prints [batch, slots, W]: each slot's fingerprint, read from cache layer `layer` (None: not fingerprinted)."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    rope_deltas: torch.Tensor | None = None
    prints: torch.Tensor | None = None
    layer: int | None = None

    @property
    def length(self) -> int:
        return int(self.token_ids.shape[-1])

    @property
    def batch(self) -> int:
        return int(self.token_ids.shape[0])

    def first(self, n: int) -> "Ledger":
        """The ledger of the first n slots (a crop)."""
        p = self.prints
        return replace(self, token_ids=self.token_ids[:, :n], positions=self.positions[..., :n], mask=self.mask[:, :n],
                       prints=None if p is None else p[:, :n])

    def slots(self, index: torch.Tensor | Sequence[int]) -> "Ledger":
        """The ledger of the kept slots, in the order given (an eviction)."""
        i = torch.as_tensor(index, dtype=torch.long, device=self.token_ids.device)
        p = self.prints
        return replace(self, token_ids=self.token_ids[:, i], positions=self.positions[..., i], mask=self.mask[:, i],
                       prints=None if p is None else p[:, i.to(p.device)])

    def rows(self, index: torch.Tensor) -> "Ledger":
        """The ledger of these batch rows (a repeat or a selection)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.token_ids.device)
        p = self.prints
        return replace(self, token_ids=self.token_ids[index], positions=self.positions[:, index], mask=self.mask[index],
                       rope_deltas=_deltas(self, index), prints=None if p is None else p[index.to(p.device)])

    def gather(self, index: torch.Tensor) -> "Ledger":
        """Per slot, the recorded row `index[b, s]` for row b ([B, slots]): rows followed slot by slot."""
        i = index.to(self.token_ids.device)
        r = self.positions.shape[0]
        p = self.prints
        return replace(self, token_ids=self.token_ids.gather(0, i), mask=self.mask.gather(0, i),
                       positions=self.positions.gather(1, i.unsqueeze(0).expand(r, *i.shape)),
                       rope_deltas=_deltas(self, i[:, -1]) if i.shape[-1] else self.rope_deltas,
                       prints=None if p is None else p.gather(0, index.unsqueeze(-1).expand(*index.shape, p.shape[-1])))

    def next_positions(self) -> torch.Tensor:
        """Per row, the position the next token continues at: 1 + the last slot's position (its largest M-RoPE row)."""
        return self.positions[..., -1].amax(0) + 1

    def common_prefix(self, ids: torch.Tensor) -> int:
        """How many first tokens of `ids` equal the cached ones in every row (slots written from embeddings match)."""
        n = min(int(ids.shape[-1]), self.length)
        cached = self.token_ids[:, :n].to(ids.device)
        same = (cached == ids[:, :n]) | (cached == UNKNOWN)
        differ = (~same).any(0).nonzero()
        return int(differ[0]) if differ.numel() else n

    def cpu(self) -> "Ledger":
        """The ids, positions and mask on the host (what the guard reads)."""
        return replace(self, token_ids=self.token_ids.cpu(), positions=self.positions.cpu(), mask=self.mask.cpu())


def _deltas(led: Ledger, index: torch.Tensor) -> torch.Tensor | None:
    deltas = led.rope_deltas
    if isinstance(deltas, torch.Tensor) and deltas.dim() > 0 and deltas.shape[0] == led.batch:
        return deltas[index.to(deltas.device)]
    return deltas


def _rows(positions: torch.Tensor, rows: int) -> torch.Tensor:
    return positions if positions.shape[0] == rows else positions[:1].expand(rows, *positions.shape[1:])


def joined(parts: list[Any]) -> Ledger:
    """The ledgers' slots one after another (same batch); the last one's rope_deltas; prints where all have them."""
    parts = [p if isinstance(p, Ledger) else p.ledger() for p in parts]  # tracked writes (kvresume.writes) made now
    parts = [p for p in parts if p.token_ids.shape[-1]] or parts[-1:]
    top = max(p.positions.shape[0] for p in parts)
    positions = [_rows(p.positions, top) for p in parts]
    prints = [p.prints for p in parts]
    return Ledger(torch.cat([p.token_ids for p in parts], 1), torch.cat(positions, -1),
                  torch.cat([p.mask for p in parts], 1), parts[-1].rope_deltas,
                  torch.cat(prints, 1) if all(x is not None for x in prints) else None, parts[-1].layer)


def empty_ledger(batch: int, rows: int = 1, device: Any = "cpu") -> Ledger:
    """A ledger of no slots."""
    long = dict(dtype=torch.long, device=device)
    return Ledger(torch.empty(batch, 0, **long), torch.empty(rows, batch, 0, **long), torch.empty(batch, 0, **long))


def ledger_owner(cache: Any) -> Any:
    """The object the ledger is kept on: an encoder-decoder cache's self-attention cache, else the cache."""
    inner = getattr(cache, "self_attention_cache", None)
    return cache if inner is None else inner  # (an empty DynamicCache is falsy: `or` would give the wrapper)


def cache_held(cache: Any) -> tuple[int, int | None]:
    """(tokens the cache reports, its batch size or None where no layer holds K/V yet)."""
    cache = ledger_owner(cache)
    keys = (getattr(layer, "keys", None) for layer in getattr(cache, "layers", []))
    batch = next((int(k.shape[0]) for k in keys if isinstance(k, torch.Tensor) and k.dim() == 4 and k.numel()), None)
    return int(cache.get_seq_length()), batch


def stored_ledger(cache: Any) -> Ledger | None:
    """The ledger kept on the cache, as stored (rows as written, not fitted to the cache), its writes folded in."""
    if cache is None:
        return None
    owner = ledger_owner(cache)
    tail = owner.__dict__.pop(TAIL, None)
    if tail is not None and tail.chunks:
        owner.__dict__[ATTR] = joined(tail.chunks)
    return owner.__dict__.get(ATTR)


def attach_ledger(cache: Any, ledger: Ledger | None) -> Any:
    """Keep `ledger` on the cache (None removes it); returns the cache."""
    target = ledger_owner(cache)
    target.__dict__.pop(TAIL, None)
    if ledger is None:
        target.__dict__.pop(ATTR, None)
    else:
        setattr(target, ATTR, ledger)
    return cache


def fitted(led: Ledger, cache: Any) -> tuple[Ledger, torch.Tensor] | None:
    """(the ledger per slot mapped to the cache's rows, found [batch, slots]: which slots hold a recorded fingerprint);
    None where the ledger has no fingerprints or the cache's layer cannot show them all. No host sync."""
    p = led.prints
    if p is not None and led.length and led.layer is not None and \
            window_start(cache, led.layer, led.length) is not None:
        return _window_fit(led, cache)
    now = slot_prints(cache, led.layer, 0, led.length) if p is not None and led.length else None
    if now is None or now.shape[-1] != p.shape[-1] or now.dtype != p.dtype:
        return None
    index, found = match(now, p.to(now.device))
    return led.gather(index), found


def _window_fit(led: Ledger, cache: Any) -> tuple[Ledger, torch.Tensor] | None:
    """A cache whose fingerprint layer slides (no full-attention layer): its rows are not followed, since the slots
    before its window cannot be compared; the ledger is read only where every shown slot of every row holds the
    ledger's own row's fingerprint (found: all slots, or none). None: rows of another count."""
    first = window_start(cache, led.layer, led.length)
    p = led.prints
    now = slot_prints(cache, led.layer, 0, led.length - first)
    if first < 0 or now is None or now.shape[0] != led.batch or now.shape[-1] != p.shape[-1]:
        return None
    same = (bits(now) == bits(p[:, first:].to(now.device))).all()  # each row against its own (two rows may hold one)
    return led, same.expand(led.batch, led.length)


def _by_count(led: Ledger, batch: int | None) -> Ledger | None:
    """A ledger without fingerprints, trusted by count: rows repeated to the cache's batch where it is a multiple."""
    if batch is not None and batch != led.batch:
        if batch % led.batch:
            return None
        led = led.rows(torch.arange(led.batch).repeat_interleave(batch // led.batch))
    return led.cpu()


def ledger_of(cache: Any) -> Ledger | None:
    """The ledger fitted to what the cache holds now (its first `get_seq_length()` slots, per slot the recorded row the
    cache's row holds), on the host; None: untracked, written while untracked (ledger shorter, or slots whose content
    no recorded row has: see `stale_prefix`)."""
    led = stored_ledger(cache)
    if led is None:
        return None
    length, batch = cache_held(cache)
    if led.length < length:
        return None
    led = led.first(length)
    if led.prints is None or not length:
        return _by_count(led, batch)
    fit = fitted(led, cache)
    if fit is None or not bool(fit[1].all()):
        return None
    return fit[0].cpu()


def stale_prefix(cache: Any) -> tuple[int, int, int] | None:
    """(first slots that match, tokens held, first row that does not) where the stored ledger's fingerprints contradict
    what the cache holds (written while untracked, or changed by hand); None where they agree or cannot be read."""
    led = stored_ledger(cache)
    if led is None or led.prints is None:
        return None
    held = cache_held(cache)[0]
    if led.layer is not None and held and window_start(cache, led.layer, held) is not None:
        return None  # a sliding window shows too little to name the slots: the cache is read as untracked
    fit = fitted(led.first(min(led.length, held)), cache)
    if fit is None or bool(fit[1].all()):
        return None
    bad = ~fit[1]
    k = int(bad.any(0).nonzero()[0])
    return k, held, int(bad[:, k].nonzero()[0])


def keep_slots(cache: Any, kept: torch.Tensor | Sequence[int]) -> Any:
    """After an eviction that kept these slots (indices into the ledger, in the order the cache now holds them):
    the ledger of the retained slots only."""
    ledger = stored_ledger(cache)
    return attach_ledger(cache, None if ledger is None else ledger.slots(kept))


def without_ledger(cache: Any) -> Any:
    """A deep copy of the cache without its ledger (how the cache behaves untracked)."""
    out = copy.deepcopy(cache)
    return attach_ledger(out, None)


def ledger_from_tensors(token_ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                        rope_deltas: torch.Tensor | None = None) -> Ledger:
    """A ledger from a rebuilt cache's token ids [batch, slots] and positions ([batch, slots] or [3, batch, slots];
    default 0..slots-1), mask default all ones; no fingerprints (the first tracked write adopts the cache's)."""
    ids = torch.atleast_2d(torch.as_tensor(token_ids, dtype=torch.long))
    if positions is None:
        positions = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    positions = torch.as_tensor(positions, dtype=torch.long)
    positions = positions.view(1, 1, -1).expand(1, *ids.shape) if positions.dim() == 1 else positions
    positions = positions.unsqueeze(0) if positions.dim() == 2 else positions
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask, dtype=torch.long)
    return Ledger(ids.clone(), positions.clone(), mask.clone(), rope_deltas)


def adopt_prints(cache: Any, led: Ledger) -> Ledger:
    """A ledger without fingerprints (the factory's) given the cache's own for its slots, where the cache shows them."""
    layer = print_layer(cache)
    prints = slot_prints(cache, layer, 0, led.length)
    if prints is None or prints.shape[0] != led.batch:
        return led
    return replace(led, prints=prints.clone(), layer=layer)
