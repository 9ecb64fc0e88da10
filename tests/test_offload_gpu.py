"""Notebook 05's GPU arms, executed on CPU under the recording stand-ins (a simulation): the arms, the device-event
timing, the calibration, the narrow fix arms, the explanations' predictions, and the plain module's command line."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from helpers.offload import arms, calibrate, gpu, loops, standins
from helpers.offload import gpu_decide as gd
from helpers.offload.states import ATTENTION_KV, LINEAR_STATE

N_STEPS = 3
TINY = ("tiny hybrid", "tiny dense")


@pytest.fixture(scope="module")
def small():
    return gpu.default_models(seed=0, batch_size=2, seq_len=8, device="cpu", names=TINY)


@pytest.fixture(scope="module")
def quiet(small) -> gpu.GpuExperiment:
    models, ids = small
    return gpu.experiment(models, ids, ("float32",), n_steps=N_STEPS, simulate=True)


@pytest.fixture(scope="module")
def raced(small) -> gpu.GpuExperiment:
    models, ids = small
    return gpu.experiment(models, ids, ("bfloat16",), n_steps=N_STEPS, simulate=True, race_lag=16)


def test_every_arm_runs_on_cpu_and_without_stale_reads_nothing_drifts(quiet):
    expected = {(loop, model) for loop in loops.LOOPS for model in TINY}
    assert set(zip(quiet.steps.loop, quiet.steps.model)) == expected
    assert set(quiet.steps.variant) == {arms.OFF, arms.OFF_AGAIN, arms.UNLAGGED, *(arms.variant_name(e) for e in arms.FIXES)}
    assert set(quiet.steps[quiet.steps.loop != "report"].variant) == {arms.OFF, *(arms.variant_name(e) for e in arms.FIXES)}
    assert quiet.steps.bitwise_equal.all() and not quiet.states.differs.any()
    assert set(quiet.states.kind) == {ATTENTION_KV, LINEAR_STATE}
    # the report's loop is snapshotted once, at the end; the others after every call
    per_arm = quiet.states.groupby(["loop", "model", "variant"]).step.nunique()
    assert set(per_arm.xs("report", level="loop")) == {1} and set(per_arm.xs("cpu", level="loop")) == {N_STEPS}
    verdicts = {cid: d.holds for cid, d in gpu.decisions(quiet).items()}
    assert verdicts["offload.prefill_identical"] and not verdicts["offload.decode_drifts"]
    assert verdicts["offload.race_observed_on_device"]  # the stand-ins' timeline: the lag makes prefetches start early
    assert standins.stand_ins_active() == []
    assert all(d.why.startswith(gpu.SIMULATED) for d in gpu.decisions(quiet).values())


def test_the_timeline_orders_what_the_edges_order(quiet):
    c = quiet.counts.set_index(["loop", "model", "variant"])
    for loop in loops.LOOPS:
        for model in TINY:
            assert c.loc[(loop, model, arms.variant_name("5.20.0 edge")), "started_before_producer_done"] == 0
            assert c.loc[(loop, model, arms.OFF), "same_forward"] > 0  # the wrap prefetch in every loop, dense too
    # only the report's loop has early reads of an earlier forward's copy; the offload event orders them all
    assert c.loc[("report", "tiny hybrid", arms.OFF), "earlier_forward"] > 0
    assert c.loc[("cpu", "tiny hybrid", arms.OFF), "earlier_forward"] == 0
    assert c.loc[("generate", "tiny dense", arms.OFF), "earlier_forward"] == 0
    assert c.loc[("report", "tiny hybrid", arms.variant_name("offload event")), "started_before_producer_done"] == 0
    lagged = c[c.index.get_level_values("variant") != arms.UNLAGGED]
    assert (lagged.default_busy_at_enqueue == lagged.prefetches).all()
    assert c.loc[("report", "tiny hybrid", arms.UNLAGGED), "default_busy_at_enqueue"] == 0  # no injected lag


def test_calibration_is_measured_and_stated(quiet):
    (cal_h, cal_d) = quiet.calibration
    assert cal_h["cycles_per_ms"] == pytest.approx(standins.STAND_IN_CYCLES_PER_MS, rel=0.01)
    assert cal_h["sleep_cycles_used"] == cal_h["sleep_cycles"] > 0 and "host time to the wrap" in cal_h["why"]
    assert quiet.settings["empty_cache_between_arms"] is False
    assert all(m["before"] == {"device": "not CUDA: no allocator counters"} for m in quiet.memory)


def test_the_replayed_race_is_decided_and_matches_the_wrap_explanation(raced):
    d = gpu.decisions(raced)
    holds = {cid: x.holds for cid, x in d.items()}
    assert holds == {"offload.prefill_identical": True, "offload.decode_drifts": True,
                     "offload.first_differing_tensor_is_attention_kv": True, "offload.ordering_edge_removes_drift": True,
                     "offload.race_observed_on_device": True, "offload.offload_event_removes_drift": True,
                     "offload.record_stream_removes_drift": False, # the stand-ins model no allocator reuse, and no lag = no stale read
                     "offload.block_overwritten_under_pending_read": False, "offload.unlagged_run_drifts": False}, {k: x.why for k, x in d.items()}
    first = d["offload.first_differing_tensor_is_attention_kv"].evidence["first_differing_tensor"]
    assert (first["tensor"], first["call"]) == ("layer 3 keys", "prefill")
    rows = {r["explanation"][:3]: r["matched"] for r in gd.explanations(raced.steps, raced.states, raced.counts, "tiny hybrid", "bfloat16")}
    assert rows == {"(a)": True, "(b)": True, "(c)": False, "(d)": False}


def test_explanations_follow_contradicting_tables(raced):
    steps, states, counts = raced.steps.copy(), raced.states.copy(), raced.counts.copy()
    # the offload-event arm drifts too: neither host-buffer explanation matches any more
    ev = (steps.variant == arms.variant_name("offload event")) & (steps.step == 1)
    steps.loc[ev, ["max_abs_diff", "matches", "differs"]] = [1.0, False, True]
    rows = {r["explanation"][:3]: r["matched"] for r in gd.explanations(steps, states, counts, "tiny hybrid", "bfloat16")}
    assert rows["(a)"] is False and rows["(b)"] is False
    # a linear state differs first: the report's hypothesis matches
    lin = raced.states.copy()
    lin.loc[lin.kind == ATTENTION_KV, "differs"] = False
    lin.loc[(lin.kind == LINEAR_STATE) & (lin.loop == "cpu") & (lin.variant == arms.OFF), "differs"] = True
    rows = {r["explanation"][:3]: r["matched"] for r in gd.explanations(raced.steps, lin, counts, "tiny hybrid", "bfloat16")}
    assert rows["(d)"] is True and rows["(a)"] is False


def test_device_lag_sleeps_on_the_default_stream_once_per_forward(tiny, ids):
    with standins.recording_streams() as log, arms.device_lag(tiny.model, 123):
        loops.greedy_run(tiny.model, ids, n_steps=2)
    sleeps = [e for e in log.events if e["op"] == "sleep"]
    assert len(sleeps) == 2 and {e["stream"] for e in sleeps} == {"default"}
    assert not tiny.model._forward_pre_hooks


def test_cycles_per_ms_reads_the_event_clock():
    with standins.recording_streams():
        assert calibrate.cycles_per_ms(repeats=3) == pytest.approx(standins.STAND_IN_CYCLES_PER_MS, rel=0.01)


def test_plain_module_writes_its_results_json(tmp_path, capsys):
    rc = gpu.main(["--simulate", "--out", str(tmp_path), "--n-steps", "2", "--seq-len", "8", "--dtypes", "float32",
                   "--loops", "report", "cpu"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu-arms.json").read_text())
    assert data["schema"] == "kvkit-gpu-arms/1" and data["settings"]["simulated_on_cpu"] is True
    assert [c["id"] for c in data["claims"]] == list(gpu.CUDA_CLAIMS)
    for c in data["claims"]:  # typed: what holds by construction cannot fail; the rest says what the GPU decides
        assert c["can_fail"] is (c["id"] not in gpu.BY_CONSTRUCTION) and (c.get("by_construction") or c.get("decides")), c
    assert [json.loads(l)["variant"] for l in (tmp_path / gpu.ARMS_LOG).read_text().splitlines()][:1] == ["offloading=True"]
    assert all(c["reason"].startswith(gpu.SIMULATED) for c in data["claims"])
    assert {c["kind"] for c in data["claims"]} == {"reproduces", "refutes", "beyond"}
    assert set(data["tables"]) >= {"steps", "race_counts", "explanations", "calibration", "memory"}
    assert "/" not in str(tmp_path.name) and str(tmp_path) not in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_plain_module_refuses_without_cuda_in_one_line(tmp_path, capsys):
    assert gpu.main(["--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "CUDA is not usable here" in out[0] and "CPU-only build" in out[0]
    assert not (tmp_path / "gpu-arms.json").exists()


BLOCK_JUPYTER = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("papermill", "nbformat", "nbconvert", "ipykernel", "IPython", "jupyter_client", "ipywidgets"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
sys.argv = ["helpers.offload.gpu", *sys.argv[1:]]
runpy.run_module("helpers.offload.gpu", run_name="__main__")
"""


