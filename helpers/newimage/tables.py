"""What notebook 09 shows: the call shapes' outcomes, what reached their first model call, the guard check's answer
for each shape, and the figure of turn 2's (t, h, w) positions (through helpers.plots)."""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import torch

from .. import plots
from .decisions import image_b_positions
from .shapes import SHAPES, call_kwargs, unsupported
from .turns import TwoTurns

SHORT = {"a_turn2_ids": "(a)", "a_turn2_ids_full_types": "(a) + types", "b_full_ids_both_images": "(b)",
         "b_full_ids_both_images_full_types": "(b) + types", "c_full_ids_image_b": "(c)",
         "c_full_ids_image_b_full_types": "(c) + types", "d_full_ids_b_encoded_full_types": "(d)",
         "control_text_turn": "text turn", "repair_forward": "repair: forward", "repair_generate": "repair: generate",
         "next_stale": "next, stale state", "next_carried": "next, carried"}
OUTCOME_COLUMNS = ("shape", "outcome", "max_abs_diff", "cosine", "top1_equal", "top5_overlap", "error")
FIRST_CALL = {"input_ids_shape": "input_ids", "pixel_values_shape": "pixel_values",  # a row's key: its column
              "mm_encoder_outputs": "mm_encoder_outputs", "image_grid_thw": "image_grid_thw",
              "mm_token_type_ids_shape": "mm_token_type_ids", "position_ids_shape": "position_ids",
              "position_rows_received": "rows received"}


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Outcome and distance to the reference, one row per call."""
    return pd.DataFrame([{k: r.get(k) for k in OUTCOME_COLUMNS} for r in rows]).set_index("shape")


def short(row: dict[str, Any]) -> str:
    """A row's bar label."""
    return SHORT.get(row["key"], row["shape"])


def _ends(rows: list[list[int]] | None) -> str | None:
    """'t/h/w of the first .. last token' from three position rows."""
    return None if not rows else f"{[r[0] for r in rows]} .. {[r[-1] for r in rows]}"


def first_calls(rows: list[dict[str, Any]], span: tuple[int, int]) -> pd.DataFrame:
    """What reached each call's first model call: ids, pixel inputs, position rows, rope_deltas before and after."""
    return pd.DataFrame([{"shape": r["shape"], **{name: r.get(key) for key, name in FIRST_CALL.items()},
                          "turn-2 positions (first, last)": _ends(r.get("position_rows")),
                          "image B t/h/w (first .. last)": None if r["key"] == "control_text_turn"
                          else _ends(image_b_positions(r.get("position_rows"), span)),
                          "rope_deltas before": r.get("rope_deltas_before"), "after": r.get("rope_deltas_after_call")}
                         for r in rows]).set_index("shape")


def guard_messages(model: torch.nn.Module, turns: TwoTurns, cache: Any,
                   check: Callable[..., str | None]) -> dict[str, str | None]:
    """{shape key: the check's message or None} for every shape this release can take, given generate()'s kwargs."""
    calls = {s.key: call_kwargs(model, s, turns) for s in SHAPES if not unsupported(model, s, turns)}
    return {key: check(model, ids, cache=cache, **kwargs) for key, (ids, kwargs) in calls.items()}


ROWS = ("t (temporal)", "h (height)", "w (width)")


def plot_positions(reference: list[list[int]], resumed: dict[str, list[list[int]]], span: tuple[int, int], start: int,
                   title: str, stem: str, name: str, caption: str | None = None) -> Any:
    """reference: [t, h, w] rows of turn 2; resumed: {label: rows as received}; span: image B inside turn 2; saved to
    outputs/figures/<stem>-<name>.png and shown."""
    x = list(range(start, start + len(reference[0])))

    def draw(ax: Any, metric: str, _values: Any) -> None:
        i = ROWS.index(metric)
        ax.axvspan(start + span[0] - 0.5, start + span[1] - 0.5, color="0.9", label="image B's tokens")
        ax.plot(x, reference[i], color="black", linewidth=2, label="reference (one forward)")
        for label, rows in resumed.items():
            if rows is not None:
                ax.plot(x[:len(rows[i])], rows[i], linestyle="--", marker=".", markersize=3, label=label)
        ax.set_xlabel("sequence index of turn 2's tokens")
        ax.set_ylabel("position")
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")

    return plots.finish(plots.figure({row: [] for row in ROWS}, draw, title, caption=caption), stem, name)
