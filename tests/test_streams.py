"""The stream model: happens-before on hand-made event lists, the recording stand-ins, the ordering check and the
race replay on the tiny hybrid, and the decisions fed contradicting measurements."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from helpers.offload import replay as offload_replay
from helpers.offload import ordering, standins, streams


def _copy_then_read(log: streams.StreamLog, reader: streams.RecStream, before_read=None) -> dict:
    default = log.default_stream()
    log.access("offload copy (device->host)", 3, "layer 3 device K/V", "layer 3 host K/V", stream=default)
    if before_read:
        before_read()
    return log.access("prefetch copy (host->device)", 3, "layer 3 host K/V", "layer 3 device K/V", stream=reader)


def test_read_on_the_producing_stream_is_ordered():
    log = streams.StreamLog()
    read = _copy_then_read(log, log.default_stream())
    assert read["read_ordered"] is True and log.unordered_reads() == []


def test_read_on_another_stream_is_unordered():
    log = streams.StreamLog()
    read = _copy_then_read(log, log.new_stream("torch.Stream()"))
    assert read["read_ordered"] is False
    (row,) = log.unordered_reads()
    assert (row["reading_stream"], row["producing_stream"], row["layer"]) == ("stream 1", "default", 3)


def test_wait_stream_orders_the_read():
    log = streams.StreamLog()
    prefetch = log.new_stream("torch.Stream()")
    assert _copy_then_read(log, prefetch, lambda: prefetch.wait_stream(log.default_stream()))["read_ordered"] is True


def test_the_wrong_direction_of_wait_stream_does_not_order_the_read():
    log = streams.StreamLog()
    prefetch = log.new_stream("torch.Stream()")  # what releases up to 5.19 do: the default stream waits
    assert _copy_then_read(log, prefetch, lambda: log.default_stream().wait_stream(prefetch))["read_ordered"] is False


def test_events_host_waits_and_transitivity_order_reads():
    log = streams.StreamLog()
    a, b = log.new_stream("a"), log.new_stream("b")
    event = streams.RecEvent(log)
    read = _copy_then_read(log, b, lambda: (event.record(log.default_stream()), a.wait_event(event), b.wait_stream(a)))
    assert read["read_ordered"] is True
    log2 = streams.StreamLog()
    read2 = _copy_then_read(log2, log2.new_stream("x"), lambda: log2.synchronize(log2.default_stream()))
    assert read2["read_ordered"] is True
    # an event recorded before the copy does not order it
    log3 = streams.StreamLog()
    early = streams.RecEvent(log3)
    early.record(log3.default_stream())
    other = log3.new_stream("x")
    other.wait_event(early)
    assert _copy_then_read(log3, other)["read_ordered"] is False


def test_stand_ins_record_and_restore_even_after_an_error():
    originals = {q: getattr(*standins._resolve(q), None) for q in standins.STREAM_API}
    with pytest.raises(RuntimeError, match="boom"):
        with standins.recording_streams() as log:
            assert set(standins.stand_ins_active()) == set(standins.STREAM_API)
            side = torch.Stream()
            assert torch.cuda.default_stream(torch.device("cpu")) is torch.cuda.default_stream()
            with torch.cuda.stream(side):
                assert torch.cuda.current_stream() is side
            with side:
                assert torch.cuda.current_stream() is side
            assert torch.cuda.current_stream() is log.default_stream()
            torch.cuda.default_stream().wait_stream(side)
            torch.cuda._sleep(10)
            torch.cuda.synchronize()
            assert log.calls["torch.Stream"] == 1 and log.calls["torch.cuda._sleep"] == 1
            assert [e["op"] for e in log.events].count("wait_stream") == 1
            raise RuntimeError("boom")
    assert {q: getattr(*standins._resolve(q), None) for q in standins.STREAM_API} == originals
    assert standins.stand_ins_active() == []


# --- the installed offloading path under the model ------------------------------------------------------------

@pytest.fixture(scope="module")
def replay(tiny, ids) -> offload_replay.Replay:
    return offload_replay.race_replay(tiny.model, ids, 3, [0, 6, 12], torch.float32, fix_lag=12)


def test_installed_release_reads_prefetched_kv_unordered(tiny, ids):
    run = ordering.record_loop(tiny.model, ids, 3, "cpu")
    prefetches = [r for r in run.log.reads() if r["reader"].startswith("prefetch")]
    assert prefetches and all(r["producing_stream"] == "default" and r["reading_stream"] != "default" for r in prefetches)
    unordered = run.log.unordered_reads()
    # layer 3 is offloaded by update(3) and prefetched by update(7) of the same call: unordered in every call
    assert [(r["call"], r["layer"]) for r in unordered] == [("prefill", 3), ("decode 1", 3), ("decode 2", 3)]
    decision = offload_replay.ordering_decision(run.log)
    assert decision.holds and decision.deciding["unordered prefetch reads"] == 3
    # the compute reads of the prefetched K/V are ordered by default_stream.wait_stream(prefetch_stream)
    assert all(r["ordered"] for r in run.log.reads() if r["reader"].startswith("layer update"))


def test_the_520_edge_orders_every_read_and_the_decision_says_not_reproduced(tiny, ids):
    run = ordering.record_loop(tiny.model, ids, 3, "cpu", edge="5.20.0 edge")
    assert run.log.unordered_reads() == []
    decision = offload_replay.ordering_decision(run.log)
    assert not decision.holds and decision.evidence["prefetch_reads"] > 0
    assert standins.stand_ins_active() == []


def test_no_prefetch_reads_is_not_a_reproduction():
    assert not offload_replay.ordering_decision(streams.StreamLog()).holds


def test_replay_stale_reads_drift_from_the_first_decode_step(replay):
    table = replay.table()
    lag12 = table[table.variant == "lag 12"]
    assert int(lag12.stale_reads.iloc[0]) == int(lag12.unordered_reads.iloc[0]) == 3
    assert lag12.bitwise_equal.tolist() == [True, False, False]
    assert lag12.differs.tolist() == [False, True, True]
    for clean in ("lag 0", "lag 12 + 5.20.0 edge"):
        assert table[table.variant == clean].bitwise_equal.all(), clean
    stale = next(r for r in replay.runs if r.lag == 12).stale()
    assert [(r["call"], r["layer"]) for r in stale] == [("prefill", 3), ("decode 1", 3), ("decode 2", 3)]
    decision = offload_replay.replay_decision(table)
    assert decision.holds, decision.why
    assert decision.deciding["prefill max |logit diff|"] == 0.0 and decision.deciding["decode 1 max |logit diff|"] > 0


def test_replay_at_a_lag_that_spares_the_prefill_read_drifts_one_step_later(replay):
    table = replay.table()
    lag6 = table[table.variant == "lag 6"]
    assert 0 < int(lag6.stale_reads.iloc[0]) < int(lag6.unordered_reads.iloc[0])
    assert lag6.bitwise_equal.tolist()[:2] == [True, True]
    assert "lag 6" in offload_replay.replay_decision(table).evidence["some_unordered_reads_stale"]


def _table(rows: list[tuple[str, int, int, int, float, bool]]) -> pd.DataFrame:
    cols = ["variant", "stale_reads", "unordered_reads", "step", "max_abs_diff", "differs"]
    df = pd.DataFrame(rows, columns=cols)
    df["bitwise_equal"] = df.max_abs_diff == 0
    df["lag"] = df.variant.str.extract(r"lag (\d+)")[0].astype(int)
    return df


def test_replay_decision_rejects_contradicting_measurements():
    good = [("lag 0", 0, 2, 0, 0.0, False), ("lag 0", 0, 2, 1, 0.0, False),
            ("lag 9", 2, 2, 0, 0.0, False), ("lag 9", 2, 2, 1, 0.5, True)]
    decision = offload_replay.replay_decision(_table(good))
    assert decision.holds and decision.deciding["smallest lag with every unordered read stale"] == 9
    late = good[:2] + [("lag 9", 2, 2, 0, 0.0, False), ("lag 9", 2, 2, 1, 0.0, False), ("lag 9", 2, 2, 2, 0.3, True)]
    assert not offload_replay.replay_decision(_table(late)).holds  # drift starts one step late
    prefill = good[:2] + [("lag 9", 2, 2, 0, 0.1, True), ("lag 9", 2, 2, 1, 0.5, True)]
    assert not offload_replay.replay_decision(_table(prefill)).holds  # the prefill differs
    dirty = [("lag 0", 0, 2, 0, 0.0, False), ("lag 0", 0, 2, 1, 1e-7, False)] + good[2:]
    assert not offload_replay.replay_decision(_table(dirty)).holds  # no stale read, yet not bitwise equal
    nothing_stale = good[:2]
    assert not offload_replay.replay_decision(_table(nothing_stale)).holds


def test_record_stream_is_noted_with_its_layer_and_block_and_orders_nothing():
    log = streams.StreamLog()
    side = log.new_stream("torch.Stream()")
    before = {k: dict(v) for k, v in log.clocks.items()}
    log.record_stream(side, 3, "layer 3 prefetched K/V")
    note = log.events[-1]
    assert (note["op"], note["stream"], note["layer"], note["detail"]) == ("record_stream", side.name, 3, "layer 3 prefetched K/V")
    assert log.clocks == before


def test_an_event_is_recorded_when_its_stream_is_done_and_a_wait_keeps_the_later_time():
    log = streams.StreamLog()
    busy, other = log.new_stream("busy"), log.new_stream("other")
    log.enqueue(busy, "long copy", duration_ms=50.0)
    event = busy.record_event()
    assert event.t == log.ready[busy.name] >= 50.0 > log.host_t  # the stream's modelled end, not the host's time
    waiter = log.new_stream("waiter")
    log.enqueue(waiter, "longer copy", duration_ms=500.0)
    end = log.ready[waiter.name]
    early = other.record_event()
    waiter.wait_event(early)
    assert log.ready[waiter.name] == end > early.t  # waiting on an earlier event does not move the stream back
    fresh = log.new_stream("fresh")
    fresh.wait_event(streams.RecEvent(log))  # an event never recorded: time 0, nothing to wait for
    assert log.ready[fresh.name] == 0.0


def test_a_torch_stream_waiting_on_a_cuda_event_is_noted_as_ignored_and_orders_nothing():
    log = streams.StreamLog()
    side = log.new_stream("torch.Stream()", api=streams.TORCH_STREAM)
    event = streams.RecEvent(log, api=streams.CUDA_EVENT)
    event.record(log.default_stream())
    before = dict(log.clocks[side.name])
    side.wait_event(event)
    note = log.events[-1]
    assert (note["op"], note["stream"]) == ("wait_event ignored", side.name)
    assert note["detail"] == (f"torch.Stream.wait_event(torch.cuda.Event {event.ident}): waits on the event's "
                              "unrecorded c10::Event")
    assert log.clocks[side.name] == before


def test_the_modelled_timeline_of_enqueues_waits_and_synchronizes():
    """The stand-ins' device timeline (what query() and the lag read): each enqueue costs the host STAND_IN_HOST_MS and
    starts when its stream is free; waits and host synchronizes take the later of the two times, 0 where nothing ran."""
    ms = streams.STAND_IN_HOST_MS
    log = streams.StreamLog()
    log.host_wait({}, "nothing")
    log.synchronize()
    assert log.host_t == 0.0  # nothing enqueued: no time passes
    a, b, idle = (log.new_stream("torch.Stream()", name) for name in ("a", "b", "idle"))
    log.synchronize(idle)
    assert log.host_t == 0.0
    first = log.enqueue(a, "copy", duration_ms=50.0)
    assert (first["t_start"], first["t_end"], log.ready["a"], log.host_t) == (ms, ms + 50.0, ms + 50.0, ms)
    second = log.enqueue(a, "read")  # queued behind the copy; no duration given: it takes none
    assert second["t_start"] == second["t_end"] == ms + 50.0 and log.host_t == 2 * ms
    log.wait_stream(idle, b)
    assert log.ready["idle"] == 0.0  # two streams that ran nothing
    log.wait_stream(b, a)
    assert log.ready["b"] == ms + 50.0  # the waited stream's end
    log.enqueue(b, "long", duration_ms=200.0)
    log.wait_stream(b, a)
    assert log.ready["b"] == ms + 250.0  # its own later end is kept (the long op queued behind the wait)
    log.synchronize(a)
    assert log.host_t == ms + 50.0
    log.synchronize()
    assert log.host_t == ms + 250.0
