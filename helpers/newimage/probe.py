"""What reached the first model call of a resumed turn: ids, pixel inputs, the three M-RoPE position rows the text
rotary embedding received, and the model-side `rope_deltas` before and after that call (forward hooks only)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kvresume import compat
from ..continuation import describe_call, hooked, shape_of
from ..rope import as_list as flat


@dataclass
class FirstCall:
    """The first model call of one continuation, as the hooks saw it."""

    seen: dict[str, Any] = field(default_factory=dict)
    rows: list[list[int]] | None = None  # [t, h, w] positions of the call's tokens (batch row 0)
    rope_deltas_after: list | None = None
    calls: int = 0

    def summary(self) -> dict[str, Any]:
        return {**self.seen, "position_rows": self.rows, "rope_deltas_after": self.rope_deltas_after}


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

    def post(_module: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], _out: Any) -> None:
        if record.calls == 1 and record.rope_deltas_after is None:
            record.rope_deltas_after = flat(compat.get_rope_state(model))

    def rotary(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if record.calls == 1 and record.rows is None:
            positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            record.rows = _rows(positions)
            record.seen["position_rows_received"] = int(positions.shape[0]) if isinstance(positions, torch.Tensor) and positions.dim() == 3 else 1

    with hooked(model, pre, post, rotary):
        yield record