def test_plain_module_needs_no_jupyter(tmp_path):
    import subprocess
    import sys

    from helpers.pipeline.paths import repo_root

    cmd = [sys.executable, "-c", BLOCK_JUPYTER, "--simulate", "--out", str(tmp_path), "--n-steps", "2", "--seq-len", "8",
           "--dtypes", "float32", "--loops", "report", "--models", "tiny dense"]  # one model: the imports are the point
    done = subprocess.run(cmd, cwd=str(repo_root()), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "gpu-arms.json").read_text())["schema"] == "kvkit-gpu-arms/1"


def test_the_report_loop_runs_twice_and_the_signature_takes_the_gpu_evidence(raced):
    from helpers.offload import signature

    assert {(r["loop"], r["step"]) for r in raced.repeat} == {("report", s) for s in range(N_STEPS)}
    assert all(r["bitwise_equal"] for r in raced.repeat)  # the replay is deterministic
    ev = signature.gpu_evidence(raced.steps, raced.repeat, raced.primary(), True)
    assert ev["exactly reproducible"].startswith("SIMULATED") and "bitwise equal every step = True" in ev["exactly reproducible"]
    assert "decode 1 beyond the floor = True" in ev["drift from decode 1"]
    replay = pd.DataFrame([{"variant": "v", "step": i, "max_abs_diff": d, "differs": d > 0} for i, d in enumerate([0.0, 1.0, 2.0])])
    row = {"unordered_earlier_forward": 2, "calls_since_producer": [1]}
    rows = signature.signature_rows(row, True, replay, "v", gpu=ev)
    assert [r["gpu_evidence"] for r in rows] == [ev[r["signature"]] for r in rows]
    waiting = signature.signature_rows(row, True, replay, "v")
    assert {r["gpu_evidence"] for r in waiting} == {signature.WAITS}


