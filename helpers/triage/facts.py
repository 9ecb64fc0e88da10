"""The plain numbers the triage tree decides from: argument sets, control 0's resume state, repairs (pure data).

`ResumeState` is one cache's row of control 0 (the resume-state table); `Repair` is one repair the kit ran,
measured against the full forward; `Controls` holds everything `helpers.triage.walk.choose_branch` needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..compare import NoiseFloor


@dataclass
class ArgSet:
    """One argument set (the seed's neither/position_only/mask_only/both): both caches' outcomes."""

    name: str
    original_ok: bool
    rebuilt_ok: bool
    original_error: str = ""
    rebuilt_error: str = ""
    max_abs_diff: float | None = None  # rebuilt vs original first-step logits, when both ran


@dataclass
class LayerState:
    """One cache layer as generate() sees it: class, slots stored, length reported, initialized."""

    cls: str
    stored: int | None  # K/V slots physically stored (None: no K/V, a linear-attention layer)
    reported: int | None  # the layer's get_seq_length()
    initialized: bool | None  # the layer's is_initialized (None: the class has none)


@dataclass
class SlotLayer:
    """One rebuilt layer's stored slots matched by content (bits) to the original cache's slots."""

    original: int | None  # slots the original's same layer stores (None: no K/V, a linear-attention layer)
    matches: list[tuple[int, int] | None]  # per rebuilt slot: (layer, slot) of the original slot with its bits, else None
    same_state: bool | None = None  # a linear-attention layer: conv/recurrent states equal the original's
    heads: list[list[int]] | None = None  # per KV head, the same layer's original slot each rebuilt slot holds there,
    # where whole slots do not match but every head's does (a press that keeps other slots per head)


@dataclass
class ResumeState:
    """Control 0 for one cache: every state a complete resume contract must distinguish."""

    processed_tokens: int  # tokens that really passed through the model (the prompt's prefix)
    carried_processed: int | None  # processed length the rebuild returned beside its cache (None: a cache alone)
    reported_length: int  # cache.get_seq_length(): what generate() reads as the past length
    suffix: int  # unprocessed suffix tokens
    full_mask: int  # columns of the full mask (stored slots + suffix)
    next_position: int | None  # the position generate() gave the next token (captured at the rotary embedding)
    logical_position: int | None  # the position of the processed length (explicit step, captured)
    layers: list[LayerState] = field(default_factory=list)
    model_state: list | None = None  # model-specific metadata (Qwen3-VL's rope_deltas), None: the model keeps none
    slots: list[str] = field(default_factory=list)  # per layer: its slots by content against the original's


@dataclass
class Repair:
    """One repair the kit ran: max |logit diff| of the repaired step against the full forward."""

    name: str
    max_abs_diff: float | None
    ok: bool = True
    error: str = ""  # 'Type at stage' when the repaired step raised
    vs_unrepaired: float | None = None  # the repaired step against the unrepaired generate() step

    def restores(self, floor: NoiseFloor) -> bool:
        """The repaired step matches the full forward within the floor."""
        return self.ok and self.max_abs_diff is not None and floor.matches(self.max_abs_diff)

    def record(self, floor: NoiseFloor) -> dict[str, Any]:
        """{'name', 'max_abs_diff', 'restores'} (+ the error when it raised), as the results file keeps it."""
        out = {"name": self.name, "max_abs_diff": self.max_abs_diff, "restores": self.restores(floor)}
        return out if self.ok else out | {"error": self.error}


@dataclass
class Controls:
    """The plain numbers of every control for one rebuild (what `choose_branch` needs)."""

    rebuild: str
    floor: NoiseFloor
    arg_sets: list[ArgSet]
    processed_length: int
    rebuilt_lengths: list[int]
    state_changed: bool = False  # the rebuild changed the model-side state of the instance
    fresh_bare_diff: float | None = None  # fresh instance without the state vs same instance
    resume_on: str = "same_instance"
    extra: dict[str, Any] = field(default_factory=dict)  # positions, explicit-step numbers: shown, not branched on
    original_state: ResumeState | None = None  # control 0, the original cache
    rebuilt_state: ResumeState | None = None  # control 0, the rebuilt cache
    repairs: dict[str, Repair] = field(default_factory=dict)  # every repair the kit ran, by name
    identity_remaining: float | None = None  # the identity rebuild's explicit step vs the full forward (its floor)
    localized: dict[str, Any] = field(default_factory=dict)  # reconstruction_copy: first differing layer/slot, kind
    topk: dict[str, Any] = field(default_factory=dict)  # reconstruction_copy: top-1/top-5 kept vs the full forward
    slots: list[SlotLayer] = field(default_factory=list)  # control 0's slot comparison, per rebuilt layer


def consistent(a: ArgSet, floor: NoiseFloor) -> bool:
    """Same status for both caches, same error type when both fail, logits within the floor when both ran."""
    if a.original_ok != a.rebuilt_ok:
        return False
    if not a.original_ok:
        return a.original_error == a.rebuilt_error
    return a.max_abs_diff is not None and floor.matches(a.max_abs_diff)


def identical(c: Controls) -> tuple[bool, dict[str, Any]]:
    """Decision 1 and its numbers: every argument set consistent between original and rebuilt."""
    per = {a.name: ("both failed (" + a.original_error + ")" if not (a.original_ok or a.rebuilt_ok) else
                    a.max_abs_diff if a.original_ok and a.rebuilt_ok else
                    f"original {'worked' if a.original_ok else 'failed'}, rebuilt {'worked' if a.rebuilt_ok else 'failed'}")
           for a in c.arg_sets}
    worst = max((a.max_abs_diff for a in c.arg_sets if a.max_abs_diff is not None), default=None)
    same = bool(c.arg_sets) and all(consistent(a, c.floor) for a in c.arg_sets)
    return same, {"per_argument_set": per, "worst_max_abs_diff": worst, "noise_threshold": c.floor.threshold}


# --- control 0's questions (the table's differing cells) ----------------------------------------

def metadata_differs(c: Controls) -> list[int]:
    """Layers whose class, is_initialized, or reported length against stored slots differ from the original's."""
    def offset(s: LayerState) -> int | None:
        return None if s.stored is None or s.reported is None else s.reported - s.stored
    pairs = zip(c.original_state.layers, c.rebuilt_state.layers) if c.original_state and c.rebuilt_state else []
    return [i for i, (o, r) in enumerate(pairs)
            if o.cls != r.cls or o.initialized != r.initialized or offset(o) != offset(r)]


def model_state_differs(c: Controls) -> bool:
    """The model-specific metadata (rope_deltas) the rebuild left differs from the original's."""
    if c.original_state is None or c.rebuilt_state is None:
        return c.state_changed
    return c.original_state.model_state != c.rebuilt_state.model_state or c.state_changed


def _order_kind(idx: list[int], n: int) -> str:
    """Original slot indices of one layer (or head), all found: their kind by position order."""
    if idx == list(range(n)):
        return "same"
    if idx == list(range(len(idx))):
        return "prefix_short"
    if len(set(idx)) < len(idx):
        return "repeated"
    return "evicted" if all(a < b for a, b in zip(idx, idx[1:])) else "reordered"


def slot_kind(i: int, s: SlotLayer) -> str:
    """What rebuilt layer i holds against the original's layer i, by slot content: 'same', 'prefix_short' (the
    original's first slots, fewer), 'extra' (every original slot in order, then slots no original slot holds),
    'evicted' (original slots in order, some missing), 'reordered' (distinct original slots, out of position order:
    an eviction whose order is harmless, each key carrying its rotation), 'exchanged' (another layer's slots),
    'repeated' (an original slot stored twice), 'content' (slots no original slot holds, or a linear state that
    differs). Where each KV head keeps its own slots (`heads`), the heads decide: one head out of order makes it
    'reordered', one repeating 'repeated'."""
    if not s.matches:
        return ("evicted" if s.original else "content" if s.same_state is False else "same")
    if any(m is not None and m[0] != i for m in s.matches):
        return "exchanged"
    idx, n = [None if m is None else m[1] for m in s.matches], s.original or 0
    if s.heads and None in idx:
        kinds = {_order_kind(h, n) for h in s.heads}
        return next(k for k in ("repeated", "reordered", "evicted", "prefix_short", "same") if k in kinds)
    if all(j is None for j in idx):
        return "content"
    if len(idx) > n and idx[:n] == list(range(n)) and all(j is None for j in idx[n:]):
        return "extra"
    if None in idx:
        return "content"
    return _order_kind(idx, n)


CHANGED = ("content", "exchanged", "repeated")  # the copy changed what the slots hold
COMPRESSION = ("evicted", "prefix_short", "reordered")  # fewer original slots (a prefix whose re-feed did not restore)


def slot_verdict(slots: list[SlotLayer]) -> str:
    """The cache's slots against the original's: a changed layer decides, then an eviction out of position order, an
    eviction, a short prefix, extra."""
    kinds = {slot_kind(i, s) for i, s in enumerate(slots)}
    return next((k for k in (*CHANGED, "reordered", "evicted", "prefix_short", "extra") if k in kinds), "same")


def slot_layers(slots: list[SlotLayer], *kinds: str) -> list[int]:
    """Layers whose slot kind is one of `kinds`."""
    return [i for i, s in enumerate(slots) if slot_kind(i, s) in kinds]
