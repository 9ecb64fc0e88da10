"""Kill tests for the GPU arms' decision logic (make mutants: helpers/offload/gpu_decide.py, states.py, calibrate.py
with its copy timing) on hand-made tables and events: no model runs."""
from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from helpers.offload import calibrate
from helpers.offload import gpu_decide as gd


def test_sleep_plan_floor_factor_and_cap():
    assert calibrate.sleep_plan(None, 1000.0)["sleep_ms"] == calibrate.MIN_SLEEP_MS
    plan = calibrate.sleep_plan(2.0, 1000.0)
    assert (plan["sleep_ms"], plan["sleep_cycles"], plan["capped"]) == (8.0, 8000, False)
    capped = calibrate.sleep_plan(100.0, 1000.0)
    assert (capped["sleep_ms"], capped["capped"]) == (calibrate.MAX_SLEEP_MS, True)


def test_host_time_to_the_wrap_is_the_last_prefetch_of_each_forward():
    t = pd.DataFrame({"update_index": [0, 5, 6, 11], "call_index": [0, 0, 1, 1],
                      "host_ms_since_forward_start": [0.1, 3.0, 0.2, 2.5], "default_busy_at_enqueue": [True, False, True, True]})
    assert calibrate.host_ms_to_wrap(t) == 3.0
    assert calibrate.busy_at_wrap(t) == {"wrap_prefetches": 2, "default_busy": 1}
    assert calibrate.host_ms_to_wrap(None) is None and calibrate.busy_at_wrap(t.iloc[:0])["wrap_prefetches"] == 0


class _Ev:
    def __init__(self, t: float) -> None:
        self.t = t

    def elapsed_time(self, end: "_Ev") -> float:
        return end.t - self.t


def test_copy_times_pair_each_prefetch_with_its_copy_and_pending_reads():
    times = calibrate.CopyTimes(origin=_Ev(0.0))
    times.begin("prefill")
    times.note("offload", 3, done=_Ev(5.0))
    times.note("update", 4, done=_Ev(9.0), read_ptrs=[111])
    times.note("prefetch", 3, start=_Ev(1.0), end=_Ev(2.0), default_busy=True, ptrs=[111])
    times.begin("decode 1")
    times.note("prefetch", 3, start=_Ev(20.0), end=_Ev(21.0), default_busy=False, ptrs=[222])
    t = times.table()
    first, second = t.iloc[0], t.iloc[1]
    assert (first.lead_ms, first.cross_forward, first.overwrote_pending_read) == (4.0, False, True)
    assert first.pending_read_of == ["prefill layer 4"] and first.reused_block_of == ["prefill layer 4"]
    assert (second.lead_ms, second.cross_forward, second.overwrote_pending_read) == (-15.0, True, False)
    assert calibrate.write_order(times) == {(0, 4): 1, (0, 3): 2, (1, 3): 3}


def test_narrow_models_from_contradicting_records():
    def rows(model, event, reuse):
        return [{"model": model, "edge": "offload event", "closes_host_buffer": event[0], "closes_reuse": event[1]},
                {"model": model, "edge": "record_stream", "closes_host_buffer": reuse[0], "closes_reuse": reuse[1]}]
    both = pd.DataFrame(rows("a", (True, True), (False, True)) + rows("b", (True, False), (False, True)))
    assert gd.narrow_models(both) == ["b"] and gd.narrow_key(("report", "a", "x"), both) == ("report", "b", "x")
    neither = pd.DataFrame(rows("a", (True, True), (True, True)))
    assert gd.narrow_models(neither) == [] and gd.narrow_key(("report", "a", "x"), neither) == ("report", "a", "x")
    assert gd.narrow_models(pd.DataFrame(rows("a", (True, False), (True, True)))) == []
    assert gd.narrow_models(pd.DataFrame(rows("a", (False, False), (False, True)))) == []
    assert gd.narrow_models(None) == [] and gd.narrow_models(pd.DataFrame(rows("a", (True, False), (False, True))[:1])) == []


