"""Finding 2: the cache-variant x generation-variant matrix and what the first model call receives."""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from .caches import fresh_copy
from .compare import logit_metrics
from .continuation import Outcome, forward_step, generate_first_step


def matrix_table(outcomes: dict[tuple[str, str], Outcome]) -> pd.DataFrame:
    """Long table: one row per (generation, cache) with worked/failed, the error type and the first call."""
    return pd.DataFrame([{"generation": g, "cache_variant": c, **o.row()} for (g, c), o in outcomes.items()])


def pivot(table: pd.DataFrame) -> pd.DataFrame:
    """The seed's 2x2 view: generation variants as rows, cache variants as columns, 'worked' / 'failed (Error)'."""
    cell = table.apply(lambda r: "worked" if r.result == "worked" else f"failed ({r.error_type})", axis=1)
    return table.assign(cell=cell).pivot(index="generation", columns="cache_variant", values="cell")


def forward_quirk(model: torch.nn.Module, prompt: Any, variant: Any, positions: torch.Tensor,
                  reference_logits: torch.Tensor) -> pd.DataFrame:
    """Direct one-token forward() with the full mask, without and with sliced 3-D positions, vs generate()."""
    runs = {
        "forward(full mask)": forward_step(model, prompt.last_token, fresh_copy(variant), attention_mask=prompt.attention_mask),
        "forward(full mask, sliced positions)": forward_step(model, prompt.last_token, fresh_copy(variant),
                                                             attention_mask=prompt.attention_mask, position_ids=positions),
        "generate(full mask)": generate_first_step(model, prompt.last_token, fresh_copy(variant),
                                                   attention_mask=prompt.attention_mask),
    }
    rows = []
    for name, out in runs.items():
        row = {"call": name, **out.row()}
        if out.ok:
            m = logit_metrics(reference_logits, out.logits)
            row.update({"max_abs_diff_vs_full_forward": m["max_abs_diff"], "top1_equal": m["top1_equal"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("call")
