"""Kill tests for the loops x models ordering logic (make mutants: helpers/offload/ordering.py) on hand-made stream
records and tables: prefetch distances, the table row, and every decision fed holding and contradicting rows."""
from __future__ import annotations

from typing import Any

import pytest

from helpers.offload import ordering, tracking
from helpers.offload.loops import GreedyRun
from helpers.offload.ordering import PREFETCH, LoopRecord
from helpers.offload.streams import StreamLog


def _write(log: StreamLog, op: str, layer: int, update: tuple[int, int], reads: str | None, writes: str | None,
           stream: Any) -> None:
    """One access during cache-update call update[0], made for decoder layer update[1]."""
    log.update_index, log.update_layer = update
    log.access(op, layer, reads, writes, stream=stream)


def two_forwards(sync_between: bool = False, n_layers: int = 8) -> LoopRecord:
    """prefill: offload 3 (call 3), offload 7 (call 7), the wrap prefetch of 3 in update(7) (same forward);
    decode 1: a compute read (not a prefetch), then the prefetch of 7 in update(2) (call 10, reads the prefill's copy of 7)."""
    log = StreamLog()
    default, side = log.default_stream(), log.new_stream("prefetch")
    log.begin("prefill")
    _write(log, "offload copy (device->host)", 3, (3, 3), tracking.device_buffer(3), tracking.host_buffer(3), default)
    _write(log, "offload copy (device->host)", 7, (7, 7), tracking.device_buffer(7), tracking.host_buffer(7), default)
    _write(log, PREFETCH, 3, (7, 7), tracking.host_buffer(3), tracking.device_buffer(3), side)
    log.begin("decode 1", host_synced=sync_between)
    _write(log, "layer update (compute)", 3, (9, 1), tracking.device_buffer(3), tracking.device_buffer(3), default)
    _write(log, PREFETCH, 7, (10, 2), tracking.host_buffer(7), tracking.device_buffer(7), side)
    run = GreedyRun([], [], host_waits=["decode 1"] if sync_between else [])
    return LoopRecord("report", "m", log, run, n_layers, "none")


def test_prefetch_reads_distances_and_forwards():
    reads = ordering.prefetch_reads(two_forwards())
    assert [(r["layer"], r["same_forward"], r["forwards_back"], r["layers_since_producer"], r["calls_since_producer"],
             r["ordered"]) for r in reads] == [(3, True, 0, 4, 4, False), (7, False, 1, 3, 3, False)]
    deeper = ordering.prefetch_reads(two_forwards(n_layers=64))
    assert [r["layers_since_producer"] for r in deeper] == [4, 59]
    assert all(r["reader"] == PREFETCH for r in reads)  # the compute read of layer 3 is not a prefetch read


def test_summary_row_whole_output():
    assert ordering.summary_row(two_forwards()) == {
        "loop": "report", "model": "m", "edge": "none", "unordered_prefetch_reads": 2, "prefetch_reads": 2,
        "unordered_same_forward": 1, "unordered_earlier_forward": 1, "calls_since_producer": [3, 4],
        "layers_since_producer": [3, 4], "host_waits": 0}
    synced = ordering.summary_row(two_forwards(sync_between=True))
    assert (synced["unordered_prefetch_reads"], synced["unordered_same_forward"], synced["unordered_earlier_forward"]) == (1, 1, 0)
    assert synced["layers_since_producer"] == [4] and synced["host_waits"] == 1


def row(loop: str, model: str = "m", same: int = 0, earlier: int = 0, reads: int = 5, waits: int = 0) -> dict[str, Any]:
    return {"loop": loop, "model": model, "unordered_prefetch_reads": same + earlier, "prefetch_reads": reads,
            "unordered_same_forward": same, "unordered_earlier_forward": earlier, "host_waits": waits}


def test_rows_match_every_key_and_take_tables_or_lists():
    import pandas as pd

    rows = [row("report"), row("cpu"), row("report", model="n")]
    assert ordering._rows(rows, loop="report", model="m") == [rows[0]]
    assert ordering._rows(pd.DataFrame(rows), loop="report") == [rows[0], rows[2]]
    assert ordering._rows(rows) == rows and ordering._rows(rows, loop="generate") == []