# --- each explanation's prediction on hand-made tables --------------------------------------------------------------

M, DT = "m", "bfloat16"
OFF = "offloading=True"
EVENT, REUSE = "offloading=True + offload event", "offloading=True + record_stream"


def _steps(loop: str, variant: str, drift: bool) -> list[dict[str, Any]]:
    diffs = [0.0, 2.0 if drift else 0.0, 3.0 if drift else 0.0]
    return [{"loop": loop, "model": M, "dtype": DT, "variant": variant, "step": i, "max_abs_diff": d, "noise_threshold": 0.01,
             "matches": d <= 0.01, "differs": d > 0.01, "bitwise_equal": d == 0.0, "argmax_match": True} for i, d in enumerate(diffs)]


def _state(loop: str, variant: str, step: int, kind: str, differs: bool) -> dict[str, Any]:
    return {"loop": loop, "model": M, "dtype": DT, "variant": variant, "step": step,
            "call": "prefill" if step == 0 else f"decode {step}", "tensor": "layer 3 keys", "layer": 3, "kind": kind,
            "write_order": 3, "max_abs_diff": 1.0 if differs else 0.0, "noise_threshold": 0.01, "differs": differs}


def world(first_call: str = "prefill", first_kind: str = "attention K/V", event_clean: bool = True, reuse_clean: bool = False,
          same_forward: int = 3, earlier_forward: int = 2, pending: int = 0) -> tuple[Any, Any, Any]:
    """Tables of one run: the plain arm drifts (logits from decode 1; its first state difference at `first_call`)."""
    steps, states, timing = [], [], []
    step = 0 if first_call == "prefill" else int(first_call.split()[-1])
    for loop in ("cpu", "report"):
        steps += _steps(loop, OFF, True) + _steps(loop, EVENT, not event_clean) + _steps(loop, REUSE, not reuse_clean)
        states += [_state(loop, OFF, s, first_kind, s >= step) for s in range(3)]
        states += [_state(loop, EVENT, s, first_kind, not event_clean and s >= step) for s in range(3)]
        states += [_state(loop, REUSE, s, first_kind, not reuse_clean and s >= step) for s in range(3)]
        base = {"loop": loop, "model": M, "dtype": DT, "variant": OFF, "default_busy_at_enqueue": True}
        timing += [{**base, "lead_ms": 1.0, "cross_forward": False, "overwrote_pending_read": k < pending} for k in range(same_forward)]
        if loop == "report":
            timing += [{**base, "lead_ms": 1.0, "cross_forward": True, "overwrote_pending_read": False} for _ in range(earlier_forward)]
    return pd.DataFrame(steps), pd.DataFrame(states), gd.race_counts(pd.DataFrame(timing))


def matched(tables: tuple[Any, Any, Any]) -> dict[str, bool]:
    return {r["explanation"][:3]: r["matched"] for r in gd.explanations(*tables, M, DT)}


def test_the_wrap_race_matches_a_and_b_only():
    assert matched(world()) == {"(a)": True, "(b)": True, "(c)": False, "(d)": False}


def test_each_prediction_of_the_wrap_race_is_needed():
    assert matched(world(first_call="decode 1"))["(a)"] is False  # prefill snapshot clean
    assert matched(world(same_forward=0))["(a)"] is False  # no same-forward prefetch started early
    assert matched(world(event_clean=False))["(a)"] is False  # the host-buffer fix does not remove it
    assert matched(world(first_kind="linear conv/recurrent state"))["(a)"] is False
    assert matched(world(earlier_forward=0))["(b)"] is False
    assert matched(world(event_clean=False))["(b)"] is False


