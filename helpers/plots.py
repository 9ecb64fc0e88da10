"""The one plotting helper: figures are saved to outputs/figures/<stem>-<name>.png and shown."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt

from .pipeline.paths import output_dir


def save_figure(fig: Any, stem: str, name: str) -> Path:
    """Save `fig` as outputs/figures/<stem>-<name>.png (fixed dpi and metadata, so reruns are identical)."""
    path = output_dir("figures") / f"{stem}-{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path


def panels(series: dict[str, Sequence[float]], draw: Callable[[Any, str, Sequence[float]], None], title: str,
           stem: str, name: str) -> Path:
    """One panel per metric, each drawn by `draw(ax, metric, values)`; saved, shown and closed."""
    fig, axes = plt.subplots(1, len(series), figsize=(4.8 * len(series), 3.6), squeeze=False)
    for ax, (metric, values) in zip(axes[0], series.items()):
        draw(ax, metric, list(values))
        ax.set_title(metric)
    fig.suptitle(title)
    fig.tight_layout()
    path = save_figure(fig, stem, name)
    plt.show()
    plt.close(fig)
    return path


def metric_bars(labels: Sequence[str], series: dict[str, Sequence[float]], title: str, stem: str, name: str,
                log: bool = False) -> Path:
    """One bar panel per metric (e.g. max |diff| and cosine) over the same labels; saved and shown."""

    def draw(ax: Any, _metric: str, values: Sequence[float]) -> None:
        ax.bar(range(len(labels)), values, color="#4c72b0")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        if log:
            ax.set_yscale("symlog", linthresh=1e-6)

    return panels(series, draw, title, stem, name)


def line_plot(x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str, title: str, stem: str, name: str,
              log: bool = False) -> Path:
    """One line panel per metric against a shared x axis; saved and shown."""

    def draw(ax: Any, _metric: str, values: Sequence[float]) -> None:
        ax.plot(list(x), values, marker="o")
        ax.set_xlabel(xlabel)
        if log:
            ax.set_yscale("log")

    return panels(series, draw, title, stem, name)
