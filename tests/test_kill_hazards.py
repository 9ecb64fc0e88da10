"""Kill tests for the second hazard's logic (make mutants: helpers/offload/hazards.py) on hand-made stream records:
each condition of released_blocks changed alone changes the row, and the counts and the decision follow."""
from __future__ import annotations

from typing import Any, Callable

from helpers.offload import hazards, tracking
from helpers.offload.loops import GreedyRun
from helpers.offload.ordering import PREFETCH, LoopRecord
from helpers.offload.streams import RecEvent, StreamLog

DEV, HOST = tracking.device_buffer(3), tracking.host_buffer(3)
Step = Callable[[StreamLog, Any, Any], None]


def record(before_read: Step | None = None, after_read: Step | None = None, *, prefetch_on: str = "side",
           reader: str = hazards.READER, next_on: str | None = "side") -> StreamLog:
    """Offload of layer 3, its prefetch (on `prefetch_on`), `before_read`, the default stream's read of the prefetched
    block, `after_read`, then the next prefetch-stream allocation (on `next_on`, or none)."""
    log = StreamLog()
    default, side = log.default_stream(), log.new_stream("prefetch")
    streams = {"side": side, "default": default}
    log.begin("prefill")
    log.access("offload copy (device->host)", 3, DEV, HOST, stream=default)
    log.access(PREFETCH, 3, HOST, DEV, stream=streams[prefetch_on])
    if before_read:
        before_read(log, default, side)
    log.access(reader, 3, DEV, DEV, stream=default)
    if after_read:
        after_read(log, default, side)
    if next_on:
        log.access(PREFETCH, 7, tracking.host_buffer(7), tracking.device_buffer(7), stream=streams[next_on])
    return log


def row(log: StreamLog) -> dict[str, Any]:
    (only,) = hazards.released_blocks(log)
    return only


def test_the_exposed_block_whole_row():
    assert row(record()) == {"call": "prefill", "layer": 3, "owning_stream": "stream 2", "reading_stream": "default",
                             "next_allocation_layer": 7, "next_allocation_call": "prefill",
                             "read_ordered_before_next_allocation": False, "record_stream": False,
                             "pending_read_at_reuse": True}


def test_record_stream_counts_only_between_the_allocation_and_the_read_for_that_layer_and_reader():
    rs = lambda layer=3, stream="default": (lambda log, d, s: log.record_stream(d if stream == "default" else s, layer, "x"))
    assert row(record(before_read=rs())) == row(record()) | {"record_stream": True, "pending_read_at_reuse": False}
    assert row(record(before_read=rs(layer=7)))["record_stream"] is False
    assert row(record(before_read=rs(stream="side")))["record_stream"] is False
    assert row(record(after_read=rs()))["record_stream"] is False  # after the read: too late to count
    early = StreamLog()
    d, s = early.default_stream(), early.new_stream("prefetch")
    early.record_stream(d, 3, "before the allocation")
    early.access(PREFETCH, 3, HOST, DEV, stream=s)
    early.access(hazards.READER, 3, DEV, DEV, stream=d)
    early.access(PREFETCH, 7, "h7", "d7", stream=s)
    assert row(early)["record_stream"] is False and row(early)["pending_read_at_reuse"] is True


def test_orderings_that_close_it_and_one_that_does_not():
    def event(log, default, side):
        ev = RecEvent(log)
        ev.record(default)
        ev.wait(side)

    for closes in (event, lambda log, d, s: s.wait_stream(d), lambda log, d, s: log.synchronize(None, "sync")):
        r = row(record(after_read=closes))
        assert r["read_ordered_before_next_allocation"] is True and r["pending_read_at_reuse"] is False
    wrong_way = row(record(after_read=lambda log, d, s: d.wait_stream(s)))
    assert wrong_way["read_ordered_before_next_allocation"] is False and wrong_way["pending_read_at_reuse"] is True


def test_no_next_allocation_and_the_next_one_on_another_stream():
    none = row(record(next_on=None))
    assert (none["next_allocation_layer"], none["next_allocation_call"]) == (None, None)
    assert none["read_ordered_before_next_allocation"] is None and none["pending_read_at_reuse"] is False
    other = record(next_on="default")  # a prefetch on another stream is not the owning stream's next allocation
    assert row(other)["next_allocation_layer"] is None
    both = record(after_read=lambda log, d, s: log.access(PREFETCH, 5, "h5", "d5", stream=d))
    assert row(both)["next_allocation_layer"] == 7


def test_blocks_that_are_not_exposed():
    assert hazards.released_blocks(record(prefetch_on="default")) == []  # allocated on the reading stream
    assert hazards.released_blocks(record(reader="offload copy (device->host)")) == []  # not the update's read
    plain = StreamLog()
    d = plain.default_stream()
    plain.access(hazards.READER, 3, DEV, DEV, stream=d)  # a read with no producer
    assert hazards.released_blocks(plain) == []
    computed = StreamLog()
    d, s = computed.default_stream(), computed.new_stream("prefetch")
    computed.access("layer update (compute)", 3, None, DEV, stream=s)  # produced by compute, not a prefetch
    computed.access(hazards.READER, 3, DEV, DEV, stream=d)
    assert hazards.released_blocks(computed) == []


def _loop_record(log: StreamLog) -> LoopRecord:
    return LoopRecord("report", "m", log, GreedyRun([], []), 8, "none")


def test_hazard_counts_whole_output_and_the_decision():
    log = record()
    counts = hazards.hazard_counts(_loop_record(log))
    assert counts == {"loop": "report", "model": "m", "edge": "none", "host_buffer_unordered": 1, "prefetch_reads": 1,
                      "released_with_pending_read": 1, "released_blocks": 1}
    holds, evidence = hazards.decide_released_with_pending_read(counts)
    assert holds is True and evidence == {"released_with_pending_read": 1, "released_blocks": 1}
    closed = hazards.hazard_counts(_loop_record(record(before_read=lambda l, d, s: s.wait_stream(d),
                                                       after_read=lambda l, d, s: s.wait_stream(d))))
    assert (closed["host_buffer_unordered"], closed["released_with_pending_read"], closed["released_blocks"]) == (1, 0, 1)
    assert hazards.decide_released_with_pending_read(closed) == (False, {"released_with_pending_read": 0, "released_blocks": 1})