def test_the_reuse_race_matches_c_only():
    reuse = world(first_call="decode 1", event_clean=False, reuse_clean=True, pending=1, earlier_forward=0)
    assert matched(reuse) == {"(a)": False, "(b)": False, "(c)": True, "(d)": False}
    assert matched(world(first_call="decode 1", event_clean=False, reuse_clean=True, pending=0))["(c)"] is False
    assert matched(world(first_call="decode 1", event_clean=True, reuse_clean=True, pending=1))["(c)"] is False
    assert matched(world(first_call="decode 1", event_clean=False, reuse_clean=False, pending=1))["(c)"] is False
    assert matched(world(first_call="prefill", event_clean=False, reuse_clean=True, pending=1))["(c)"] is False
    assert matched(world(first_call="decode 2", event_clean=False, reuse_clean=True, pending=1))["(c)"] is False


def test_a_linear_state_first_matches_the_reports_hypothesis():
    assert matched(world(first_kind="linear conv/recurrent state"))["(d)"] is True
    steps, states, counts = world()
    clean = states.assign(differs=False)
    rows = matched((steps, clean, counts))
    assert rows["(d)"] is False and rows["(a)"] is False


def test_explanations_report_what_they_saw():
    rows = gd.explanations(*world(), M, DT)
    a = rows[0]["observed"]
    assert a["first"]["call"] == "prefill" and a["prefill_logits_bitwise"] is True and a["same_forward_early"] == 3
    assert rows[1]["observed"] == {"earlier_forward_early": 2, "offload_event_clean": True}
    empty = gd.explanations(pd.DataFrame(columns=world()[0].columns), pd.DataFrame(columns=world()[1].columns),
                            world()[2].iloc[:0], M, DT)
    assert empty[0]["observed"]["prefill_logits_bitwise"] is None and not any(r["matched"] for r in empty)


# --- whole outputs ---------------------------------------------------------------------------------------------------

def test_sleep_plan_whole_output():
    assert calibrate.sleep_plan(2.00049, 1000.0, factor=3.0, floor_ms=0.5, cap_ms=6.0002) == {
        "cycles_per_ms": 1000.0, "host_ms_to_wrap": 2.00049, "factor": 3.0, "floor_ms": 0.5, "cap_ms": 6.0002,
        "sleep_ms": 6.0002, "sleep_cycles": 6000, "capped": True,
        "why": "sleep = min(6.0002 ms, max(0.5 ms, 3.0 x 2.0 ms host time to the wrap prefetch))"}
    at_cap = calibrate.sleep_plan(2.0, 1000.0, factor=3.0, cap_ms=6.0)
    assert (at_cap["sleep_ms"], at_cap["capped"]) == (6.0, False)  # exactly the cap is not capped
    none = calibrate.sleep_plan(None, 10.0)
    assert none["why"].endswith("x None ms host time to the wrap prefetch))") and none["sleep_cycles"] == 10


def test_wrap_helpers_on_one_row_and_on_nothing():
    one = pd.DataFrame({"update_index": [4], "call_index": [0], "host_ms_since_forward_start": [1.5],
                        "default_busy_at_enqueue": [True]})
    assert calibrate.host_ms_to_wrap(one) == 1.5 and calibrate.busy_at_wrap(one) == {"wrap_prefetches": 1, "default_busy": 1}
    empty = one.iloc[:0]
    assert calibrate.host_ms_to_wrap(empty) is None
    assert calibrate.busy_at_wrap(None) == calibrate.busy_at_wrap(empty) == {"wrap_prefetches": 0, "default_busy": 0}


