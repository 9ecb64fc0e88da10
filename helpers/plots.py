"""The one plotting helper: figures are saved to outputs/figures/<stem>-<name>.png and shown.

Every bar carries its value as a label (a zero bar, invisible otherwise, reads "0"; a value that
was not measured reads "n/a"), and every axis leaves room above its tallest bar, so no bar is
clipped or lost, on a linear or a log scale. Every difference panel can carry its noise threshold
(`thresholds={metric: value}`, drawn by `threshold_line`), every figure a caption saying what made it
(`run_caption`: random-weight tiny model, simulation, recorded on CPU under stand-ins), and a source's
own pass/fail table is drawn as a grid (`status_grid`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt

from .pipeline.paths import output_dir

HEADROOM = 0.18  # fraction of the data range kept free above the tallest bar (linear axes), for its label
LINTHRESH = 1e-6  # symlog: linear below this magnitude (so 0 and tiny differences can be drawn)


def save_figure(fig: Any, stem: str, name: str) -> Path:
    """Save `fig` as outputs/figures/<stem>-<name>.png (fixed dpi and metadata, so reruns are identical)."""
    path = output_dir("figures") / f"{stem}-{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def _finite(values: Sequence[Any]) -> list[float | None]:
    """Values as floats; None, NaN and non-numbers become None (not measured)."""
    out: list[float | None] = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = math.nan
        out.append(f if math.isfinite(f) else None)
    return out


def value_label(value: float | None) -> str:
    """A bar's label: n/a, 0, or three significant digits."""
    return "n/a" if value is None else "0" if value == 0 else f"{value:.3g}"


THRESHOLD_STYLE = {"color": "#c44e52", "linestyle": "--", "linewidth": 1.2}


def threshold_line(ax: Any, value: float | None, label: str = "noise threshold") -> None:
    """A dashed horizontal line at `value` (a difference's noise threshold: margin x floor), in the legend."""
    if value is None or not math.isfinite(float(value)):
        return
    value = float(value)
    low, high = ax.get_ylim()
    if value > high:  # the line must be visible: extend the axis above it
        ax.set_ylim(low, value * (10 if ax.get_yscale() != "linear" else 1 + HEADROOM))
    ax.axhline(value, **THRESHOLD_STYLE)
    # labelled at the right end, outside the axes (x in axes, y in data units), so it never covers a bar or its value
    ax.text(1.01, value, f"{label}\n{value:.3g}", transform=ax.get_yaxis_transform(),
            ha="left", va="center", fontsize=7, color=THRESHOLD_STYLE["color"])


def one_minus(values: Sequence[Any]) -> list[float | None]:
    """1 - x for each value (e.g. cosine), clamped at 0 (1 - cosine of two equal vectors can come out as -1e-7)."""
    return [None if v is None else max(0.0, 1.0 - v) for v in _finite(values)]


def run_caption(model_id: str | None = None, dtype: str | None = None, device: str | None = None,
                simulation: bool = False, stand_ins: bool = False) -> str:
    """What produced a figure: 'random-weight tiny model' for the tiny defaults, 'simulation', 'recorded on CPU
    under stand-ins', then the model, dtype and device."""
    parts = [text for on, text in ((simulation, "simulation (a model of the hardware, not a measurement of it)"),
                                   (stand_ins, "recorded on CPU under stand-ins")) if on]
    if model_id and str(model_id).startswith("tiny-"):
        parts.append(f"random-weight tiny model {model_id}: magnitudes are not a real checkpoint's")
    elif model_id:
        parts.append(str(model_id))
    parts += [p for p in (dtype, device) if p]
    return "; ".join(parts)


def titled(fig: Any, title: str, caption: str | None, **at: Any) -> Any:
    """The figure with its title, laid out, and its caption (if any) under it."""
    fig.suptitle(title, **at)
    fig.tight_layout()
    if caption:
        fig.text(0.5, -0.02, caption, ha="center", va="top", fontsize=8, color="0.3", wrap=True)
    return fig


