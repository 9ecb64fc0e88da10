"""The call shapes people write to resume a Qwen3-VL chat whose second turn brings a new image, each run as
generate() one greedy step from a copy of the turn-1 cache, with what reached its first model call (`first_call`,
forward hooks only: ids, pixel inputs, the three M-RoPE position rows the text rotary embedding received, the
model-side `rope_deltas` before it) and its distance to the one-forward reference."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from kvresume import compat
from ..continuation import as_list as flat, describe_call, hooked, shape_of
from ..compare import NoiseFloor, logit_metrics
from ..continuation import Outcome, generate_first_step
from .turns import TwoTurns


@dataclass(frozen=True)
class Shape:
    """One call: which ids (turn 2 only or both turns), which pixels, which grids, which mm_token_type_ids."""

    key: str
    label: str
    ids: str  # "turn2" | "full" | "text"
    pixels: str  # "B" | "A+B" | "B encoded" | "none"
    grids: str  # "B" | "A,B" | "none"
    types: str  # "turn2" (what a processor gives for turn 2 alone) | "full" | "none"


SHAPES = (
    Shape("a_turn2_ids", "(a) turn-2 ids + image B", "turn2", "B", "B", "turn2"),
    Shape("a_turn2_ids_full_types", "(a) turn-2 ids + image B, full-length types", "turn2", "B", "B", "full"),
    Shape("b_full_ids_both_images", "(b) full ids + images A and B", "full", "A+B", "A,B", "none"),
    Shape("b_full_ids_both_images_full_types", "(b) full ids + images A and B, full-length types", "full", "A+B", "A,B", "full"),
    Shape("c_full_ids_image_b", "(c) full ids + image B", "full", "B", "B", "none"),
    Shape("c_full_ids_image_b_full_types", "(c) full ids + image B, full-length types", "full", "B", "B", "full"),
    Shape("d_full_ids_b_encoded_full_types", "(d) full ids + both grids + B pre-encoded, full-length types",
          "full", "B encoded", "A,B", "full"),
    Shape("control_text_turn", "control: text-only turn 2", "text", "none", "none", "turn2"),
)
NATURAL = "a_turn2_ids"
CONTROL = "control_text_turn"


@dataclass
class FirstCall:
    """The first model call of one continuation, as the hooks saw it."""

    seen: dict[str, Any] = field(default_factory=dict)
    rows: list[list[int]] | None = None  # [t, h, w] positions of the call's tokens (batch row 0)
    calls: int = 0


def describe(model: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The inputs of one forward call that decide turn 2's positions and image features."""
    encoded = kwargs.get("mm_encoder_outputs")
    return {**describe_call(kwargs), "input_ids": flat(kwargs.get("input_ids")),
            "pixel_values_shape": shape_of(kwargs.get("pixel_values")),
            "image_grid_thw": flat(kwargs.get("image_grid_thw")),
            "mm_token_type_ids_shape": shape_of(kwargs.get("mm_token_type_ids")),
            "mm_encoder_outputs": sorted(encoded) if isinstance(encoded, dict) else None,
            "rope_deltas_before": flat(compat.get_rope_state(model))}


def _rows(positions: Any) -> list[list[int]] | None:
    """The three M-RoPE rows of batch row 0 (a 2-D position tensor is one row, repeated as the model does)."""
    if not isinstance(positions, torch.Tensor):
        return None
    if positions.dim() == 2:
        positions = positions[None]
    rows = [positions[i, 0].detach().cpu().tolist() for i in range(positions.shape[0])][-3:]
    return rows * 3 if len(rows) == 1 else rows  # one row is broadcast to t, h and w by the rotary embedding