def test_copy_times_whole_rows(monkeypatch):
    clock = iter([10.0, 10.002, 10.004, 10.005, 10.007, 10.010, 10.011])
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(clock))
    times = calibrate.CopyTimes(origin=_Ev(1.0))
    times.begin("prefill")                                         # 10.0
    times.note("state write", 1, method="update_conv_state")      # 10.002
    times.note("update", 2, done=_Ev(3.0), read_ptrs=[])           # 10.004: read nothing (first call)
    times.note("update", 4, done=_Ev(8.0), read_ptrs=[7, 8])       # 10.005
    times.note("prefetch", 5, start=_Ev(2.0), end=_Ev(2.5), default_busy=False, ptrs=[9])  # 10.007: no producer
    times.note("prefetch", 6, start=_Ev(8.0), end=_Ev(9.0), default_busy=True, ptrs=[8])   # 10.010
    rows = times.table().to_dict("records")
    assert rows[0] == {"call": "prefill", "call_index": 0, "update_index": -1, "layer": 5, "producer_call": None,
                       "cross_forward": False, "prefetch_start_ms": 1.0, "prefetch_end_ms": 1.5, "producer_done_ms": None,
                       "lead_ms": None, "default_busy_at_enqueue": False,
                       "host_ms_since_forward_start": pytest.approx(7.0), "reused_block_of": [], "overwrote_pending_read": False,
                       "pending_read_of": []}
    assert rows[1]["reused_block_of"] == ["prefill layer 4"] and rows[1]["pending_read_of"] == []  # ends exactly at the start
    assert rows[1]["overwrote_pending_read"] is False and rows[1]["host_ms_since_forward_start"] == pytest.approx(10.0)
    assert times.rows[0]["host_ms"] == pytest.approx(2.0) and times.rows[0]["method"] == "update_conv_state"
    assert calibrate.write_order(times) == {(0, 1): 0, (0, 2): 1, (0, 4): 2, (0, 5): 3, (0, 6): 4}


def test_race_counts_keep_the_arms_order_and_columns():
    rows = [{"loop": "report", "model": "m", "dtype": "x", "variant": v, "lead_ms": ms, "cross_forward": False,
             "overwrote_pending_read": False, "default_busy_at_enqueue": True}
            for v, ms in (("z arm", 0.5), ("a arm", None), ("z arm", None))]
    counts = gd.race_counts(pd.DataFrame(rows))
    assert counts.variant.tolist() == ["z arm", "a arm"]
    assert counts.started_before_producer_done.tolist() == [1, 0] and counts.max_lead_ms.tolist()[0] == 0.5
    empty = gd.race_counts(pd.DataFrame(columns=list(rows[0])))
    assert empty.columns.tolist() == ["loop", "model", "dtype", "variant", "prefetches", "started_before_producer_done",
                                      "same_forward", "earlier_forward", "max_lead_ms", "overwrote_pending_read",
                                      "default_busy_at_enqueue"] and empty.empty


def _edge_rows(model: str, event: tuple[bool, bool], reuse: tuple[bool, bool]) -> list[dict[str, Any]]:
    return [{"model": model, "edge": "offload event", "closes_host_buffer": event[0], "closes_reuse": event[1]},
            {"model": model, "edge": "record_stream", "closes_host_buffer": reuse[0], "closes_reuse": reuse[1]}]


def test_narrow_models_keep_the_experiments_order():
    both = pd.DataFrame(_edge_rows("b", (True, False), (False, True)) + _edge_rows("a", (True, False), (False, True)))
    assert gd.narrow_models(both) == ["b", "a"]
    assert gd.narrow_key(("report", "a", "x"), both) == ("report", "a", "x")  # the primary model is narrow: kept
    assert gd.narrow_key(("report", "c", "a"), both) == ("report", "b", "a")
    assert gd.narrow_models(pd.DataFrame(columns=["model", "edge", "closes_host_buffer", "closes_reuse"])) == []


def test_fix_decision_edge_cases():
    steps = pd.DataFrame([_steps("report", OFF, True)[0] | {"step": s, "max_abs_diff": d, "matches": d <= 0.01,
                                                            "differs": d > 0.01, "bitwise_equal": d == 0}
                          for s, d in ((0, 0.0), (1, 2.123456))]
                         + [_steps("report", EVENT, False)[0]])
    states = pd.DataFrame(columns=["loop", "model", "dtype", "variant", "step", "write_order", "layer", "differs"])
    d = gd.decide_fix_removes_drift(steps, states, ("report", M, DT), "offload event")
    assert d.holds and d.deciding == {"drift without the edge": True, "max |logit diff| with offload event": 0.0}
    missing = gd.decide_fix_removes_drift(steps, states, ("report", M, DT), "record_stream")
    assert not missing.holds and missing.deciding["max |logit diff| with record_stream"] is None
    assert "[2.1235]" in gd.decide_decode_drifts(steps, ("report", M, DT)).why


