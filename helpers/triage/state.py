"""Control 0, the resume-state table: every state a complete resume contract must distinguish, measured for the
original and the rebuilt cache side by side, differing cells marked. The tree decides from it."""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from transformers.cache_utils import StaticLayer

from kvresume import compat
from kvresume import layers
from .facts import LayerState, ResumeState


def stored_slots(layer: Any) -> int | None:
    """K/V slots the layer physically holds: its keys' length, or for a preallocated StaticLayer buffer the slots that
    hold anything (non-zero keys), read from the tensors, not from the layer's own counters."""
    width = layers.stored_width(layer)
    if width is None or not isinstance(layer, StaticLayer):
        return width
    return int((layer.keys.detach().flatten(0, 1).abs().sum(0).sum(-1) != 0).sum())


def layer_states(cache: Any) -> list[LayerState]:
    """Per layer: class, stored K/V slots, reported length, is_initialized (None: the class has none)."""
    return [LayerState(type(layer).__name__, stored_slots(layer), layers.layer_length(layer),
                       None if getattr(layer, "is_initialized", None) is None else bool(layer.is_initialized))
            for layer in compat.cache_layers(cache)]


def measure(cache: Any, processed: int, suffix: int, call: dict[str, Any], explicit_call: dict[str, Any],
            carried: int | None = None, slots: list[str] | None = None, model_state: torch.Tensor | None = None) -> ResumeState:
    """One cache's resume state. `call`: what generate() (full mask) reached the model with (captured); `explicit_call`:
    the step at the processed length's positions; `slots`: per layer, its slots by content against the original's
    (`helpers.triage.slots.describe`); `model_state`: the model-side state the rebuild left."""
    ls = layer_states(cache)
    first = next((s.stored for s in ls if s.stored is not None), 0)
    return ResumeState(processed_tokens=processed, carried_processed=carried, reported_length=int(cache.get_seq_length()),
                       suffix=suffix, full_mask=first + suffix, next_position=call.get("rotary_position"),
                       logical_position=explicit_call.get("rotary_position"), layers=ls,
                       slots=list(slots or []),
                       model_state=None if model_state is None else model_state.detach().flatten().tolist()[:8])


ROWS = (
    ("processed tokens (the prompt's prefix; same by construction)", lambda s: s.processed_tokens),
    ("processed length carried by the rebuild", lambda s: s.carried_processed if s.carried_processed is not None else "-"),
    ("physical K/V length (get_seq_length)", lambda s: s.reported_length),
    ("unprocessed suffix tokens", lambda s: s.suffix),
    ("full attention mask columns", lambda s: s.full_mask),
    ("logical next position (processed length)", lambda s: s.logical_position),
    ("next position generate() used (captured)", lambda s: s.next_position),
    ("model-specific metadata (rope_deltas)", lambda s: s.model_state if s.model_state is not None else "none kept"),
)
LAYER_ROWS = (("class", "cls"), ("stored slots", "stored"), ("reported length", "reported"),
              ("is_initialized", "initialized"))


def table(original: ResumeState, rebuilt: ResumeState) -> pd.DataFrame:
    """Rows: the states; columns: original, rebuilt, differs ('<<' marks a differing cell)."""
    rows = [(name, fn(original), fn(rebuilt)) for name, fn in ROWS]
    for i, (o, r) in enumerate(zip(original.layers, rebuilt.layers)):
        rows += [(f"layer {i} {label}", getattr(o, attr), getattr(r, attr)) for label, attr in LAYER_ROWS]
        if i < len(rebuilt.slots):
            rows.append((f"layer {i} slots by content (vs the original's)", original.slots[i], rebuilt.slots[i]))
    df = pd.DataFrame([{"state": n, "original": str(o), "rebuilt": str(r)} for n, o, r in rows])
    df["differs"] = ["<<" if o != r else "" for o, r in zip(df.original, df.rebuilt)]
    return df.set_index("state")
