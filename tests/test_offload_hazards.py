"""The second hazard on hand-made stream records, and the fix edges on the tiny hybrid's record."""
from __future__ import annotations

from helpers.offload import hazards, tracking
from helpers.offload.ordering import PREFETCH
from helpers.offload.streams import StreamLog

DEV, HOST = tracking.device_buffer(0), tracking.host_buffer(0)


def _log(between: str | None = None) -> StreamLog:
    """Prefetch of layer 0 on a side stream, its read by the default stream, then a second prefetch."""
    log = StreamLog()
    default, side = log.default_stream(), log.new_stream("prefetch")
    log.access("offload copy (device->host)", 0, None, HOST, stream=default)
    log.access(PREFETCH, 0, HOST, DEV, stream=side)
    if between == "record_stream":
        log._note("record_stream", "default", layer=0)
    log.wait_stream(default, side)
    log.access(hazards.READER, 0, DEV, DEV, stream=default)
    if between == "event":
        from helpers.offload.streams import RecEvent
        ev = RecEvent(log)
        ev.record(default)
        ev.wait(side)
    elif between == "synchronize":
        log.synchronize(None, "torch.cuda.synchronize()")
    log.access(PREFETCH, 1, tracking.host_buffer(1), tracking.device_buffer(1), stream=side)
    return log


def test_released_block_with_pending_cross_stream_read() -> None:
    [row] = hazards.released_blocks(_log())
    assert row["pending_read_at_reuse"] and not row["record_stream"]
    assert row["owning_stream"] != row["reading_stream"]


def test_record_stream_closes_the_reuse_hazard() -> None:
    [row] = hazards.released_blocks(_log("record_stream"))
    assert row["record_stream"] and not row["pending_read_at_reuse"]


def test_an_event_after_the_read_closes_it() -> None:
    [row] = hazards.released_blocks(_log("event"))
    assert row["read_ordered_before_next_allocation"] and not row["pending_read_at_reuse"]


def test_a_device_wide_synchronize_orders_the_read_on_another_stream() -> None:
    [row] = hazards.released_blocks(_log("synchronize"))
    assert row["read_ordered_before_next_allocation"] and not row["pending_read_at_reuse"]


def test_decision_holding_and_contradicting() -> None:
    assert hazards.decide_released_with_pending_read({"released_with_pending_read": 3, "released_blocks": 4})[0]
    assert not hazards.decide_released_with_pending_read({"released_with_pending_read": 0, "released_blocks": 4})[0]


def test_edges_on_the_tiny_hybrid(tiny, ids) -> None:
    table = hazards.edge_table(tiny.model, ids, 3, "tiny hybrid", tuple(tracking.EDGES)).set_index("edge")
    assert table.loc["none", "released_with_pending_read"] > 0
    assert table.loc["5.20.0 edge", ["closes_host_buffer", "closes_reuse"]].all()
    assert table.loc["record_stream", "closes_reuse"] and not table.loc["record_stream", "closes_host_buffer"]
    assert table.loc["offload event", "closes_host_buffer"]
