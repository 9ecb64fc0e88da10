"""Notebook 07's table (families x checks) and the table as a grid figure."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import plots
from .checks import CHECKS, Measured

TITLE = ("The control's regression list across cache families: each cell vs the noise floor of its family "
         "(rebuild columns vs the original cache; argument sets vs the full forward)")


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


def plot(measured: dict[str, Measured], stem: str) -> Any:
    """The table as a coloured grid (plots.status_grid): one row per family, one column per check, the outcome and its
    max |diff| written in; saved, shown and closed."""
    cells = [[m.cells[c] for c in CHECKS] for m in measured.values()]
    status = [[c.status.replace("_", " ") for c in row] for row in cells]
    values = [["" if c.value is None or c.status == "bitwise" else f"{c.value:.2g}" for c in row] for row in cells]
    return plots.status_grid(list(measured), [c.replace("·", "\n") for c in CHECKS], status, values, TITLE, stem,
                             "regression-grid", cell=(1.25, 0.7))