def figure(series: dict[str, Sequence[Any]], draw: Callable[[Any, str, Sequence[Any]], None], title: str,
           n_labels: int = 0, thresholds: dict[str, float | None] | None = None, caption: str | None = None) -> Any:
    """One panel per metric, each drawn by `draw(ax, metric, values)`; wide enough for `n_labels` bars;
    `thresholds`: {metric: noise threshold} drawn as a dashed line on that panel; `caption` under it all."""
    width = max(4.8, 0.55 * n_labels + 1.6)
    fig, axes = plt.subplots(1, len(series), figsize=(width * len(series), 3.8), squeeze=False)
    for ax, (metric, values) in zip(axes[0], series.items()):
        draw(ax, metric, list(values))
        ax.set_title(metric)
        if thresholds and metric in thresholds:
            threshold_line(ax, thresholds[metric])
    return titled(fig, title, caption)


def finish(fig: Any, stem: str, name: str) -> Path:
    """Save, show and close a figure."""
    path = save_figure(fig, stem, name)
    plt.show()
    plt.close(fig)
    return path


def _fit_linear(ax: Any, values: list[float]) -> None:
    lo, hi = min(0.0, *values), max(0.0, *values)
    if hi == lo:  # every value is 0: an axis from 0, and the panel says so
        ax.set_ylim(0, 1)
        ax.set_yticks([0])
        ax.text(0.5, 0.5, "every value is 0", transform=ax.transAxes, ha="center", va="center", color="0.35")
        return
    span = hi - lo
    ax.set_ylim(lo - (HEADROOM * span if lo < 0 else 0), hi + (HEADROOM * span if hi > 0 else 0))


def _fit_log(ax: Any, values: list[float]) -> None:
    """symlog (linear below LINTHRESH, so 0 has a place); a decade of room above the top, and below the bottom
    only for negatives beyond float rounding (a -1e-7 from 1 - cosine is labelled, not given an axis)."""
    ax.set_yscale("symlog", linthresh=LINTHRESH)
    top, bottom = max(0.0, *values), min(0.0, *values)
    ax.set_ylim(bottom * 10 if bottom < -LINTHRESH else 0, top * 10 if top > 0 else LINTHRESH * 10)


def _label_bars(ax: Any, values: list[float | None]) -> None:
    """Each bar's value at its end; a bar too small or below the axis gets its label on the baseline."""
    bottom = ax.get_ylim()[0]
    for x, v in enumerate(values):
        below = v is not None and bottom <= v < 0
        y = v if below or (v is not None and v > 0) else 0.0
        ax.annotate(value_label(v), (x, y), xytext=(0, -2 if below else 2), textcoords="offset points", ha="center",
                    va="top" if below else "bottom", fontsize=8)


