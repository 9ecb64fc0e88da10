"""helpers.plots: the noise threshold line on difference panels, 1 - cosine clamped at 0, captions, status grids."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers import plots  # noqa: E402


def _threshold_lines(ax) -> list[float]:
    return [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]


@pytest.mark.parametrize("log", [False, True])
def test_a_difference_panel_draws_its_threshold_and_keeps_it_in_view(log):
    fig = plots.bar_figure(["a", "b"], {"max |diff|": [1e-7, 2e-7], "cosine": [1.0, 1.0]}, "t", log=log,
                           thresholds={"max |diff|": 5e-6})
    try:
        diff, cos = fig.axes
        assert _threshold_lines(diff) == [5e-6] and _threshold_lines(cos) == []
        assert diff.get_ylim()[1] > 5e-6  # extended to show the line above the bars
        assert "noise threshold\n5e-06" in [t.get_text() for t in diff.texts]
    finally:
        plt.close(fig)


def test_line_plots_take_thresholds_and_captions():
    fig = plots.line_figure([0, 1], {"max |diff|": [0.0, 0.3]}, "offset", "t", thresholds={"max |diff|": 0.01},
                            caption=plots.run_caption("tiny-qwen3-vl", "float32", "cpu"))
    try:
        assert _threshold_lines(fig.axes[0]) == [0.01]
        assert any("random-weight tiny model tiny-qwen3-vl" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)


def test_one_minus_cosine_is_clamped_at_zero():
    assert plots.one_minus([1.0000001, 0.75, None, float("nan")]) == [0.0, 0.25, None, None]


def test_captions_name_simulation_stand_ins_and_random_weights():
    text = plots.run_caption("tiny-qwen3-next", "float32", "cpu", simulation=True, stand_ins=True)
    assert text.startswith("simulation") and "recorded on CPU under stand-ins" in text and "random-weight" in text
    assert plots.run_caption("Qwen/Qwen3-VL-2B-Instruct", "float16", "cuda") == "Qwen/Qwen3-VL-2B-Instruct; float16; cuda"


def test_status_grid_colours_and_annotates_every_cell():
    fig = plots.status_grid_figure(["original", "rebuilt"], ["neither", "mask_only"],
                                   [["failed", "worked"], ["failed", "worked"]],
                                   [["ids [1, 0] mask [1, 1]", "ids [1, 1] mask [1, 82]"]] * 2, "t", caption="c")
    try:
        ax = fig.axes[0]
        texts = [t.get_text() for t in ax.texts]
        assert texts.count("failed\nids [1, 0] mask [1, 1]") == 2 and texts.count("worked\nids [1, 1] mask [1, 82]") == 2
        colours = [p.get_facecolor()[:3] for p in ax.patches]
        assert len(colours) == 4 and colours[0] != colours[1]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["neither", "mask_only"]
    finally:
        plt.close(fig)
