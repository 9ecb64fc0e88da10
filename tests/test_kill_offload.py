"""Kill tests for the offload decisions (make mutants: helpers/offload/streams.py, replay.py, gpu.py), on hand-made
logs and tables: no model runs. CASES feeds tests/test_decisions.py's registry."""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd
import pytest

from helpers.offload import gpu, replay
from helpers.offload import gpu_decide as gd
from helpers.offload.states import ATTENTION_KV, first_difference
from helpers.offload.streams import StreamLog, join


# --- the stream model ------------------------------------------------------------------------------

def copy_then_read(order: Callable[[StreamLog, Any, Any], None] | None = None, *, reader: str = "prefetch copy",
                   calls_between: int = 0) -> StreamLog:
    """A copy on `offload` writes host buffer h; `order` (if any) runs; a read of h is enqueued on `prefetch`."""
    log = StreamLog()
    offload, prefetch = log.new_stream("test"), log.new_stream("test")
    log.access("offload copy", 0, "kv0", "h", stream=offload)
    for _ in range(calls_between):
        log.update_index += 1
    if order:
        order(log, offload, prefetch)
    log.access(reader, 0, "h", "kv0", stream=prefetch)
    return log


def test_join_takes_the_larger_tick_of_every_stream():
    assert join({"a": 1, "b": 5}, {"b": 2, "c": 3}) == {"a": 1, "b": 5, "c": 3}
    assert join({}, {}) == {} and join({"a": 0}, {}) == {"a": 0}


def test_an_unordered_read_and_each_way_of_ordering_it():
    assert copy_then_read().unordered_reads()[0]["ordered"] is False
    ways = {
        "wait_stream": lambda log, off, pre: pre.wait_stream(off),
        "event": lambda log, off, pre: pre.wait_event(off.record_event()),
        "device-wide synchronize": lambda log, off, pre: log.synchronize(None, "torch.cuda.synchronize()"),
        "the copy stream's synchronize": lambda log, off, pre: off.synchronize(),
    }
    for name, order in ways.items():
        log = copy_then_read(order)
        assert [r["ordered"] for r in log.reads()] == [True], name
        assert log.unordered_reads() == [], name


def test_what_does_not_order_the_read():
    other = copy_then_read(lambda log, off, pre: log.synchronize(pre, "the reader's own stream"))
    assert other.reads()[0]["ordered"] is False, "synchronizing the reading stream does not order another stream's copy"
    backwards = copy_then_read(lambda log, off, pre: off.wait_stream(pre))
    assert backwards.reads()[0]["ordered"] is False, "the copy stream waiting for the reader orders nothing"
    early = StreamLog()
    off, pre = early.new_stream("t"), early.new_stream("t")
    ev = off.record_event()  # recorded before the copy
    early.access("offload copy", 0, "kv0", "h", stream=off)
    pre.wait_event(ev)
    early.access("prefetch copy", 0, "h", "kv0", stream=pre)
    assert early.reads()[0]["ordered"] is False


def test_device_wide_synchronize_joins_every_stream_and_is_logged():
    log = StreamLog()
    a, b, c = (log.new_stream("t") for _ in range(3))
    log.enqueue(a, "x")
    log.enqueue(b, "y")
    log.enqueue(b, "y")
    log.synchronize(None, "why")
    assert log.host == {"stream 1": 1, "stream 2": 2}
    assert log.events[-1]["op"] == "host_wait" and log.events[-1]["stream"] == "all streams" and log.events[-1]["detail"] == "why"
    later = log.new_stream("t")
    assert log.clocks[later.name] == {"stream 1": 1, "stream 2": 2}, "a new stream starts after the host"
    e = log.enqueue(c, "z")
    assert e["clock"] == {"stream 1": 1, "stream 2": 2, "stream 3": 1}
    log.synchronize(a)
    assert log.events[-1]["stream"] == "stream 1" and log.events[-1]["detail"] == "synchronize"


