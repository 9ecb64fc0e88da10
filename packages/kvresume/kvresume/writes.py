"""One tracked write as the hooks saw it: references to the fed ids, positions and mask, and a copy of the written
slots' fingerprints; turned into ledger entries (`.ledger()`) only when the ledger is folded or read.

A text model's decode steps (`Steps`) run no tensor op: slicing the masks, shaping the positions and cutting the keys
to fingerprints happen when FOLD writes are folded, in a few ops (kvresume.ledger.joined).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from .fingerprint import key_prints
from .ledger import ATTR, TAIL, UNKNOWN, Ledger, joined, ledger_owner

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
        n = mask.shape[-1]  # pragma: no mutate - 2-D
        if n == f:
            return mask
        s0, s1 = mask.stride()
        return mask.as_strided((batch, f), (s0, s1), mask.storage_offset() + (n - f) * s1)
    return torch.ones(batch, f, dtype=torch.long, device=device)


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
        """This write's fingerprints [batch, f, W] (None: not fingerprinted; a slab of keys cut to its own, a copy)."""
        return key_prints(self.prints, 0, self.f).contiguous() if self.slab and self.prints is not None else self.prints

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


@dataclass(slots=True)
class Steps:
    """Decode steps of `f` tokens each after slot `start` on their tail's rows and fingerprint layer, as fed (per step
    the 2-D ids, own 2-D positions and mask: no op a step), and the layer's keys tensor the last one left, which their
    slots are read from when folded: each step's write made it anew from the one before (kvresume.steps.continued), and
    the cache never writes into it in place (a reset() zeroes it: the slots copied before the steps then differ)."""

    f: int
    layer: int | None
    start: int
    steps: list[tuple[torch.Tensor, torch.Tensor, Any]] = field(default_factory=list)
    keys: Any = None

    @property
    def length(self) -> int:
        return self.f * len(self.steps)

    def ledger(self) -> Ledger:
        """The entries of these steps: ids and positions concatenated, the masks' last f columns (`_grown_masks` where
        each is f columns longer than the one before, as generate()'s are, else step by step), the keys' prints."""
        ids, positions, masks = (list(part) for part in zip(*self.steps))
        batch, f = ids[0].shape[0], self.f
        mask = _grown_masks(masks, batch, f)  # pragma: no mutate - a fast path: the step-by-step one gives the same
        if mask is None:
            mask = torch.cat([mask_slots(m, batch, f, ids[0].device) for m in masks], 1)
        return Ledger(plain(torch.cat(ids, 1)), as_rows(torch.cat(positions, 1), batch, self.length), plain(mask), None,
                      key_prints(self.keys, self.start, self.start + self.length).contiguous(), self.layer)


def _grown_masks(masks: list[Any], batch: int, f: int) -> torch.Tensor | None:
    """The last f columns of each mask in four ops where each is a 2-D mask f columns longer than the one before
    (generate()'s decode steps) and they are small (MASKS values); None otherwise."""
    m0 = masks[0]
    if not isinstance(m0, torch.Tensor) or m0.dim() != 2 or m0.shape[0] != batch or m0.shape[1] < f:
        return None
    n0, k = m0.shape[1], len(masks)
    if batch * (k * n0 + f * k * (k - 1) // 2) > MASKS:  # pragma: no mutate - k (k - 1) is even
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
    """Writes not yet folded into the ledger: their chunks, and the slots and rows the ledger then has; `layer`,
    `grown` and `keys`: the fingerprint layer's index, object and keys tensor the last tracked write grew
    (kvresume.steps.continued; None: not known)."""

    chunks: list[Any] = field(default_factory=list)
    length: int = 0
    batch: int = 0
    layer: int | None = None
    grown: Any = None
    keys: Any = None  # the `grown` layer's keys tensor as the last tracked write left it (None: not known)
    writes: int = 0  # writes added since the last fold

    def add(self, chunk: Any) -> None:
        """Append one write of the ledger's rows; every FOLD writes they are folded into one ledger, in place."""
        self.chunks.append(chunk)
        self.length += chunk.length
        self._counted()

    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: Any) -> bool:
        """Append one decode step (kvresume.steps.decode_step) to the last `Steps` where it continues them; False where
        the cache did not take its f slots after these writes."""
        past, f, keys = self.length, ids.shape[1], self.grown.keys
        if keys.shape[-2] - past != f:  # pragma: no mutate - 4-D keys
            return False
        run = self.chunks[-1]
        if type(run) is not Steps or run.f != f or run.layer != self.layer:
            run = Steps(f, self.layer, past)
            self.chunks.append(run)
        run.steps.append((ids, positions, mask))
        self.keys = run.keys = keys
        self.length += f
        self._counted()
        return True

    def _counted(self) -> None:
        """One more write; every FOLD writes the chunks fold into one ledger, in place (the next step goes on here)."""
        self.writes += 1
        if self.writes >= FOLD:
            self.chunks, self.writes = [joined(self.chunks)], 0

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


def add_chunk(cache: Any, chunk: Any) -> Tail:
    """Record one write (a Ledger or a kvresume.writes.Write of the ledger's rows, or the first write); folded in
    every FOLD writes. Returns the writes kept on the cache (`Tail`)."""
    owner = ledger_owner(cache)
    tail = owner.__dict__.get(TAIL)
    if tail is None or not tail.chunks:
        base = owner.__dict__.get(ATTR)
        tail = Tail([base] if base is not None else [], base.length if base is not None else 0, chunk.batch)
        owner.__dict__[TAIL] = tail
    tail.add(chunk)
    return tail
