"""The token ledger: per cache, per batch row, the token id, position and mask bit each stored slot was written with.

A `Ledger` is kept as an attribute of the (self-attention) cache object, so `copy.deepcopy`, `pickle` and
`torch.save`/`torch.load(weights_only=False)` carry it with the cache. Nothing of the cache is wrapped: `ledger_of(cache)`
reads the ledger against what the cache measures now — a cache cropped (`crop(n)`, assisted decoding's rejections)
reports fewer tokens, so the ledger's first n slots are read; a cache repeated per row (`batch_repeat_interleave`,
beams) has a multiple of the ledger's rows, so its rows are repeated. A ledger shorter than the cache (the cache was
written while untracked) or of a batch it cannot map (`batch_select_indices`, beam reordering) is not read: the cache
is then untracked and the guard behaves as without a ledger. An eviction keeps the retained slots' entries
(`keep_slots`); the factory takes token ids and positions for a rebuilt cache (`kv_cache_from_tensors`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

ATTR = "kv_ledger"
UNKNOWN = -1  # the token id of a slot written from embeddings


@dataclass
class Ledger:
    """token_ids [batch, slots]; positions [rows, batch, slots] (1 text row, or the 3 M-RoPE rows); mask [batch, slots]
    (1 where the slot was attended, 0 for padding); rope_deltas: the model-side state the last write ran under."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    rope_deltas: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.token_ids.shape[-1])

    @property
    def batch(self) -> int:
        return int(self.token_ids.shape[0])

    def first(self, n: int) -> "Ledger":
        """The ledger of the first n slots (a crop)."""
        return Ledger(self.token_ids[:, :n], self.positions[..., :n], self.mask[:, :n], self.rope_deltas)

    def slots(self, index: torch.Tensor | Sequence[int]) -> "Ledger":
        """The ledger of the kept slots, in the order given (an eviction)."""
        i = torch.as_tensor(index, dtype=torch.long)
        return Ledger(self.token_ids[:, i], self.positions[..., i], self.mask[:, i], self.rope_deltas)

    def rows(self, index: torch.Tensor) -> "Ledger":
        """The ledger of these batch rows (a repeat or a selection)."""
        deltas = self.rope_deltas
        if isinstance(deltas, torch.Tensor) and deltas.dim() > 0 and deltas.shape[0] == self.batch:
            deltas = deltas[index]
        return Ledger(self.token_ids[index], self.positions[:, index], self.mask[index], deltas)

    def append(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
               rope_deltas: torch.Tensor | None) -> "Ledger":
        """This ledger with f more slots written (ids [batch, f], positions [rows, batch, f], mask [batch, f])."""
        if positions.shape[0] != self.positions.shape[0]:
            rows = positions.shape[0] if not self.length else max(positions.shape[0], self.positions.shape[0])
            return Ledger(torch.cat([self.token_ids, ids], 1), torch.cat([_rows(self.positions, rows), _rows(positions, rows)], -1),
                          torch.cat([self.mask, mask], 1), rope_deltas)
        return Ledger(torch.cat([self.token_ids, ids], 1), torch.cat([self.positions, positions], -1),
                      torch.cat([self.mask, mask], 1), rope_deltas)

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


def _rows(positions: torch.Tensor, rows: int) -> torch.Tensor:
    return positions if positions.shape[0] == rows else positions[:1].expand(rows, *positions.shape[1:])


def empty_ledger(batch: int, rows: int = 1, device: Any = "cpu") -> Ledger:
    """A ledger of no slots."""
    long = dict(dtype=torch.long, device=device)
    return Ledger(torch.empty(batch, 0, **long), torch.empty(rows, batch, 0, **long), torch.empty(batch, 0, **long))


def ledger_owner(cache: Any) -> Any:
    """The object the ledger is kept on: an encoder-decoder cache's self-attention cache, else the cache."""
    return getattr(cache, "self_attention_cache", None) or cache


def cache_held(cache: Any) -> tuple[int, int | None]:
    """(tokens the cache reports, its batch size or None where no layer holds K/V yet)."""
    cache = ledger_owner(cache)
    batch = None
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.numel():
            batch = int(keys.shape[0])
            break
    return int(cache.get_seq_length()), batch


def stored_ledger(cache: Any) -> Ledger | None:
    """The ledger kept on the cache, as stored (not fitted to the cache)."""
    return getattr(ledger_owner(cache), ATTR, None) if cache is not None else None


def attach_ledger(cache: Any, ledger: Ledger | None) -> Any:
    """Keep `ledger` on the cache (None removes it); returns the cache."""
    target = ledger_owner(cache)
    if ledger is None:
        target.__dict__.pop(ATTR, None)
    else:
        setattr(target, ATTR, ledger)
    return cache


def ledger_of(cache: Any) -> Ledger | None:
    """The ledger fitted to what the cache holds now (first `get_seq_length()` slots, rows repeated to its batch), or
    None: untracked, or written while untracked (ledger shorter), or rows it cannot map."""
    ledger = stored_ledger(cache)
    if ledger is None:
        return None
    length, batch = cache_held(cache)
    if ledger.length < length:
        return None
    if ledger.length > length:
        ledger = ledger.first(length)
    if batch is not None and batch != ledger.batch:
        if batch % ledger.batch:
            return None
        ledger = ledger.rows(torch.arange(ledger.batch).repeat_interleave(batch // ledger.batch))
    return ledger


def keep_slots(cache: Any, kept: torch.Tensor | Sequence[int]) -> Any:
    """After an eviction that kept these slots (indices into the ledger, in the order the cache now holds them):
    the ledger of the retained slots only."""
    ledger = stored_ledger(cache)
    return attach_ledger(cache, None if ledger is None else ledger.slots(kept))


def without_ledger(cache: Any) -> Any:
    """A deep copy of the cache without its ledger (how the cache behaves untracked)."""
    import copy

    out = copy.deepcopy(cache)
    return attach_ledger(out, None)


def ledger_from_tensors(token_ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                 rope_deltas: torch.Tensor | None = None) -> Ledger:
    """A ledger from a rebuilt cache's token ids [batch, slots] and positions ([batch, slots] or [3, batch, slots];
    default 0..slots-1), mask default all ones."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    ids = ids.view(1, -1) if ids.dim() == 1 else ids
    if positions is None:
        positions = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
    positions = torch.as_tensor(positions, dtype=torch.long)
    positions = positions.view(1, 1, -1).expand(1, *ids.shape) if positions.dim() == 1 else positions
    positions = positions.unsqueeze(0) if positions.dim() == 2 else positions
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask, dtype=torch.long)
    return Ledger(ids.clone(), positions.clone(), mask.clone(), rope_deltas)