def test_clocks_ticks_and_the_happens_before_edge():
    log = StreamLog()
    s = log.new_stream("how")
    assert s.name == "stream 1" and log.events[0] == {"seq": 0, "call": "(none)", "call_index": -1, "update_index": -1, "update_layer": -1,
                                                      "op": "create", "stream": "stream 1", "detail": "how"}
    first, second = log.enqueue(s, "a"), log.enqueue(s, "b", layer=3)
    assert first["clock"] == {"stream 1": 1} and second["clock"] == {"stream 1": 2} and second["layer"] == 3
    assert StreamLog.ordered(first, second) and StreamLog.ordered(first, first) and not StreamLog.ordered(second, first)
    assert not StreamLog.ordered({"clock": {"x": 1}, "stream": "x"}, {"clock": {}, "stream": "y"})
    assert log.default_stream() is log.default_stream() and log.default.name == "default"
    assert log.current() is log.default
    with s:
        assert log.current() is s
    assert log.current() is log.default


def test_begin_synchronizes_the_default_stream_only_after_the_first_call():
    log = StreamLog()
    log.begin("prefill", host_synced=True)
    assert (log.call, log.call_index) == ("prefill", 0) and not any(e["op"] == "host_wait" for e in log.events)
    log.enqueue(log.default_stream(), "logits")
    log.begin("decode 1", host_synced=True)
    assert (log.call, log.call_index) == ("decode 1", 1) and log.host == {"default": 1}
    assert log.events[-1]["op"] == "host_wait" and log.events[-1]["stream"] == "default"
    log.begin("decode 2")
    assert log.call_index == 2 and log.events[-1]["op"] == "host_wait"


def test_the_reads_table():
    log = copy_then_read(calls_between=2)
    log.access("update", 0, None, None)  # reads nothing: not a read
    log.access("layer", 0, "never written", None)  # no producer: not judged
    assert log.events[-1]["read_ordered"] is None and log.events[-1]["producer_seq"] is None
    assert log.events[-1]["calls_since_producer"] is None
    [row] = log.reads()
    assert row == {"call": "(none)", "call_index": -1, "update_index": 1, "layer": 0, "reader": "prefetch copy",
                   "reads": "h", "reading_stream": "stream 2", "producer": "offload copy", "producing_stream": "stream 1",
                   "producer_call": "(none)", "calls_since_producer": 2, "ordered": False, "served_stale": False,
                   "producer_call_index": -1, "producer_update_layer": -1, "update_layer": -1}
    assert log.writers["kv0"]["op"] == "prefetch copy"
    next(e for e in log.events if e["op"] == "prefetch copy")["served_stale"] = True
    assert log.reads()[0]["served_stale"] is True


def test_ordering_decision_numbers():
    log = copy_then_read(calls_between=3)
    d = replay.ordering_decision(log)
    assert d.evidence["prefetch_reads"] == 1 and d.evidence["unordered_prefetch_reads"] == 1
    assert d.evidence["unordered"] == [{"call": "(none)", "layer": 0, "reading_stream": "stream 2",
                                        "producing_stream": "stream 1", "producer_call": "(none)", "calls_since_producer": 3}]
    assert d.deciding == {"unordered prefetch reads": 1, "prefetch reads": 1} and "1 of 1 prefetch reads" in d.why
    ok = replay.ordering_decision(copy_then_read(lambda log, off, pre: pre.wait_stream(off)))
    assert ok.evidence["wait_stream_calls"] == {"waits for stream 1": 1} and ok.why.startswith("all 1 prefetch reads")


# --- the replay table ---------------------------------------------------------------------------------

def variant(name: str, lag: int, stale: int, unordered: int, diffs: list[float], differs: list[bool] | None = None,
            bitwise: list[bool] | None = None) -> list[dict[str, Any]]:
    differs = differs if differs is not None else [d > 0.01 for d in diffs]
    bitwise = bitwise if bitwise is not None else [d == 0.0 for d in diffs]
    return [{"variant": name, "lag": lag, "step": i, "stale_reads": stale, "unordered_reads": unordered,
             "max_abs_diff": d, "differs": f, "bitwise_equal": b} for i, (d, f, b) in enumerate(zip(diffs, differs, bitwise))]


