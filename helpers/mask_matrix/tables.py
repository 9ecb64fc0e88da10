"""Finding 2: the cache-variant x generation-variant matrix and what the first model call receives.

The failure claims are decided from what was captured (helpers.continuation), not from the error text:
a run "fails as the source describes" only when its first model call got zero input tokens with a
non-empty cache and the exception was raised inside that call; the forward() quirk only when the
positions the rotary embedding received cover the full mask instead of the one new token.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..caches import fresh_copy
from ..compare import logit_metrics
from ..continuation import Outcome, forward_step, generate_first_step


QUIRK_CALLS = ("forward(full mask)", "forward(full mask, sliced positions)", "generate(full mask)")


def matrix_table(outcomes: dict[tuple[str, str], Outcome]) -> pd.DataFrame:
    """Long table: one row per (generation, cache) with worked/failed, the error, its stage and the first call."""
    return pd.DataFrame([{"generation": g, "cache_variant": c, **o.row()} for (g, c), o in outcomes.items()])


def pivot(table: pd.DataFrame) -> pd.DataFrame:
    """The source's 2x2 view: generation variants as rows, cache variants as columns, 'worked' / 'failed (Error)'."""
    cell = table.apply(lambda r: "worked" if r.result == "worked" else f"failed ({r.error_type})", axis=1)
    return table.assign(cell=cell).pivot(index="generation", columns="cache_variant", values="cell")


def forward_quirk_outcomes(model: torch.nn.Module, prompt: Any, variant: Any, positions: torch.Tensor) -> dict[str, Outcome]:
    """Direct one-token forward() with the full mask, without and with sliced 3-D positions, and generate()."""
    return {
        QUIRK_CALLS[0]: forward_step(model, prompt.last_token, fresh_copy(variant), attention_mask=prompt.attention_mask),
        QUIRK_CALLS[1]: forward_step(model, prompt.last_token, fresh_copy(variant),
                                     attention_mask=prompt.attention_mask, position_ids=positions),
        QUIRK_CALLS[2]: generate_first_step(model, prompt.last_token, fresh_copy(variant), attention_mask=prompt.attention_mask),
    }


def quirk_table(runs: dict[str, Outcome], reference_logits: torch.Tensor) -> pd.DataFrame:
    """One row per quirk call: worked/failed, stage, rotary positions seen, and the logits against the full forward."""
    rows = []
    for name, out in runs.items():
        row = {"call": name, **out.row()}
        if out.ok:
            m = logit_metrics(reference_logits, out.logits)
            row.update({"max_abs_diff_vs_full_forward": m["max_abs_diff"], "top1_equal": m["top1_equal"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("call")


def _shape(value: Any) -> str:
    return "—" if value is None else "[" + ", ".join(str(v) for v in value) + "]"


def _status_cell(r: Any) -> tuple[str, str]:
    return ("worked" if r.result == "worked" else "failed",
            f"ids {_shape(r.input_ids_shape)} mask {_shape(r.attention_mask_shape)}\npast {r.past_length}")


def status_grid_data(table: pd.DataFrame) -> tuple[list[str], list[str], list[list[str]], list[list[str]]]:
    """(cache variants, argument sets, status, text) for plots.status_grid: the source's table, each cell annotated
    with the first model call's input_ids and attention_mask shapes (and the cache length it saw)."""
    from ..plots import grid_cells  # matplotlib only when a figure is drawn

    return grid_cells(table, "cache_variant", "generation", _status_cell)
