"""Notebook 07's table (families x checks) and the table as a grid figure."""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from .. import plots
from .checks import CHECKS, Measured

COLOURS = {"bitwise": "#1b7837", "matches": "#7fbf7b", "differs": "#d6604d", "error": "#f4a582",
           "zero_input": "#b2abd2", "both_error": "#fddbc7", "skipped": "#e0e0e0"}


def label(status: str, value: float | None) -> str:
    """A cell's text: status, and the max |diff| where one was measured (not for bitwise: it is 0)."""
    if value is None or status == "bitwise":
        return status.replace("_", " ")
    return f"{status} {value:.2g}"


def grid(measured: dict[str, Measured]) -> pd.DataFrame:
    """families x checks, each cell 'status value'."""
    return pd.DataFrame({name: {c: label(m.cells[c].status, m.cells[c].value) for c in CHECKS}
                         for name, m in measured.items()}).T.rename_axis("family")


def long_rows(measured: dict[str, Measured]) -> list[dict[str, Any]]:
    """Every cell as one record, with what reached the first model call and the family's threshold."""
    return [{**m.cells[c].row(), "noise_threshold": m.floor.threshold} for m in measured.values() for c in CHECKS]


def floors(measured: dict[str, Measured]) -> pd.DataFrame:
    """Per family: the noise floor and threshold the cells were judged against."""
    return pd.DataFrame({name: {"noise_floor": m.floor.floor, "threshold": m.floor.threshold, "from": m.floor.what}
                         for name, m in measured.items()}).T.rename_axis("family")


def figure(measured: dict[str, Measured]) -> Any:
    """The table as a coloured grid: one row per family, one column per check, the outcome written in."""
    names = list(measured)
    fig, ax = plt.subplots(figsize=(1.25 * len(CHECKS) + 1.5, 0.7 * len(names) + 1.8))
    for r, name in enumerate(names):
        for c, check in enumerate(CHECKS):
            cell = measured[name].cells[check]
            ax.add_patch(plt.Rectangle((c, r), 1, 1, color=COLOURS.get(cell.status, "white"), ec="white"))
            ax.text(c + 0.5, r + 0.5, label(cell.status, cell.value).replace(" ", "\n", 1), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(CHECKS))
    ax.set_ylim(len(names), 0)
    ax.set_xticks([i + 0.5 for i in range(len(CHECKS))], [c.replace("·", "\n") for c in CHECKS], rotation=0, fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(len(names))], names, fontsize=8)
    ax.tick_params(length=0)
    ax.set_title("The control's regression list across cache families: each cell vs the noise floor of its family "
                 "(rebuild columns vs the original cache; argument sets vs the full forward)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in COLOURS.values()]
    ax.legend(handles, [k.replace("_", " ") for k in COLOURS], loc="upper center", bbox_to_anchor=(0.5, -0.22),
              ncol=len(COLOURS), fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def plot(measured: dict[str, Measured], stem: str) -> Any:
    """Save (through helpers.plots), show and close the grid."""
    return plots.finish(figure(measured), stem, "regression-grid")
