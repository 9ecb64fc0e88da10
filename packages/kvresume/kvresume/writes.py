"""One tracked write as the hooks saw it: references to the fed ids, positions and mask, and a copy of the written
slots' fingerprints; turned into ledger entries (`Write.ledger()`) only when the ledger is folded or read.

The decode path thus runs one tensor op per step (`narrow_copy` of the written slots' keys of the fingerprint layer, cut
to fingerprints at fold time); slicing the mask, shaping the positions and making default ids/positions happen at fold
time, FOLD writes at once in a few ops (kvresume.ledger).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from .fingerprint import key_prints
from .ledger import ATTR, TAIL, UNKNOWN, Ledger, joined, ledger_owner, stored_ledger

FOLD = 64  # writes kept unfolded
MASKS = 1 << 22  # mask values a fold concatenates at most (else a view per write)


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


def mask_slots(mask: Any, batch: int, f: int, device: Any) -> torch.Tensor:
    """The written slots' mask bits [batch, f] (ones where no 2-D mask of these rows was given) as one view op (a
    mask's last f columns by `as_strided`), not yet made `plain`."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] >= f and mask.shape[0] == batch:
        n = mask.shape[-1]
        if n == f:
            return mask
        s0, s1 = mask.stride()
        return mask.as_strided((batch, f), (s0, s1), mask.storage_offset() + (n - f) * s1)
    return torch.ones(batch, f, dtype=torch.long, device=device)


def slab_prints(slab: torch.Tensor) -> torch.Tensor:
    """The fingerprints [batch, slots, W] of a keys slab [batch, heads, slots, head_dim] (a copy)."""
    return key_prints(slab, 0, slab.shape[-2]).contiguous()


@dataclass(slots=True)
class Write:
    """f slots written after `past` to `batch` rows: what the hooks read (ids None: embeddings; positions None: the
    cache positions), the fingerprints copied (slab: `prints` holds the written slots' keys [batch, heads, f, head_dim],
    cut to fingerprints when folded), the model-side state after the call."""

    ids: torch.Tensor | None
    positions: torch.Tensor | None
    mask: Any
    prints: torch.Tensor | None
    layer: int | None
    state: Any
    past: int
    batch: int
    f: int
    slab: bool = False

    @property
    def length(self) -> int:
        return self.f

    def fingerprints(self) -> torch.Tensor | None:
        """This write's fingerprints [batch, f, W] (None: not fingerprinted)."""
        return slab_prints(self.prints) if self.slab and self.prints is not None else self.prints

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
        return Ledger(ids, positions, plain(mask_slots(self.mask, self.batch, self.f, ids.device)), self.state,
                      self.fingerprints(), self.layer)

    @staticmethod
    def bulk(writes: list["Write"]) -> Ledger:
        """The entries of consecutive writes of one batch, in a few ops where they are uniform (ids and 2-D positions
        of one row count given, fingerprints copied: generate()'s decode steps), else write by write."""
        stacked = _stacked(writes)
        if stacked is not None:
            return stacked
        return joined([w.ledger() for w in writes])


def _stacked(writes: list[Write]) -> Ledger | None:
    """`Write.bulk` of uniform writes in one pass and a few ops; None where they are not uniform."""
    first = writes[0]
    batch, p0, slab = first.batch, first.positions, first.slab
    if first.ids is None or not isinstance(p0, torch.Tensor) or p0.dim() != 2:
        return None
    rows = p0.shape[0]
    ids, cut, masks, prints, total = [], [], [], [], 0
    for w in writes:
        i, p, f = w.ids, w.positions, w.f
        if i is None or w.prints is None or w.batch != batch or w.slab is not slab or i.dim() != 2 or \
                not isinstance(p, torch.Tensor) or p.dim() != 2 or p.shape[0] != rows:
            return None
        ids.append(i)
        cut.append(p if p.shape[-1] == f else p[:, -f:])
        masks.append(w.mask)
        prints.append(w.prints)
        total += f
    mask = _slot_masks(writes, masks, batch, total)
    joined_prints = slab_prints(torch.cat(prints, -2)) if slab else torch.cat(prints, 1)
    return Ledger(plain(torch.cat(ids, 1)), as_rows(torch.cat(cut, -1), batch, total), plain(mask),
                  writes[-1].state, joined_prints, writes[-1].layer)