def test_narrow_fix_arms_are_decided_where_the_record_says_they_are_narrow(raced):
    # on the tiny hybrid (two offloaded layers) the offload event also orders the reuse; on the dense twin it does not
    assert gd.narrow_models(raced.edges) == ["tiny dense"]
    assert gd.narrow_key(raced.primary(), raced.edges) == ("report", "tiny dense", "bfloat16")
    d = gpu.decisions(raced)["offload.offload_event_removes_drift"]
    assert d.evidence["arm"] == ["report", "tiny dense", "bfloat16"] and d.evidence["narrow_on_cpu_record"] == ["tiny dense"]
    rows = gpu.explain(raced)
    assert {(r["model"], r["fix_arms_narrow_on_cpu_record"]) for r in rows} == {("tiny hybrid", False), ("tiny dense", True)}


def test_stand_ins_model_both_event_kinds_and_the_no_op_wait():
    """torch.Stream.wait_event(torch.cuda.Event) orders nothing on a GPU (helpers.offload.streams, CUDA_EVENT); a
    torch.Event, or a torch.cuda.Stream waiting, orders."""
    def ordered(stream_api: str, event_api: str) -> bool:
        with standins.recording_streams() as log:
            waiter = torch.Stream() if stream_api == "torch.Stream" else torch.cuda.Stream()
            torch.cuda._sleep(1000)
            event = torch.Event(device="cuda") if event_api == "torch.Event" else torch.cuda.Event()
            event.record(torch.cuda.current_stream())
            waiter.wait_event(event)
            return log.clocks[waiter.name].get("default", 0) > 0
    assert not ordered("torch.Stream", "torch.cuda.Event")
    assert ordered("torch.Stream", "torch.Event") and ordered("torch.cuda.Stream", "torch.cuda.Event")
    assert ordered("torch.cuda.Stream", "torch.Event")


def test_the_offload_event_arm_orders_and_its_no_op_form_does_not(small, monkeypatch):
    from helpers.offload import hazards, ordering, tracking

    models, ids = small
    model, x = models["tiny dense"], ids["tiny dense"]
    fixed = hazards.hazard_counts(ordering.record_loop(model, x, N_STEPS, "report", "tiny dense", "offload event"))
    assert fixed["host_buffer_unordered"] == 0 and fixed["prefetch_reads"] > 0
    monkeypatch.setattr(tracking, "device_event", tracking.cuda_event)  # the no-op form: torch.cuda.Event
    noop = ordering.record_loop(model, x, N_STEPS, "report", "tiny dense", "offload event")
    assert hazards.hazard_counts(noop)["host_buffer_unordered"] > 0
    assert any(e["op"] == "wait_event ignored" for e in noop.log.events)