def draw_bars(ax: Any, labels: Sequence[str], values: Sequence[Any], log: bool = False) -> None:
    """Bars with their values written on them; axes that fit every bar and its label."""
    vals = _finite(values)
    ax.bar(range(len(labels)), [0.0 if v is None else v for v in vals], color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    present = [v for v in vals if v is not None] or [0.0]
    (_fit_log if log else _fit_linear)(ax, present)
    _label_bars(ax, vals)


def bar_figure(labels: Sequence[str], series: dict[str, Sequence[Any]], title: str, log: bool = False,
               thresholds: dict[str, float | None] | None = None, caption: str | None = None) -> Any:
    """The figure metric_bars saves: one labelled bar panel per metric."""
    return figure(series, lambda ax, _metric, values: draw_bars(ax, labels, values, log), title, len(labels),
                  thresholds, caption)


def metric_bars(labels: Sequence[str], series: dict[str, Sequence[float]], title: str, stem: str, name: str,
                log: bool = False, thresholds: dict[str, float | None] | None = None, caption: str | None = None) -> Path:
    """One bar panel per metric (e.g. max |diff| and cosine) over the same labels, each difference panel with its
    noise threshold (`thresholds`); saved and shown."""
    return finish(bar_figure(labels, series, title, log, thresholds, caption), stem, name)


def draw_lines(ax: Any, x: Sequence[float], values: Sequence[Any], xlabel: str, log: bool = False) -> None:
    """A line with markers; a log axis that still shows 0 (symlog) and room above the top point."""
    vals = _finite(values)
    ax.plot(list(x), [math.nan if v is None else v for v in vals], marker="o")
    ax.set_xlabel(xlabel)
    present = [v for v in vals if v is not None] or [0.0]
    if log and min(present) > 0:
        ax.set_yscale("log")
    elif log:
        _fit_log(ax, present)
    else:
        _fit_linear(ax, present)


def line_figure(x: Sequence[float], series: dict[str, Sequence[Any]], xlabel: str, title: str, log: bool = False,
                thresholds: dict[str, float | None] | None = None, caption: str | None = None) -> Any:
    """The figure line_plot saves: one line panel per metric against a shared x axis."""
    return figure(series, lambda ax, _metric, values: draw_lines(ax, x, values, xlabel, log), title,
                  thresholds=thresholds, caption=caption)


def line_plot(x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str, title: str, stem: str, name: str,
              log: bool = False, thresholds: dict[str, float | None] | None = None, caption: str | None = None) -> Path:
    """One line panel per metric against a shared x axis (difference panels with their noise threshold); saved, shown."""
    return finish(line_figure(x, series, xlabel, title, log, thresholds, caption), stem, name)


STATUS_COLORS = {"worked": "#55a868", "equal": "#55a868", "failed": "#c44e52", "differs": "#c44e52",
                 "not run": "#bbbbbb", "n/a": "#bbbbbb",
                 # notebook 08's confusion table: the guard against plain generate()
                 "passed": "#55a868", "caught": "#55a868", "clearer error": "#8fbf9a", "missed": "#c44e52",
                 "false alarm": "#c44e52", "not caught": "#bbbbbb",
                 # notebook 07's regression grid: each cell against the noise floor of its family
                 "bitwise": "#1b7837", "matches": "#7fbf7b", "error": "#f4a582", "zero input": "#b2abd2",
                 "both error": "#fddbc7", "skipped": "#e0e0e0"}


def grid_cells(table: Any, row_key: str, col_key: str,
               cell: Callable[[Any], tuple[str, str]]) -> tuple[list[str], list[str], list[list[str]], list[list[str]]]:
    """(rows, cols, status, text) for status_grid: one cell per (row_key, col_key) pair of `table`, in first-seen
    order, `cell(row)` giving that cell's (status, text)."""
    rows = list(dict.fromkeys(table[row_key]))
    cols = list(dict.fromkeys(table[col_key]))
    cells = [[cell(table[(table[row_key] == r) & (table[col_key] == c)].iloc[0]) for c in cols] for r in rows]
    return rows, cols, [[st for st, _ in line] for line in cells], [[tx for _, tx in line] for line in cells]


def status_grid_figure(rows: Sequence[str], cols: Sequence[str], status: Sequence[Sequence[str]],
                       text: Sequence[Sequence[str]], title: str, caption: str | None = None,
                       cell: tuple[float, float] = (2.3, 0.9)) -> Any:
    """A rows x cols grid of coloured cells (status: worked/equal green, failed/differs red, not run grey),
    each annotated with `text` (e.g. the first call's input_ids/mask shapes): a source's own pass/fail table;
    `cell`: a cell's (width, height) in inches."""
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(cell[0] * len(cols) + 2.2, cell[1] * len(rows) + 1.6))
    for i, _ in enumerate(rows):
        for j, _ in enumerate(cols):
            state = status[i][j]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=STATUS_COLORS.get(state, "#dddddd"), edgecolor="white", lw=2))
            ax.text(j + 0.5, i + 0.5, f"{state}\n{text[i][j]}", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(cols))], list(cols))
    ax.set_yticks([i + 0.5 for i in range(len(rows))], list(rows))
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    for spine in ax.spines.values():
        spine.set_visible(False)
    return titled(fig, title, caption, y=1.02)


def status_grid(rows: Sequence[str], cols: Sequence[str], status: Sequence[Sequence[str]], text: Sequence[Sequence[str]],
                title: str, stem: str, name: str, caption: str | None = None,
                cell: tuple[float, float] = (2.3, 0.9)) -> Path:
    """The status grid (see status_grid_figure); saved and shown."""
    return finish(status_grid_figure(rows, cols, status, text, title, caption, cell), stem, name)