@pytest.mark.parametrize("rate", [calibrate.MIN_CYCLES_PER_MS, 1.4e6, calibrate.MAX_CYCLES_PER_MS])
def test_a_plausible_clock_rate_passes(rate):
    assert calibrate.checked_rate(rate) == rate


@pytest.mark.parametrize("rate", [calibrate.MIN_CYCLES_PER_MS * 0.999, calibrate.MAX_CYCLES_PER_MS * 1.001, 0.0, -1.0,
                                  float("inf"), float("nan"), 1e12])
def test_an_implausible_clock_rate_is_refused(rate):
    with pytest.raises(ValueError, match="outside a 1e\\+05-5e\\+06 \\(100 MHz-5 GHz\\) clock"):
        calibrate.checked_rate(rate)


def test_sleep_cycles_are_clamped_to_the_cap_at_the_checked_rate():
    rate = 1e6
    assert calibrate.clamp_cycles(5_000, rate) == 5_000
    cap = int(calibrate.MAX_SLEEP_MS * rate)
    assert calibrate.clamp_cycles(cap, rate) == cap and calibrate.clamp_cycles(cap + 1, rate) == cap
    assert calibrate.clamp_cycles(10**15, rate) == cap  # another run's or a hand-set sleep cannot spin for hours
    assert calibrate.clamp_cycles(-5, rate) == 0 and calibrate.clamp_cycles(0, rate) == 0
    assert calibrate.clamp_cycles(7_000, rate, cap_ms=0.005) == 5_000
    assert calibrate.clamp_cycles(10**9, 999_000.7, cap_ms=1.0) == 999_001  # rounded like sleep_plan, not floored
    with pytest.raises(ValueError):
        calibrate.clamp_cycles(1_000, 1e3)  # a bad rate is refused, not used to size the clamp


def _report_steps(rows: list[tuple[str, str, str, list[float]]], threshold: float = 0.01) -> pd.DataFrame:
    """(model, dtype, variant, diffs) per arm, in the report's loop."""
    return pd.DataFrame([{"loop": "report", "model": m, "dtype": d, "variant": v, "step": i, "max_abs_diff": x,
                          "noise_threshold": threshold, "matches": x <= threshold, "differs": x > threshold}
                         for m, d, v, xs in rows for i, x in enumerate(xs)])


_STATES = pd.DataFrame(columns=["loop", "model", "dtype", "variant", "step", "differs", "kind", "tensor", "call", "layer",
                                "write_order", "max_abs_diff", "noise_threshold"])
EDGE = "offloading=True + 5.20.0 edge"
P = ("report", "tiny hybrid", "bfloat16")


def test_fix_everywhere_reads_the_64_layer_arm_too():
    big = ("report layout (64)", "bfloat16")
    fixed = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0]),
                    (*big, OFF, [0, 3.0]), (*big, EDGE, [0, 0])])
    d = gd.fix_everywhere(fixed, _STATES, P, "5.20.0 edge")
    assert d.holds and d.evidence["other_report_arms_fixed"] == {"report layout (64)/bfloat16": True}
    still = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0]),
                    (*big, OFF, [0, 3.0]), (*big, EDGE, [0, 0.5])])
    d = gd.fix_everywhere(still, _STATES, P, "5.20.0 edge")
    assert not d.holds and d.why.endswith("; still drifting with 5.20.0 edge on ['report layout (64)/bfloat16']")
    quiet = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0]),
                    (*big, OFF, [0, 0]), (*big, EDGE, [0, 0.5])])
    d = gd.fix_everywhere(quiet, _STATES, P, "5.20.0 edge")  # no drift there to remove: not read
    assert d.holds and d.evidence["other_report_arms_fixed"] == {}
    primary_fails = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0.5])])
    assert not gd.fix_everywhere(primary_fails, _STATES, P, "5.20.0 edge").holds
    assert gd.report_keys(fixed, EDGE) == [P, ("report", *big)]