@contextmanager
def first_call(model: torch.nn.Module) -> Iterator[FirstCall]:
    """Yields a FirstCall filled in by hooks on the model and on its text rotary embedding."""
    record = FirstCall()

    def pre(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        if record.calls == 0:
            record.seen = describe(model, kwargs)
        record.calls += 1

    def rotary(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if record.calls == 1 and record.rows is None:
            positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            record.rows = _rows(positions)
            record.seen["position_rows_received"] = int(positions.shape[0]) if isinstance(positions, torch.Tensor) and positions.dim() == 3 else 1

    with hooked(model, pre, lambda *_: None, rotary):
        yield record


def unsupported(model: torch.nn.Module, shape: Shape, turns: TwoTurns) -> str:
    """Why this release cannot take the shape at all ('' where it can)."""
    if shape.types == "full" and not turns.takes_types:
        return "forward() takes no mm_token_type_ids on this release"
    if shape.pixels == "B encoded" and not compat.accepts(model.forward, "mm_encoder_outputs"):
        return "forward() takes no mm_encoder_outputs on this release"
    return ""


@torch.no_grad()
def call_kwargs(model: torch.nn.Module, shape: Shape, turns: TwoTurns) -> tuple[torch.Tensor, dict[str, Any]]:
    """(input_ids, the other generate() kwargs) of one shape; the full attention mask always."""
    text_ids = turns.text_turn()[0]
    ids = {"turn2": turns.turn2_ids, "full": turns.full_ids, "text": text_ids}[shape.ids]
    whole = torch.cat([turns.turn1.input_ids, ids], dim=1) if shape.ids != "full" else ids
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(whole)}
    if shape.pixels == "B":
        kwargs["pixel_values"] = turns.pixel_b
    elif shape.pixels == "A+B":
        kwargs["pixel_values"] = torch.cat([turns.pixel_a, turns.pixel_b], dim=0)
    elif shape.pixels == "B encoded":
        features = compat.rope_state_owner(model).get_image_features  # image B's, the way forward() computes them
        kwargs["mm_encoder_outputs"] = {"image": features(turns.pixel_b, turns.grid_b, return_dict=True)}
    if shape.grids != "none":
        kwargs["image_grid_thw"] = turns.grid_b if shape.grids == "B" else turns.both_grids
    if turns.takes_types and shape.types != "none":
        kwargs["mm_token_type_ids"] = turns.types(whole if shape.types == "full" else ids)
    return ids, kwargs


def probed(model: torch.nn.Module, ids: torch.Tensor, kwargs: dict[str, Any], cache: Any, turn1_state: torch.Tensor,
           step: Callable[..., Outcome] = generate_first_step) -> tuple[Outcome, dict[str, Any], Any]:
    """`step` (generate() one greedy step, or forward_step) from a copy of the turn-1 cache, the model-side state at
    turn 1's value: (outcome, what reached its first model call, that copy of the cache)."""
    compat.set_rope_state(model, turn1_state.clone())
    mine = copy.deepcopy(cache)
    with first_call(model) as seen:
        out = step(model, ids, mine, **kwargs)
    return out, {**seen.seen, "position_rows": seen.rows}, mine


def run_shape(model: torch.nn.Module, shape: Shape, turns: TwoTurns, cache: Any,
              turn1_state: torch.Tensor) -> tuple[Outcome, dict[str, Any]]:
    """generate() one step from a copy of the turn-1 cache, the model-side state at turn 1's value."""
    out, call, _ = probed(model, *call_kwargs(model, shape, turns), cache, turn1_state)
    return out, {**call, "rope_deltas_after_call": flat(compat.get_rope_state(model))}


def row(key: str, label: str, out: Outcome, call: dict[str, Any], reference: torch.Tensor,
        floor: NoiseFloor) -> dict[str, Any]:
    """One table row (a call's key and label): the outcome against the noise threshold ('matches' / 'silently wrong' /
    'raises <Type>'), the distance to the reference, where an error was raised, and the first call."""
    metrics = logit_metrics(reference, out.logits) if out.ok else {}
    value = metrics.get("max_abs_diff")
    outcome = f"raises {out.error_type}" if not out.ok else "matches" if floor.matches(value) else "silently wrong"
    return {"key": key, "shape": label, "outcome": outcome, "max_abs_diff": value,
            **{k: metrics.get(k) for k in ("cosine", "top1_equal", "top5_overlap")}, "error": out.error_summary()[:240],
            **call}


def run_all(model: torch.nn.Module, turns: TwoTurns, cache: Any, turn1_state: torch.Tensor,
            references: dict[str, torch.Tensor], floor: NoiseFloor) -> list[dict[str, Any]]:
    """Every shape this release can take (the others as 'not on this release', with why); the model's state is
    put back to turn 1's value afterwards. `references`: {'image': both-turn logits, 'text': the control's}."""
    rows = []
    for shape in SHAPES:
        why = unsupported(model, shape, turns)
        if why:
            rows.append({"key": shape.key, "shape": shape.label, "outcome": "not on this release", "error": why})
            continue
        out, call = run_shape(model, shape, turns, cache, turn1_state)
        reference = references["text" if shape.ids == "text" else "image"]
        rows.append(row(shape.key, shape.label, out, call, reference, floor))
    compat.set_rope_state(model, turn1_state.clone())
    return rows
