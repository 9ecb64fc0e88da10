"""The figure of notebook 09: turn 2's (t, h, w) positions in the one-forward reference and as the resumed call's
first model call received them, one panel per row, image B's tokens shaded (through helpers.plots)."""
from __future__ import annotations

from typing import Any

from .. import plots

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