def test_logit_and_end_state_drift_apart():
    s = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 0])])
    st = pd.DataFrame([{"loop": "report", "model": "tiny hybrid", "dtype": "bfloat16", "variant": OFF, "step": 3,
                        "differs": True, "kind": "attention K/V", "tensor": "layers[3]", "call": "decode 3", "layer": 3,
                        "write_order": 0, "max_abs_diff": 1.0, "noise_threshold": 0.01}])
    assert not gd.logit_drift(s, P, OFF) and gd.state_drift(st, P, OFF) and gd.drifts(s, st, P, OFF)
    d = gd.decide_fix_removes_drift(s, st, P, "5.20.0 edge")
    assert d.evidence["logit_drift_without_edge"] is False and d.evidence["end_state_drift_without_edge"] is True
    assert gd.decide_unlagged_drift(s, st).skipped  # no unlagged arm ran


def test_fix_everywhere_keeps_the_primary_decision_and_reads_only_arms_where_the_edge_ran():
    big = ("report layout (64)", "bfloat16")
    base = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0])])
    first = gd.decide_fix_removes_drift(base, _STATES, P, "5.20.0 edge")
    d = gd.fix_everywhere(base, _STATES, P, "5.20.0 edge")
    assert (d.holds, d.why, d.deciding, d.source, d.skipped) == (first.holds, first.why, first.deciding, first.source, False)
    no_edge_there = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0]),
                                   (*big, OFF, [0, 3.0])])  # the 64-layer arm drifts, but its edge arm did not run
    assert gd.fix_everywhere(no_edge_there, _STATES, P, "5.20.0 edge").holds
    still = _report_steps([("tiny hybrid", "bfloat16", OFF, [0, 2.0]), ("tiny hybrid", "bfloat16", EDGE, [0, 0]),
                           (*big, OFF, [0, 3.0]), (*big, EDGE, [0, 0.5])])
    assert gd.fix_everywhere(still, _STATES, P, "5.20.0 edge").why == (
        first.why + "; still drifting with 5.20.0 edge on ['report layout (64)/bfloat16']")
    cpu = pd.concat([base, base.assign(loop="cpu", model="other")], ignore_index=True)
    assert gd.report_keys(cpu, EDGE) == [P] and gd.report_keys(cpu, OFF) == [P]


def test_explanations_whole_text_and_observed_keys():
    rows = gd.explanations(*world(), M, DT)
    assert [r["predicts"] for r in rows] == [
        "cpu loop: first offloaded layer differs at the prefill snapshot while prefill logits are bitwise equal; "
        "same-forward prefetches start before their copy ends; the offload-event arm is clean",
        "report loop: decode-1 prefetches of the prefill's buffers start before their copies end; the offload-event arm is clean",
        "cpu loop: clean prefill snapshot, first offloaded layer differs at decode 1; a prefetch overwrites a block under a "
        "pending read; the record_stream arm is clean and the offload-event arm is not",
        "the first differing tensor is a linear-attention conv/recurrent state"]
    assert [sorted(r["observed"]) for r in rows] == [
        ["first", "offload_event_clean", "prefill_logits_bitwise", "same_forward_early"],
        ["earlier_forward_early", "offload_event_clean"],
        ["first", "offload_event_clean", "overwrote_pending_read", "record_stream_clean"], ["first"]]
    one = gd.explanations(*world(same_forward=1, earlier_forward=1), M, DT)  # one early prefetch is enough
    assert one[0]["matched"] and one[1]["matched"]
