"""Control 0's slot comparison: each stored K/V slot of the rebuilt cache matched by content to the original's.

A slot is one position's keys and values across batch rows and heads; two slots match when their bits are equal.
Every rebuilt slot is looked up among all the original's slots (every layer), so the comparison says what a cache
holds, not what its lengths suggest: an exact prefix N slots short, extra slots after the original's, evicted slots
(which), a layer holding another layer's slots, or changed content. The kinds are decided in
`helpers.triage.facts.slot_kind`; this module measures and describes.
"""
from __future__ import annotations

from typing import Any

import torch

from kvresume import compat
from kvresume import layers
from .controls import spans
from .facts import SlotLayer, slot_kind
from .state import stored_slots


def _slot_bytes(layer: Any, head: int | None = None) -> list[bytes]:
    """One byte string per stored slot: keys then values over batch rows and heads, or KV head `head` alone (a
    StaticLayer: its filled slots)."""
    n = stored_slots(layer) or 0
    k, v = layer.keys[..., :n, :].detach(), layer.values[..., :n, :].detach()
    if head is not None:
        k, v = k[:, head:head + 1], v[:, head:head + 1]
    both = torch.cat([k.transpose(0, 2).reshape(n, -1), v.transpose(0, 2).reshape(n, -1)], dim=1).contiguous()
    return [row.tobytes() for row in both.view(torch.uint8).reshape(n, -1).cpu().numpy()]


def per_head(original: Any, rebuilt: Any) -> list[list[int]] | None:
    """Per KV head, the original layer's slot each rebuilt slot holds in that head; None where a head holds a slot
    the original's head does not (or the head counts differ)."""
    if original.keys.shape[1] != rebuilt.keys.shape[1]:
        return None
    out = []
    for h in range(rebuilt.keys.shape[1]):
        index = {b: j for j, b in reversed(list(enumerate(_slot_bytes(original, h))))}
        got = [index.get(b) for b in _slot_bytes(rebuilt, h)]
        if None in got:
            return None
        out.append(got)
    return out


def compare(original: Any, rebuilt: Any) -> list[SlotLayer]:
    """Per rebuilt layer: for each stored slot, the (layer, slot) of the original slot with the same bits, or None."""
    lo, lr = compat.cache_layers(original), compat.cache_layers(rebuilt)
    index: dict[bytes, tuple[int, int]] = {}
    for i, layer in enumerate(lo):
        if layers.has_kv(layer):
            for j, b in enumerate(_slot_bytes(layer)):
                index.setdefault(b, (i, j))
    out = []
    for i, layer in enumerate(lr):
        o = lo[i] if i < len(lo) else None
        width = stored_slots(o) if o is not None and layers.has_kv(o) else None
        matches = [index.get(b) for b in _slot_bytes(layer)] if layers.has_kv(layer) else []
        state = None if not layers.has_linear_state(layer) else (o is not None and layers.layer_state_equal(o, layer))
        heads = per_head(o, layer) if None in matches and width else None
        out.append(SlotLayer(width, matches, state, heads))
    return out


def describe(i: int, s: SlotLayer) -> str:
    """One cell of control 0: what the layer's slots are, by content ('original 0-79; missing 80 (last)')."""
    kind = slot_kind(i, s)
    if s.original is None and not s.matches:
        return "no K/V (linear state " + ("equal)" if s.same_state else "differs)")
    if s.heads and None in [m and m[1] for m in s.matches]:
        kept = "; ".join(f"head {h}: original {spans(sorted(idx))}" for h, idx in enumerate(s.heads))
        order = ", out of position order" if kind == "reordered" else ""
        return f"{kind}: {len(s.matches)} slots, each KV head its own{order}; {kept}"
    held = [m[1] for m in s.matches if m is not None and m[0] == i]
    text = f"{len(s.matches)} slots; original {spans(sorted(held)) or 'none'}"
    if kind == "reordered":
        text += " (out of position order)"
    missing = sorted(set(range(s.original or 0)) - set(held))
    if missing:
        text += f"; missing {spans(missing)} ({', '.join(where(missing, s.original or 0))})"
    unmatched = [j for j, m in enumerate(s.matches) if m is None]
    if unmatched:
        text += f"; {len(unmatched)} slots no original slot holds (rebuilt slots {spans(unmatched)})"
    others = sorted({m[0] for m in s.matches if m is not None and m[0] != i})
    if others:
        text += f"; holds layer {', '.join(map(str, others))}'s slots"
    return f"{kind}: {text}"


def described(original: Any, rebuilt: Any) -> list[str]:
    """`describe` of every layer of `rebuilt` against `original`."""
    return [describe(i, s) for i, s in enumerate(compare(original, rebuilt))]


def where(missing: list[int], n: int) -> list[str]:
    """Which slots are missing, per contiguous run: 'all', 'first' (the run holds slot 0), 'last' (slot n-1), 'middle'."""
    out: list[str] = []
    for run in spans(missing).split(", "):
        lo, hi = int(run.partition("-")[0]), int(run.partition("-")[2] or run)
        name = "all" if (lo, hi) == (0, n - 1) else "first" if lo == 0 else "last" if hi == n - 1 else "middle"
        out += [] if name in out else [name]
    return out
