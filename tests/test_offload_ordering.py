"""The loops x models ordering table and its decisions (tiny hybrid and its dense twin, 3 forward calls)."""
from __future__ import annotations

import pytest
import torch

from helpers import hybrid
from helpers.offload import loops, ordering


@pytest.fixture(scope="module")
def table():
    models = {name: hybrid.build_layout(name) for name in ("tiny hybrid", "tiny dense")}
    ids = {name: loops.random_ids(m, 2, 8, seed=0) for name, m in models.items()}
    return ordering.ordering_table(ordering.loops_by_models(models, ids, 3, loops.LOOPS))


def _row(table, loop, model):
    return table[(table.loop == loop) & (table.model == model)].iloc[0]


def test_layouts() -> None:
    assert hybrid.LAYOUTS["report layout (64)"]().count("linear_attention") == 48
    assert hybrid.LAYOUTS["report layout (64)"]().count("full_attention") == 16
    assert set(hybrid.LAYOUTS["tiny dense"]()) == {"full_attention"}


def test_dense_twin_counts(table) -> None:
    report, cpu = _row(table, "report", "tiny dense"), _row(table, "cpu", "tiny dense")
    assert report.prefetch_reads == cpu.prefetch_reads == 17
    assert report.unordered_prefetch_reads == 17
    assert cpu.unordered_prefetch_reads == cpu.unordered_same_forward == 3


def test_hybrid_counts_and_distances(table) -> None:
    report = _row(table, "report", "tiny hybrid")
    assert (report.unordered_prefetch_reads, report.prefetch_reads) == (5, 5)
    assert report.unordered_earlier_forward == 2 and report.layers_since_producer == [4]


def test_generate_records_its_host_waits(table) -> None:
    assert _row(table, "generate", "tiny hybrid").host_waits >= 2


def test_decisions_hold_on_the_record(table) -> None:
    assert ordering.decide_not_specific_to_hybrid(table, ["tiny dense"])[0]
    assert ordering.decide_report_loop_reads_previous_forward(table, "tiny hybrid")[0]
    assert ordering.decide_generate_orders_cross_forward(table, "tiny hybrid")[0]


def test_decisions_contradicted() -> None:
    ordered = [{"loop": loop, "model": "m", "unordered_prefetch_reads": 0, "prefetch_reads": 5,
                "unordered_same_forward": 0, "unordered_earlier_forward": 0, "host_waits": 2} for loop in loops.LOOPS]
    assert not ordering.decide_not_specific_to_hybrid(ordered, ["m"])[0]
    assert not ordering.decide_report_loop_reads_previous_forward(ordered, "m")[0]
    assert not ordering.decide_generate_orders_cross_forward(ordered, "m")[0]
    crossing = [dict(r, unordered_earlier_forward=2) for r in ordered]
    assert not ordering.decide_generate_orders_cross_forward(crossing, "m")[0]


def test_not_specific_to_hybrid_needs_a_dense_row() -> None:
    with pytest.raises(LookupError):
        ordering.decide_not_specific_to_hybrid([], ["tiny dense"])


def test_a_model_the_release_cannot_run_is_reported(tiny, ids) -> None:
    class Broken(torch.nn.Module):
        config = tiny.model.config

        def forward(self, *args, **kwargs):
            raise ValueError("not on this release")

    errors: dict[str, str] = {}
    records = ordering.loops_by_models({"broken": Broken()}, {"broken": ids}, 2, ("report",), errors)
    assert records == [] and "not on this release" in errors["broken"]
