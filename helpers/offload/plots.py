"""Notebook 05's figures, saved through helpers.plots.finish into outputs/figures/ and shown."""
from __future__ import annotations

from typing import Any

from kvresume import compat


def _finish(fig: Any, stem: str, name: str) -> Any:
    """Laid out, then saved, shown and closed by helpers.plots.finish (pyplot imported only once a figure is drawn)."""
    from ..plots import finish

    fig.tight_layout()
    return finish(fig, stem, name)


def schedule_heatmap(record: Any, stem: str, name: str = "schedule", marked: list[dict[str, Any]] | None = None,
                     mark_label: str = "unordered read", title: str | None = None) -> Any:
    """Layer x forward-call heatmaps of offload and prefetch calls; `marked` reads get a red frame on the prefetch panel."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    marks = {(r["layer"], r["call_index"]) for r in marked or [] if r["call_index"] < len(record.calls)}
    fig, axes = plt.subplots(1, 2, figsize=(4.0 + 1.1 * len(record.calls) * 2, 1.6 + 0.45 * len(record.layer_types)),
                             squeeze=False)
    for ax, method in zip(axes[0], ("offload", "prefetch")):
        matrix = record.counts(method)
        top = max(1, int(matrix.values.max()))
        im = ax.imshow(matrix.values, cmap="Blues", vmin=0, vmax=top, aspect="auto")
        ax.set_xticks(range(matrix.shape[1]), matrix.columns, rotation=30, ha="right")
        ax.set_yticks(range(matrix.shape[0]), matrix.index)
        for (r, c), v in np.ndenumerate(matrix.values):
            ax.text(c, r, str(v), ha="center", va="center", color="white" if v else "#999999", fontsize=8)
        if method == "prefetch":
            for layer, call in sorted(marks):
                ax.add_patch(Rectangle((call - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="#d62728", linewidth=2.5))
            if marks:
                ax.plot([], [], color="#d62728", linewidth=2.5, label=f"{mark_label} ({len(marks)})")
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.25))
        ax.set_title(f"layer.{method}() calls")
        fig.colorbar(im, ax=ax, fraction=0.04, ticks=list(range(top + 1)))
    fig.suptitle(title or f"DynamicCache(offloading=True): which layers move (transformers {compat.TRANSFORMERS_VERSION})")
    return _finish(fig, stem, name)


def _drift_plot(table: Any, stem: str, name: str, title: str, replay: bool) -> Any:
    """Max |logit diff| vs offloading=False per forward call, one line per variant (symlog), and the noise threshold;
    `replay`: a small x offset and a marker per lag keep equal lines visible, each labelled with its stale reads."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8) if replay else (5.8, 3.6))
    groups = list(table.groupby("variant", sort=False))
    for k, (variant, rows) in enumerate(groups):
        shift = (k - (len(groups) - 1) / 2) * 0.05 if replay else 0.0
        label = f"{variant} ({int(rows.stale_reads.iloc[0])} stale reads)" if replay else variant
        ax.plot(rows.step + shift, rows.max_abs_diff, marker="os^vDPX*"[k % 8] if replay else "o",
                markersize=5 if replay else 6, label=label)
    first = table[table.variant == table.variant.iloc[0]]
    ax.plot(first.step, first.noise_threshold, color="#777777", linestyle="--", label="noise threshold")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_ylim(bottom=0, top=max(1.0, float(table.max_abs_diff.max()) * 2))
    ax.set_xticks(list(first.step), list(first.call), rotation=30, ha="right")
    ax.set_ylabel("max |logit diff| (symlog; 0 = bitwise equal)")
    ax.set_title(title)
    ax.legend(fontsize=7, **({"loc": "upper left", "bbox_to_anchor": (1.02, 1.0)} if replay else {}))
    return _finish(fig, stem, name)


def replay_drift_plot(table: Any, stem: str, name: str = "replay-drift") -> Any:
    """(a) max |logit diff| vs offloading=False per forward call, one line per lag (symlog), and the noise threshold."""
    return _drift_plot(table, stem, name, "Race replay (simulation): drift per call, by lag in cache-update calls", True)


def gpu_drift_plot(steps: Any, stem: str, name: str = "drift") -> Any:
    """Per-step max |logit diff| vs offloading=False, with and without the 5.20.0 edge, against the noise threshold."""
    return _drift_plot(steps, stem, name, "Logit drift per forward call (CUDA)", False)