def table(*variants: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([row for v in variants for row in v])


CLEAN = variant("lag 0", 0, 0, 4, [0.0, 0.0, 0.0])
DRIFT = variant("lag 2", 2, 4, 4, [0.0, 2.1, 1.5])


def test_replay_names_the_smallest_full_lag_whatever_the_row_order():
    listed_late = replay.replay_decision(table(variant("lag 3", 3, 4, 4, [0.0, 1.0, 1.0]), CLEAN, DRIFT))
    assert listed_late.deciding["smallest lag with every unordered read stale"] == 2
    assert listed_late.deciding["decode 1 max |logit diff|"] == 2.1 and listed_late.why.startswith("lag 2 ")


def test_replay_decision_numbers():
    d = replay.replay_decision(table(CLEAN, variant("lag 1", 1, 2, 4, [0.0, 0.5, 0.0]), DRIFT))
    assert d.holds and list(d.evidence["every_unordered_read_stale"]) == ["lag 2"]
    assert list(d.evidence["some_unordered_reads_stale"]) == ["lag 1"] and list(d.evidence["no_stale_read"]) == ["lag 0"]
    s = d.evidence["every_unordered_read_stale"]["lag 2"]
    assert s == {"stale_reads": 4, "unordered_reads": 4, "prefill_bitwise_equal": True, "decode_differs_every_step": True,
                 "first_step_beyond_floor": 1, "max_abs_diff": [0.0, 2.1, 1.5]}
    assert d.deciding == {"smallest lag with every unordered read stale": 2, "prefill max |logit diff|": 0.0,
                          "decode 1 max |logit diff|": 2.1}
    assert d.evidence["without_stale_reads_bitwise_equal"] is True and "lag 2 (all 4 unordered reads stale)" in d.why
    late = replay.replay_decision(table(CLEAN, variant("lag 2", 2, 4, 4, [0.0, 0.0, 1.5])))
    assert late.evidence["every_unordered_read_stale"]["lag 2"]["first_step_beyond_floor"] == 2
    none = replay.replay_decision(table(CLEAN))
    assert none.deciding["smallest lag with every unordered read stale"] is None and none.why.startswith("no lag served")
    one_step = replay.replay_decision(table(CLEAN, variant("lag 2", 2, 4, 4, [0.0])))
    assert one_step.deciding["decode 1 max |logit diff|"] is None


# --- the GPU experiment's tables --------------------------------------------------------------------------

OFF = "offloading=True"
EDGE = "offloading=True + 5.20.0 edge"
KEY = ("report", "tiny hybrid", "bfloat16")
TAGS = dict(zip(("loop", "model", "dtype"), KEY))


def steps(off: list[float], edge: list[float] | None = None, threshold: float = 0.01) -> pd.DataFrame:
    rows = []
    for name, diffs in ((OFF, off), (EDGE, edge if edge is not None else [0.0] * len(off))):
        rows += [{**TAGS, "variant": name, "step": i, "max_abs_diff": d, "noise_threshold": threshold, "bitwise_equal": d == 0.0,
                  "matches": d <= threshold, "differs": d > threshold, "argmax_match": True} for i, d in enumerate(diffs)]
    return pd.DataFrame(rows)


def steps3(off: list[float], fixes: dict[str, list[float]], threshold: float = 0.01) -> pd.DataFrame:
    """steps() plus one arm per fix edge name."""
    frame = steps(off, threshold=threshold)
    extra = [{**TAGS, "variant": f"{OFF} + {edge}", "step": i, "max_abs_diff": d, "noise_threshold": threshold,
              "bitwise_equal": d == 0.0, "matches": d <= threshold, "differs": d > threshold, "argmax_match": True}
             for edge, diffs in fixes.items() for i, d in enumerate(diffs)]
    return pd.concat([frame, pd.DataFrame(extra)], ignore_index=True)


def state(name: str, step: int, layer: int, kind: str, differs: bool = True, order: int | None = None) -> dict[str, Any]:
    return {**TAGS, "variant": name, "call": f"decode {step}", "step": step, "tensor": f"layers[{layer}]", "layer": layer,
            "kind": kind, "write_order": layer if order is None else order, "max_abs_diff": 0.5 if differs else 0.0, "noise_threshold": 0.01, "differs": differs}


KV, LINEAR = ATTENTION_KV, "linear-attention state"


def states(*rows: dict[str, Any]) -> pd.DataFrame:
    base = [state(OFF, 0, 0, KV, differs=False), state(EDGE, 0, 0, KV, differs=False)]
    return pd.DataFrame(base + list(rows))


def lead(variant: str, ms: float | None, cross: bool = False, pending: bool = False, busy: bool = True,
         loop: str = "report") -> dict[str, Any]:
    """One prefetch row of the timing table: its producing copy ends `ms` after the prefetch starts."""
    return {**TAGS, "loop": loop, "variant": variant, "lead_ms": ms, "cross_forward": cross,
            "overwrote_pending_read": pending, "default_busy_at_enqueue": busy}


def timing(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


RS, UNL = "offloading=True + record_stream", "offloading=True (unlagged)"


def unlagged_steps(diffs: list[float], threshold: float = 0.01) -> pd.DataFrame:
    """steps() plus an unlagged arm with `diffs`."""
    extra = [{**TAGS, "variant": UNL, "step": i, "max_abs_diff": d, "noise_threshold": threshold, "bitwise_equal": d == 0.0,
              "matches": d <= threshold, "differs": d > threshold, "argmax_match": True} for i, d in enumerate(diffs)]
    return pd.concat([steps([0.0, 2.1]), pd.DataFrame(extra)], ignore_index=True)


def test_race_counts_split_same_and_earlier_forward_and_respect_the_resolution():
    counts = gd.race_counts(timing(lead(OFF, 0.5), lead(OFF, 2.0, cross=True, pending=True), lead(OFF, gd.RESOLUTION_MS),
                                   lead(OFF, None, busy=False), lead(EDGE, -0.2)))
    off = counts[counts.variant == OFF].iloc[0]
    assert (off.prefetches, off.started_before_producer_done, off.same_forward, off.earlier_forward) == (4, 2, 1, 1)
    assert (off.max_lead_ms, off.overwrote_pending_read, off.default_busy_at_enqueue) == (2.0, 1, 3)
    edge = counts[counts.variant == EDGE].iloc[0]
    assert (edge.started_before_producer_done, edge.max_lead_ms) == (0, -0.2)
    assert gd.race_counts(timing(lead(OFF, None))).max_lead_ms.iloc[0] is None


def test_race_observed_numbers():
    d = gd.decide_race_observed(gd.race_counts(timing(lead(OFF, 0.5), lead(OFF, -1.0), lead(EDGE, -0.1))))
    assert d.deciding == {"prefetches started before their copy ended": 1, "same, with the 5.20.0 edge": 0}
    assert d.evidence["per_arm"] == {"report/tiny hybrid/bfloat16": 1} and "1 of 2 prefetch copies" in d.why


def test_first_difference_is_the_earliest_step_then_the_lowest_layer():
    s = states(state(OFF, 2, 0, LINEAR), state(OFF, 1, 3, KV), state(OFF, 1, 2, LINEAR))
    first = first_difference(s[s.variant == OFF])
    assert (first["call"], first["layer"], first["kind"]) == ("decode 1", 2, LINEAR)
    assert set(first) == {"variant", "call", "tensor", "layer", "kind", "write_order", "max_abs_diff", "noise_threshold"}
    assert first_difference(states()) is None


def test_first_difference_follows_host_write_order_not_layer_index():
    # layer 3's snapshot is written by the wrap prefetch in update(7): after layer 7's own update
    s = states(state(OFF, 0, 3, KV, order=20), state(OFF, 0, 7, KV, order=15))
    first = first_difference(s[s.variant == OFF])
    assert (first["layer"], first["write_order"]) == (7, 15)
    tie = states(state(OFF, 0, 5, KV, order=9), state(OFF, 0, 4, KV, order=9))
    assert first_difference(tie[tie.variant == OFF])["layer"] == 4


def test_gpu_decision_numbers():
    d = gd.decide_prefill_identical(steps([0.0, 2.1]), KEY)
    assert d.deciding == {"prefill max |logit diff|": 0.0, "noise threshold": 0.01} and d.evidence["bitwise_equal"] is True
    d = gd.decide_decode_drifts(steps([0.0, 2.1, 1.0]), KEY)
    assert d.deciding == {"decode 1 max |logit diff|": 2.1, "noise threshold": 0.01}
    assert d.evidence["max_abs_diff"] == [2.1, 1.0] and d.evidence["argmax_match"] == [True, True]
    assert gd.decide_decode_drifts(steps([0.0]), KEY).deciding == {"decode 1 max |logit diff|": None, "noise threshold": None}
    d = gd.decide_first_tensor(states(state(OFF, 1, 0, KV)), KEY)
    assert d.deciding == {"first differing tensor": "layers[0] after decode 1"} and d.evidence["first_differing_tensor"]["kind"] == KV
    d = gd.decide_fix_removes_drift(steps([0.0, 2.1], [0.0, 0.001]), states(), KEY, "5.20.0 edge")
    assert d.deciding == {"drift without the edge": True, "max |logit diff| with 5.20.0 edge": 0.001}
    assert d.evidence["fixed_first_differing_tensor"] is None and d.evidence["fixed_max_abs_diff"] == [0.0, 0.001]
    assert gd.decide_fix_removes_drift(steps([0.0, 0.0]), states(), KEY, "5.20.0 edge").why == "no drift without the edge: nothing to remove"


def test_simulated_experiment_says_so_in_every_reason():
    counts = gd.race_counts(timing(lead(OFF, 0.5), lead(EDGE, -0.1)))
    ex = gpu.GpuExperiment(steps([0.0, 2.1]), states(state(OFF, 1, 0, KV)), counts, [], [],
                           {"simulated_on_cpu": True, "dtypes": ["bfloat16"], "models": ["tiny hybrid"]})
    out = gpu.decisions(ex)
    assert list(out) == list(gpu.CUDA_CLAIMS) and all(d.why.startswith("[simulated on CPU") for d in out.values())
    ex.settings = {"dtypes": ["bfloat16"], "models": ["tiny hybrid"]}
    assert not any(d.why.startswith("[simulated") for d in gpu.decisions(ex).values())


# --- (case, thunk, expected holds) for tests/test_decisions.py's registry -----------------------------

Case = tuple[str, Callable[[], Any], bool]
CASES: list[Case] = [
    ("ordering: an unordered prefetch read", lambda: replay.ordering_decision(copy_then_read()), True),
    ("ordering: ordered by wait_stream", lambda: replay.ordering_decision(copy_then_read(lambda l, o, p: p.wait_stream(o))), False),
    ("ordering: ordered by a device-wide synchronize", lambda: replay.ordering_decision(
        copy_then_read(lambda l, o, p: l.synchronize(None, "torch.cuda.synchronize()"))), False),
    ("ordering: the unordered read is not a prefetch", lambda: replay.ordering_decision(copy_then_read(reader="layer update")), False),
    ("ordering: no read at all", lambda: replay.ordering_decision(StreamLog()), False),
    ("replay: drift with its clean control", lambda: replay.replay_decision(table(CLEAN, DRIFT)), True),
    ("replay: without its clean control", lambda: replay.replay_decision(table(DRIFT)), False),
    ("replay: the clean control is not bitwise equal", lambda: replay.replay_decision(
        table(variant("lag 0", 0, 0, 4, [0.0, 0.0, 0.0], bitwise=[True, True, False]), DRIFT)), False),
    ("replay: drift starts after the first decode step", lambda: replay.replay_decision(
        table(CLEAN, variant("lag 2", 2, 4, 4, [0.0, 0.0, 1.5]))), False),
    ("replay: the prefill differs", lambda: replay.replay_decision(
        table(CLEAN, variant("lag 2", 2, 4, 4, [0.5, 2.1, 1.5], bitwise=[False, False, False]))), False),
    ("replay: no decode step", lambda: replay.replay_decision(table(CLEAN, variant("lag 2", 2, 4, 4, [0.0]))), False),
    ("replay: only some unordered reads stale", lambda: replay.replay_decision(
        table(CLEAN, variant("lag 1", 1, 2, 4, [0.0, 2.1, 1.5]))), False),
    ("replay: a second fully stale lag without drift", lambda: replay.replay_decision(
        table(CLEAN, DRIFT, variant("lag 3", 3, 4, 4, [0.0, 0.0, 0.0]))), False),
    ("replay: one unordered read, served stale", lambda: replay.replay_decision(
        table(CLEAN, variant("lag 1", 1, 1, 1, [0.0, 2.1]))), True),
    ("replay: one of four reads stale beside a full lag", lambda: replay.replay_decision(
        table(CLEAN, variant("lag 1", 1, 1, 4, [0.0, 0.0, 0.0]), DRIFT)), True),
    ("replay: the smallest full lag is named whatever the row order (lag 3 listed first)", lambda: replay.replay_decision(
        table(variant("lag 3", 3, 4, 4, [0.0, 1.0, 1.0]), CLEAN, DRIFT)), True),
    ("decode: one decode step, drifting", lambda: gd.decide_decode_drifts(steps([0.0, 2.1]), KEY), True),
    ("prefill: within the floor", lambda: gd.decide_prefill_identical(steps([0.01, 2.1]), KEY), True),
    ("prefill: past the floor", lambda: gd.decide_prefill_identical(steps([0.0101, 2.1]), KEY), False),
    ("decode: first decode step drifts", lambda: gd.decide_decode_drifts(steps([0.0, 2.1, 0.0]), KEY), True),
    ("decode: drift starts at the second decode step", lambda: gd.decide_decode_drifts(steps([0.0, 0.0, 2.1]), KEY), False),
    ("decode: at the threshold (edge)", lambda: gd.decide_decode_drifts(steps([0.0, 0.01]), KEY), False),
    ("decode: no decode step", lambda: gd.decide_decode_drifts(steps([0.0]), KEY), False),
    ("first tensor: attention K/V first", lambda: gd.decide_first_tensor(
        states(state(OFF, 1, 1, KV), state(OFF, 1, 2, LINEAR), state(OFF, 2, 0, LINEAR)), KEY), True),
    ("first tensor: a lower layer's linear state first", lambda: gd.decide_first_tensor(
        states(state(OFF, 1, 1, KV), state(OFF, 1, 0, LINEAR)), KEY), False),
    ("first tensor: an earlier step's linear state first", lambda: gd.decide_first_tensor(
        states(state(OFF, 2, 0, KV), state(OFF, 1, 3, LINEAR)), KEY), False),
    ("first tensor: nothing differs", lambda: gd.decide_first_tensor(states(), KEY), False),
    ("first tensor: only the edge arm differs", lambda: gd.decide_first_tensor(states(state(EDGE, 1, 0, KV)), KEY), False),
    ("edge: drift removed", lambda: gd.decide_fix_removes_drift(steps([0.0, 2.1]), states(), KEY, "5.20.0 edge"), True),
    ("edge: drift in the states only, removed", lambda: gd.decide_fix_removes_drift(
        steps([0.0, 0.0]), states(state(OFF, 1, 0, KV)), KEY, "5.20.0 edge"), True),
    ("edge: no drift to remove", lambda: gd.decide_fix_removes_drift(steps([0.0, 0.0]), states(), KEY, "5.20.0 edge"), False),
    ("edge: the edge arm's logits still differ", lambda: gd.decide_fix_removes_drift(steps([0.0, 2.1], [0.0, 0.02]), states(), KEY, "5.20.0 edge"), False),
    ("edge: the edge arm's state still differs", lambda: gd.decide_fix_removes_drift(
        steps([0.0, 2.1]), states(state(EDGE, 1, 0, KV)), KEY, "5.20.0 edge"), False),    ("race: a prefetch started before its copy ended, none with the edge", lambda: gd.decide_race_observed(
        gd.race_counts(timing(lead(OFF, 0.5), lead(EDGE, -0.1)))), True),
    ("race: every prefetch started after its copy ended", lambda: gd.decide_race_observed(
        gd.race_counts(timing(lead(OFF, -0.5), lead(EDGE, -0.1)))), False),
    ("race: a lead within the event resolution", lambda: gd.decide_race_observed(
        gd.race_counts(timing(lead(OFF, gd.RESOLUTION_MS), lead(EDGE, -0.1)))), False),
    ("race: the edge arm also starts early (timing not trustworthy)", lambda: gd.decide_race_observed(
        gd.race_counts(timing(lead(OFF, 0.5), lead(EDGE, 0.5)))), False),
    ("race: no edge arm to check the timing against", lambda: gd.decide_race_observed(
        gd.race_counts(timing(lead(OFF, 0.5)))), False),
    ("race: only a fix arm starts early", lambda: gd.decide_race_observed(gd.race_counts(timing(
        lead(OFF, -0.5), lead(EDGE, -0.1), lead("offloading=True + record_stream", 0.5)))), False),
    ("narrow fix: the offload event removes the drift", lambda: gd.decide_fix_removes_drift(
        steps3([0.0, 2.1], {"offload event": [0.0, 0.0]}), states(), KEY, "offload event"), True),
    ("narrow fix: record_stream leaves the drift", lambda: gd.decide_fix_removes_drift(
        steps3([0.0, 2.1], {"record_stream": [0.0, 1.9]}), states(), KEY, "record_stream"), False),
    ("narrow fix: the arm did not run", lambda: gd.decide_fix_removes_drift(steps([0.0, 2.1]), states(), KEY, "record_stream"), False),
    ("overwritten: a prefetch overwrote a block under a pending read, none with record_stream", lambda: gd.decide_overwrote_pending_read(
        gd.race_counts(timing(lead(OFF, 0.5, pending=True), lead(RS, -0.1)))), True),
    ("overwritten: no block overwritten", lambda: gd.decide_overwrote_pending_read(
        gd.race_counts(timing(lead(OFF, 0.5), lead(RS, -0.1)))), False),
    ("overwritten: record_stream overwrites too", lambda: gd.decide_overwrote_pending_read(
        gd.race_counts(timing(lead(OFF, 0.5, pending=True), lead(RS, -0.1, pending=True)))), False),
    ("overwritten: no record_stream arm ran", lambda: gd.decide_overwrote_pending_read(
        gd.race_counts(timing(lead(OFF, 0.5, pending=True)))), False),
    ("unlagged: the unlagged arm's logits drift", lambda: gd.decide_unlagged_drift(
        unlagged_steps([0.0, 2.1]), states()), True),
    ("unlagged: only the unlagged end state differs", lambda: gd.decide_unlagged_drift(
        unlagged_steps([0.0, 0.0]), states(state(UNL, 3, 0, KV))), False),
    ("unlagged: within the floor", lambda: gd.decide_unlagged_drift(unlagged_steps([0.0, 0.01]), states()), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_offload_decisions(name, thunk, expected):
    d = thunk()
    assert d.holds is expected, (name, d.why)
    assert d.why and isinstance(d.evidence, dict)


def test_the_event_log_names_each_operation_its_stream_and_detail():
    log = StreamLog()
    s = log.new_stream("torch.cuda.Stream()")
    log.begin("prefill")
    ev = s.record_event()
    log.default_stream().wait_event(ev)
    s.wait_stream(log.default_stream())
    log.host_wait({}, "x")
    e = log.access("prefetch copy", 2, "h", "kv2", stream=s, tag="t")
    log.begin("decode 1")
    assert [(x["op"], x["stream"], x.get("detail")) for x in log.events[:-1]] == [
        ("create", "stream 1", "torch.cuda.Stream()"), ("record_event", "stream 1", "event 1"),
        ("create", "default", "default stream"), ("wait_event", "default", "event 1"),
        ("wait_stream", "stream 1", "waits for default"), ("host_wait", "x", "")]
    assert (e["op"], e["layer"], e["reads"], e["writes"], e["tag"]) == ("prefetch copy", 2, "h", "kv2", "t")
    assert log.events[-1] is e and not any(x["op"] == "host_wait" and x["stream"] == "default" for x in log.events)
    log.begin("decode 2", host_synced=True)
    assert log.events[-1]["detail"] == "the greedy loop copied the previous call's logits to the host (.cpu())"
    assert join({}, {"b": 0}) == {"b": 0}