def test_not_specific_to_hybrid():
    table = [row("report", "dense", same=1), row("cpu", "dense2", same=2), row("report", "dense2")]
    assert ordering.decide_not_specific_to_hybrid(table, ["dense", "dense2"]) == (
        True, {"dense_unordered_report_loop": {"dense": 1, "dense2": 0}})
    assert ordering.decide_not_specific_to_hybrid(table, ["dense2"])[0] is False  # only its .cpu() loop has some
    assert ordering.decide_not_specific_to_hybrid(table, ["dense", "absent"])[1] == {"dense_unordered_report_loop": {"dense": 1}}
    with pytest.raises(LookupError):
        ordering.decide_not_specific_to_hybrid(table, ["absent"])


def test_report_loop_reads_previous_forward():
    assert ordering.decide_report_loop_reads_previous_forward([row("report", same=3, earlier=1)], "m") == (
        True, {"unordered_earlier_forward": 1, "unordered_same_forward": 3})
    assert ordering.decide_report_loop_reads_previous_forward([row("report", same=3), row("cpu", earlier=2)], "m")[0] is False


def test_generate_orders_cross_forward_reads_each_condition():
    ok = [row("generate", same=3, waits=2), row("report", same=3, earlier=2)]
    assert ordering.decide_generate_orders_cross_forward(ok, "m") == (True, {
        "generate_unordered_earlier_forward": 0, "generate_unordered_same_forward": 3, "generate_host_waits": 2,
        "report_unordered_earlier_forward": 2})
    assert not ordering.decide_generate_orders_cross_forward([row("generate", earlier=1, waits=2), ok[1]], "m")[0]
    assert not ordering.decide_generate_orders_cross_forward([ok[0], row("report", same=3)], "m")[0]  # nothing to order
    assert not ordering.decide_generate_orders_cross_forward([row("generate", same=3, waits=0), ok[1]], "m")[0]  # no wait
    assert ordering.decide_generate_orders_cross_forward([row("generate", waits=1), row("report", earlier=1)], "m")[0]


def test_decisions_read_the_named_models_row_only():
    other_first = [row("report", "other", same=0), row("generate", "other", earlier=5, waits=0),
                   row("report", "m", same=2, earlier=1), row("generate", "m", same=2, waits=3)]
    assert ordering.decide_report_loop_reads_previous_forward(other_first, "m")[0] is True
    assert ordering.decide_generate_orders_cross_forward(other_first, "m")[0] is True
    cpu_first = [row("cpu", "m", same=4, earlier=3), row("report", "m"), row("generate", "m", waits=1)]
    assert ordering.decide_report_loop_reads_previous_forward(cpu_first, "m")[0] is False
    assert ordering.decide_generate_orders_cross_forward([row("cpu", "m", earlier=2), row("generate", "m", earlier=1, waits=1),
                                                          row("report", "m", earlier=1)], "m")[0] is False


def test_a_producer_in_a_later_forward_than_the_first():
    log = StreamLog()
    default, side = log.default_stream(), log.new_stream("prefetch")
    log.begin("prefill")
    log.begin("decode 1")
    _write(log, "offload copy (device->host)", 7, (7, 7), tracking.device_buffer(7), tracking.host_buffer(7), default)
    log.begin("decode 2")
    _write(log, PREFETCH, 7, (10, 2), tracking.host_buffer(7), tracking.device_buffer(7), side)
    _write(log, "layer update (compute)", 7, (11, 7), tracking.device_buffer(7), tracking.device_buffer(7), default)
    (read,) = ordering.prefetch_reads(LoopRecord("report", "m", log, GreedyRun([], []), 8, "none"))
    assert (read["forwards_back"], read["layers_since_producer"]) == (1, 3)
    with pytest.raises(LookupError, match=r"no dense model ran on this release: \['x'\]"):
        ordering.decide_not_specific_to_hybrid([], ["x"])