def _slot_masks(writes: list[Write], masks: list[Any], batch: int, total: int) -> torch.Tensor:
    """The writes' mask bits [batch, total], not yet `plain`: a prefill and the decode steps after it (`_grown_masks`)
    in a few ops, else a view per write."""
    head = 1 if len(writes) > 2 and writes[0].f != writes[1].f else 0  # generate()'s prompt, then one f per step
    f = writes[head].f
    grown = _grown_masks(masks[head:], batch, f) if total == writes[0].f * head + f * (len(writes) - head) else None
    if grown is None:
        return torch.cat([mask_slots(m, batch, w.f, w.ids.device) for m, w in zip(masks, writes)], 1)
    return torch.cat([mask_slots(masks[0], batch, writes[0].f, writes[0].ids.device), grown], 1) if head else grown


def _grown_masks(masks: list[Any], batch: int, f: int) -> torch.Tensor | None:
    """The last f columns of each mask in four ops where each is a 2-D mask f columns longer than the one before
    (generate()'s decode steps) and they are small (MASKS values); None otherwise."""
    m0 = masks[0]
    if not isinstance(m0, torch.Tensor) or m0.dim() != 2 or m0.shape[0] != batch or m0.shape[1] < f:
        return None
    n0, k = m0.shape[1], len(masks)
    if batch * (k * n0 + f * k * (k - 1) // 2) > MASKS:
        return None
    for j, m in enumerate(masks):
        if not isinstance(m, torch.Tensor) or m.shape != (batch, n0 + j * f) or m.device != m0.device:
            return None
    a = torch.arange(k, device=m0.device)  # write j's slots start at column (j + 1) n0 + f j (j + 1) / 2 - f
    start = (a + 1) * n0 + torch.div(a * (a + 1), 2, rounding_mode="floor") * f - f
    index = start if f == 1 else (start.unsqueeze(1) + torch.arange(f, device=m0.device)).view(-1)
    return torch.cat(masks, 1).index_select(1, index)


@dataclass
class Tail:
    """Writes not yet folded into the ledger: their chunks, and the slots and rows the ledger then has; `layer` and
    `grown`: the fingerprint layer's index and object the last tracked write grew (kvresume.tracking's decode step
    continues from them; None: not known)."""

    chunks: list[Any] = field(default_factory=list)
    length: int = 0
    batch: int = 0
    layer: int | None = None
    grown: Any = None

    def add(self, cache: Any, chunk: Any) -> bool:
        """Append one write of `cache`'s ledger rows; every FOLD writes they are folded into its ledger (True)."""
        self.chunks.append(chunk)
        self.length += chunk.length
        if len(self.chunks) < FOLD:
            return False
        stored_ledger(cache)
        return True

    def __deepcopy__(self, memo: dict) -> "Tail":
        """A copy holding the folded ledger (a copy of each write's ids and mask views would copy the whole tensors
        they view)."""
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


def add_chunk(cache: Any, chunk: Any) -> Tail | None:
    """Record one write (a Ledger or a kvresume.writes.Write of the ledger's rows, or the first write); folded in
    every FOLD writes. Returns the unfolded writes (None: just folded)."""
    owner = ledger_owner(cache)
    tail = owner.__dict__.get(TAIL)
    if tail is None or not tail.chunks:
        base = owner.__dict__.get(ATTR)
        tail = Tail([base] if base is not None else [], base.length if base is not None else 0, chunk.batch)
        owner.__dict__[TAIL] = tail
    return None if tail.add(cache, chunk) else tail
