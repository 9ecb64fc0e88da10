"""One tracked write as the hooks saw it: references to the fed ids, positions and mask, and a copy of the written
slots' fingerprints; turned into ledger entries (`Write.ledger()`) only when the ledger is folded or read.

The decode path thus runs two tensor ops per step (the fingerprint's view and its copy); slicing the mask, shaping the
positions and making default ids/positions happen at fold time, FOLD writes at once (kvresume.ledger).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .ledger import ATTR, TAIL, UNKNOWN, Ledger, joined, ledger_owner, stored_ledger

FOLD = 64  # writes kept unfolded


def plain(t: torch.Tensor) -> torch.Tensor:
    """t as a long tensor outside autograd (no op where it is one already)."""
    t = t.detach() if t.requires_grad else t
    return t if t.dtype == torch.long else t.long()


def as_rows(positions: torch.Tensor, batch: int, f: int) -> torch.Tensor:
    """Positions as [rows, batch, f]: 1-D/2-D ids as one row, 3-row M-RoPE ids as they are, 4 rows less the text row."""
    p = plain(positions)
    if p.dim() == 3 and p.shape[0] == 4:
        p = p[1:]
    if p.dim() == 1:
        p = p.view(1, 1, -1)
    elif p.dim() == 2:
        p = p.unsqueeze(0)
    p = p if p.shape[-1] == f else p[..., -f:]
    return p.expand(p.shape[0], batch, p.shape[-1]) if p.shape[1] == 1 and batch != 1 else p


def slot_mask(mask: Any, batch: int, f: int, device: Any) -> torch.Tensor:
    """The written slots' mask bits [batch, f] (ones where no 2-D mask of these rows was given)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] >= f and mask.shape[0] == batch:
        return plain(mask if mask.shape[-1] == f else mask[:, -f:])
    return torch.ones(batch, f, dtype=torch.long, device=device)


@dataclass
class Write:
    """f slots written after `past` to `batch` rows: what the hooks read (ids None: embeddings; positions None: the
    cache positions), the fingerprints copied, the model-side state after the call."""

    ids: torch.Tensor | None
    positions: torch.Tensor | None
    mask: Any
    prints: torch.Tensor | None
    layer: int | None
    state: Any
    past: int
    batch: int
    f: int

    @property
    def length(self) -> int:
        return self.f

    def ledger(self) -> Ledger:
        """The ledger entries of this write."""
        device = self.prints.device if self.prints is not None else (
            self.ids.device if self.ids is not None else "cpu")
        ids = plain(self.ids) if self.ids is not None else torch.full((self.batch, self.f), UNKNOWN, device=device)
        if self.positions is None:
            positions = (self.past + torch.arange(self.f, device=ids.device)).view(1, 1, -1)
            positions = positions.expand(1, self.batch, self.f)
        else:
            positions = as_rows(self.positions, self.batch, self.f)
        return Ledger(ids, positions, slot_mask(self.mask, self.batch, self.f, ids.device), self.state, self.prints,
                      self.layer)

    @staticmethod
    def bulk(writes: list["Write"]) -> Ledger:
        """The entries of consecutive writes of one batch, in a few ops where they are uniform (ids and 2-D positions
        of one row count given, fingerprints copied: generate()'s decode steps), else write by write."""
        first = writes[0]
        uniform = all(w.ids is not None and w.ids.dim() == 2 and isinstance(w.positions, torch.Tensor)
                      and w.positions.dim() == 2 and w.positions.shape[0] == first.positions.shape[0]
                      and w.prints is not None and w.batch == first.batch for w in writes) \
            if first.ids is not None and isinstance(first.positions, torch.Tensor) else False
        if not uniform:
            parts = [w.ledger() for w in writes]
            return Ledger(torch.cat([p.token_ids for p in parts], 1), torch.cat([p.positions for p in parts], -1)
                          if len({p.positions.shape[0] for p in parts}) == 1 else torch.cat(
                              [p.positions[:1].expand(3, *p.positions.shape[1:]) if p.positions.shape[0] == 1
                               else p.positions for p in parts], -1),
                          torch.cat([p.mask for p in parts], 1), parts[-1].rope_deltas,
                          torch.cat([p.prints for p in parts], 1) if all(p.prints is not None for p in parts) else None,
                          parts[-1].layer)
        cut = [(w.positions if w.positions.shape[-1] == w.f else w.positions[:, -w.f:]) for w in writes]
        positions = as_rows(torch.cat(cut, -1), first.batch, sum(w.f for w in writes))
        return Ledger(plain(torch.cat([w.ids for w in writes], 1)), positions,
                      torch.cat([slot_mask(w.mask, w.batch, w.f, w.ids.device) for w in writes], 1), writes[-1].state,
                      torch.cat([w.prints for w in writes], 1), writes[-1].layer)


@dataclass
class Tail:
    """Writes not yet folded into the ledger: their chunks, and the slots and rows the ledger then has."""

    chunks: list[Any] = field(default_factory=list)
    length: int = 0
    batch: int = 0

    def __deepcopy__(self, memo: dict) -> "Tail":
        """A copy holding the folded ledger (a copy of each write's ids and mask views would copy the whole tensors
        they view)."""
        import copy

        return Tail([copy.deepcopy(joined(self.chunks), memo)] if self.chunks else [], self.length, self.batch)

    def __getstate__(self) -> dict:
        """Pickled folded (torch.save / pickle), for the same reason."""
        return {"chunks": [joined(self.chunks)] if self.chunks else [], "length": self.length, "batch": self.batch}


def recorded(cache: Any) -> tuple[int, int] | None:
    """(slots, rows) the stored ledger has with its unfolded writes, without folding; None: no ledger."""
    owner = ledger_owner(cache)
    tail = owner.__dict__.get(TAIL)
    if tail is not None and tail.chunks:
        return tail.length, tail.batch
    led = owner.__dict__.get(ATTR)
    return None if led is None else (led.length, led.batch)


def add_chunk(cache: Any, chunk: Any) -> None:
    """Record one write (a Ledger or a kvresume.writes.Write of the ledger's rows, or the first write); folded in
    every FOLD writes."""
    owner = ledger_owner(cache)
    tail = owner.__dict__.get(TAIL)
    if tail is None or not tail.chunks:
        base = owner.__dict__.get(ATTR)
        tail = Tail([base] if base is not None else [], base.length if base is not None else 0, chunk.batch)
        owner.__dict__[TAIL] = tail
    tail.chunks.append(chunk)
    tail.length += chunk.length
    if len(tail.chunks) >= FOLD:
        stored_ledger(cache)
