"""The repair: turn 2's 3-D positions from the full sequence (the model's own get_rope_index over both turns' ids
and both images' grids), resumed at (a direct forward, and generate() with explicit positions), and the model-side
`rope_deltas` carried forward to its value after turn 2 so the turn after that is placed right too."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from kvresume import compat
from ..compare import NoiseFloor
from ..continuation import Outcome, forward_step, generate_first_step
from ..inputs import Prompt
from .shapes import flat, probed, row
from .turns import TwoTurns


@dataclass
class Positions:
    """turn 2's [t, h, w] positions (3 x 1 x n) and rope_deltas after turn 2, from the full sequence."""

    rows: torch.Tensor
    rope_deltas: torch.Tensor
    start: int  # index of turn 2's first token in the full sequence

    def as_lists(self) -> list[list[int]]:
        return [self.rows[i, 0].tolist() for i in range(3)]

    def with_text_row(self) -> torch.Tensor:
        """4 x 1 x n: the text row (sequence index, for the causal mask) on top of the three M-RoPE rows."""
        n = self.rows.shape[-1]
        text = torch.arange(self.start, self.start + n, device=self.rows.device).view(1, 1, n)
        return torch.cat([text, self.rows], dim=0)


@torch.no_grad()
def full_positions(model: torch.nn.Module, turns: TwoTurns) -> Positions:
    """get_rope_index over the full ids with both grids; turn 2's slice of its positions and its rope_deltas."""
    owner = compat.rope_state_owner(model)
    kwargs: dict[str, Any] = {"image_grid_thw": turns.both_grids, "attention_mask": turns.full_mask}
    if compat.accepts(owner.get_rope_index, "mm_token_type_ids"):
        kwargs["mm_token_type_ids"] = turns.types(turns.full_ids)
    positions, deltas = owner.get_rope_index(turns.full_ids, **kwargs)
    return Positions(positions[:, :, turns.cached:].clone(), deltas.clone(), turns.cached)


def call_kwargs(turns: TwoTurns, positions: Positions) -> tuple[torch.Tensor, dict[str, Any]]:
    """(input_ids, the other generate() kwargs) of the repaired call: turn 2 and image B (its own pixels and grid) at
    the full-sequence positions, with the full attention mask."""
    kwargs: dict[str, Any] = {"position_ids": positions.with_text_row(), "pixel_values": turns.pixel_b,
                              "image_grid_thw": turns.grid_b, "attention_mask": turns.full_mask}
    if turns.takes_types:
        kwargs["mm_token_type_ids"] = turns.types(turns.turn2_ids)
    return turns.turn2_ids, kwargs


@torch.no_grad()
def next_turn(model: torch.nn.Module, turns: TwoTurns, token: int, cache_after_turn2: Any,
              state: torch.Tensor) -> tuple[Outcome, torch.Tensor]:
    """One more token after turn 2, resumed from the cache that holds both turns with the model-side state set to
    `state`, and its reference (one forward over both turns + that token): (outcome, reference logits)."""
    ids = torch.cat([turns.full_ids, torch.tensor([[token]], device=turns.full_ids.device)], dim=1)
    full = turns.full_prompt()
    mm = dict(full.mm_kwargs)
    if "mm_token_type_ids" in mm:
        mm["mm_token_type_ids"] = turns.types(ids)
    compat.set_rope_state(model, None)
    reference = model(**Prompt(ids, torch.ones_like(ids), mm).forward_kwargs(), use_cache=False).logits[:, -1, :]
    compat.set_rope_state(model, state.clone())
    out = generate_first_step(model, ids[:, -1:], copy.deepcopy(cache_after_turn2), attention_mask=torch.ones_like(ids))
    return out, reference.detach().clone()


def rows(model: torch.nn.Module, turns: TwoTurns, cache: Any, positions: Positions, turn1_state: torch.Tensor,
         reference: torch.Tensor, floor: NoiseFloor) -> dict[str, dict[str, Any]]:
    """The repair measured: direct forward and generate() at the repaired positions against the reference, then the
    next token with rope_deltas as the repaired call left it and carried forward, against its own reference."""
    direct, direct_call, cache_after = probed(model, *call_kwargs(turns, positions), cache, turn1_state, forward_step)
    generated, generated_call, _ = probed(model, *call_kwargs(turns, positions), cache, turn1_state)
    out = {"forward": row("repair_forward", "repair: forward at full-sequence positions", direct, direct_call,
                          reference, floor),
           "generate": row("repair_generate", "repair: generate() with explicit positions", generated, generated_call,
                           reference, floor)}
    token = int(reference.argmax())
    left = compat.get_rope_state(model).clone()  # what the repaired calls left on the model
    carried = positions.rope_deltas.clone()  # the resume-state update: rope_deltas at its value after turn 2
    for key, label, state in (("next_stale", "next token, rope_deltas as the repaired call left it", left),
                              ("next_carried", "next token, rope_deltas carried forward", carried)):
        out_next, next_reference = next_turn(model, turns, token, cache_after, state)
        out[key] = row(key, label, out_next, {"rope_deltas_before": flat(state)}, next_reference, floor)
    return out
