"""Issue 37's GPU-arm changes, on CPU under the recording stand-ins (a simulation): the pinned pool poisoned before
each offloading arm, the device probe gating the offload-event arm, the unlagged report-loop arm, the report's 64-layer
layout in bfloat16 and its loop only, and the plan `make gpu-plan` prints."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from helpers.offload import arms, calibrate, gpu, gpu_run, standins, tracking
from helpers.pipeline.tools import gpu_plan
from helpers.offload import gpu_decide as gd

TINY = ("tiny hybrid", "tiny dense")


@pytest.fixture(scope="module")
def dense():
    models, ids = gpu.default_models(seed=0, batch_size=2, seq_len=8, device="cpu", names=("tiny dense",))
    return models, ids


def _raced(dense, **kw) -> gpu.GpuExperiment:
    models, ids = dense
    return gpu.experiment(models, ids, ("bfloat16",), loops=("report",), n_steps=3, fixes=(), simulate=True,
                          race_lag=16, **kw)


def test_a_poisoned_pool_shows_the_drift_an_unpoisoned_one_hides(dense):
    poisoned = _raced(dense)
    decide = lambda ex: gd.decide_decode_drifts(ex.steps, ("report", "tiny dense", "bfloat16")).holds  # noqa: E731
    assert decide(poisoned), poisoned.steps
    off = [m for m in poisoned.memory if m["variant"] == arms.OFF][0]
    assert off["stale_reads_served"] > 0 and off["pool"]["poisoned"] and off["pool"]["value"] == arms.POISON
    assert off["pool"]["blocks"] > 0  # the calibration runs left blocks in the modelled pool
    assert poisoned.settings["pool_poisoned_before_each_offloading_arm"] is True
    assert all(m["pool"] == {"poisoned": False} for m in poisoned.memory if not m["variant"].startswith("offloading=True"))
    # the same race with the pool as the calibration runs left it: every stale read returns correct values
    hidden = _raced(dense, poison=False)
    assert not decide(hidden) and hidden.steps[hidden.steps.variant == arms.OFF].bitwise_equal.all()
    assert [m for m in hidden.memory if m["variant"] == arms.OFF][0]["stale_reads_served"] > 0


def test_sim_pool_returns_what_the_block_held_and_poisons_it():
    p = arms.SimPool()
    a = torch.arange(4.0).reshape(2, 2)
    assert p.fill(3, "keys", a) is None  # a fresh block
    assert torch.equal(p.fill(3, "keys", a + 1), a)
    assert p.poison(7.0) == {"poisoned": True, "value": 7.0, "blocks": 1, "how": "simulated pool (stand-ins)"}
    assert torch.equal(p.fill(3, "keys", a), torch.full((2, 2), 7.0)) and p.fill(3, "values", a) is None


def test_poison_pinned_pool_checks_out_until_the_pool_grows(monkeypatch):
    grown = {"n": 10, "cached": 3}
    real_empty = torch.empty

    def empty(n, dtype=None, pin_memory=False):
        assert pin_memory
        if grown["cached"]:
            grown["cached"] -= 1
        else:
            grown["n"] += 1
        return real_empty(n, dtype=dtype)

    monkeypatch.setattr(arms, "_grown", lambda: grown["n"])
    monkeypatch.setattr(arms.torch, "empty", empty)
    out = arms.poison_pinned_pool([64, 64, 128], torch.float32)
    assert out["per_size_bytes"] == {64: 4, 128: 1} and out["blocks"] == 5 and out["value"] == arms.POISON
    monkeypatch.setattr(arms, "_grown", lambda: None)  # no host_memory_stats: a fixed count per size
    assert arms.poison_pinned_pool([64], torch.float32)["per_size_bytes"] == {64: arms.FIXED_BLOCKS}


def test_kv_sizes_follow_the_config_and_every_offloaded_length(dense):
    models, ids = dense
    assert arms.kv_nbytes(models["tiny dense"], ids["tiny dense"], 3) == [2 * 2 * L * 16 * 4 for L in (8, 9, 10)]
    assert arms.poison_before_arm(models["tiny dense"], ids["tiny dense"], 3, None) == {"poisoned": False, "why": "not CUDA: no pinned pool"}


def test_the_device_probe_tells_the_two_event_forms_apart():
    with standins.recording_streams():
        waiter = torch.Stream()  # 5.17.0's prefetch stream with torch >= 2.7
        found = calibrate.event_wait_probe(waiter, standins.STAND_IN_CYCLES_PER_MS)
        cuda_waiter = calibrate.event_wait_probe(torch.cuda.Stream(), standins.STAND_IN_CYCLES_PER_MS)
    assert found["prefetch_stream"] == "torch.Stream" and found["conclusive"]
    assert found["arm_form_waits"] and not found["no_op_form_waits"] and calibrate.gate_reason(found) == ""
    assert cuda_waiter["arm_form_waits"] and cuda_waiter["no_op_form_waits"]  # torch.cuda.Stream waits for both kinds
    assert "did not hold" in calibrate.gate_reason({**found, "arm_form_waits": False})
    assert "inconclusive" in calibrate.gate_reason({**found, "arm_form_waits": False, "conclusive": False})


def test_a_probe_that_does_not_hold_skips_the_event_arm(dense, monkeypatch):
    monkeypatch.setattr(tracking, "device_event", tracking.cuda_event)  # the arm's form is now the no-op one
    models, ids = dense
    ex = gpu.experiment(models, ids, ("float32",), loops=("report",), n_steps=2, simulate=True)
    assert "offload event" not in ex.settings["fixes"] and "did not hold" in ex.settings["event_arm_gate"]
    assert arms.variant_name("offload event") not in set(ex.steps.variant)
    d = gpu.decisions(ex)["offload.offload_event_removes_drift"]
    assert d.skipped and "did not hold" in d.why
    data = gpu.results_json(ex, 1.0)
    verdicts = {c["id"]: c["verdict"] for c in data["claims"]}
    assert verdicts["offload.offload_event_removes_drift"] == "skipped"
    rows = {r["explanation"][:3]: r for r in gd.explanations(ex.steps, ex.states, ex.counts, "tiny dense", "float32")}
    assert rows["(b)"]["observed"]["offload_event_clean"] is False  # an arm that did not run is not clean


def test_unlagged_rows_from_contradicting_tables():
    def step(variant, diff):
        return {"loop": "report", "model": "m", "dtype": "bfloat16", "variant": variant, "step": 1, "max_abs_diff": diff,
                "differs": diff > 0.5, "matches": diff <= 0.5}
    states = pd.DataFrame(columns=["loop", "model", "dtype", "variant", "step", "differs", "kind", "tensor", "call", "layer",
                                   "write_order", "max_abs_diff", "noise_threshold"])
    steps = pd.DataFrame([step(arms.OFF, 2.0), step(arms.UNLAGGED, 0.0)])
    assert gd.unlagged_rows(steps, states) == [{"loop": "report", "model": "m", "dtype": "bfloat16", "drifts_without_lag": False,
                                               "max_abs_diff": 0.0, "steps_beyond_floor": 0, "drifts_with_lag": True,
                                               "logit_drift_without_lag": False, "end_state_drift_without_lag": False}]
    drifting = pd.DataFrame([step(arms.OFF, 2.0), step(arms.UNLAGGED, 3.0)])
    assert gd.unlagged_rows(drifting, states)[0]["drifts_without_lag"] is True
    assert gd.unlagged_rows(steps[steps.variant == arms.OFF], states) == []


def test_the_plan_lists_the_report_layout_the_unlagged_arm_poisoning_and_timeout():
    p = gpu_plan.plan(["5.17.0", "5.20.0"], step_timeout=200)
    assert p["layouts"]["report layout (64)"] == {"layers": 64, "linear_attention": 48, "full_attention": 16}
    assert {"model": "report layout (64)", "dtype": "bfloat16", "loops": ["report"]} in p["runs"]
    assert not any(r["model"] == "report layout (64)" and r["dtype"] == "float32" for r in p["runs"])
    unlagged = [a for a in p["arms"] if a["lag"] == "unlagged"]
    assert {(a["model"], a["loop"], a["arm"]) for a in unlagged} == {(m, "report", arms.UNLAGGED) for m in gpu_run.MODELS}
    assert str(arms.POISON) in p["pool_poisoning"] and p["step_timeout_s"] == 200
    assert 0 < p["expected_minutes"] <= 10


def test_model_runs_restrict_the_report_layout():
    runs = gpu_run.model_runs(gpu_run.MODELS, ("float32", "bfloat16"), ("report", "cpu"))
    assert runs == [("tiny hybrid", "float32", ("report", "cpu")), ("tiny dense", "float32", ("report", "cpu")),
                    ("tiny hybrid", "bfloat16", ("report", "cpu")), ("tiny dense", "bfloat16", ("report", "cpu")),
                    ("report layout (64)", "bfloat16", ("report",))]
    assert gpu_run.model_runs(gpu_run.MODELS, ("float32",), ("cpu",)) == [("tiny hybrid", "float32", ("cpu",)),
                                                                         ("tiny dense", "float32", ("cpu",))]
    assert [a[0] for a in gpu_run.arms_of("cpu", ("record_stream",))] == [arms.BASE, arms.AGAIN, arms.OFF,
                                                                          arms.variant_name("record_stream")]


def test_clocks_are_warmed_before_the_rate_is_measured():
    with standins.recording_streams() as log:
        facts = gpu_run.device_facts(gpu.default_models(0, 2, 8, "cpu", names=("tiny dense",))[0]["tiny dense"], ("offload event",))
    sleeps = [e for e in log.events if e["op"] == "sleep"]
    assert facts["warm"]["warm_ms"] > 0 and sleeps[1]["t_end"] - sleeps[1]["t_start"] == pytest.approx(facts["warm"]["warm_ms"], rel=0.01)
    assert facts["probe"]["arm_form_waits"]


def test_the_report_layout_runs_in_bfloat16_and_the_reports_loop_only(tmp_path):
    rc = gpu.main(["--simulate", "--out", str(tmp_path), "--n-steps", "2", "--seq-len", "8", "--models", "report layout (64)",
                   "--loops", "report", "cpu"])
    assert rc == 0
    data = json.loads((tmp_path / "gpu-arms.json").read_text())
    assert data["settings"]["runs"] == [["report layout (64)", "bfloat16", ["report"]]]
    assert {(r["loop"], r["dtype"]) for r in data["tables"]["steps"]} == {("report", "bfloat16")}
    assert [r["model"] for r in data["tables"]["unlagged"]] == ["report layout (64)"]
    # no `.cpu()` loop: no explanation reads it; its CPU edge record is notebook 05's, not repeated here
    assert data["tables"]["explanations"] == [] and data["tables"]["edges_on_cpu_record"] is None


HOST_READS = (torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__index__)  # a tensor read on the host: on CUDA each waits for the device


class HostReads(torch.overrides.TorchFunctionMode):
    """Enters "read" into `events` at every host read of a tensor (HOST_READS) while active."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.events.append("read")
        return func(*args, **(kwargs or {}))


def reads_after_marks(events: list[str]) -> list[int]:
    """Per "lag" mark: the host reads entered after it and before the next "update" (or the next mark)."""
    out: list[int] = []
    open_ = False
    for e in events:
        if e == "lag":
            out.append(0)
            open_ = True
        elif e == "update":
            open_ = False
        elif e == "read" and open_:
            out[-1] += 1
    return out


def _reads_after_lag(model, ids, loop: str, site) -> list[int]:
    """Per forward: the host reads between a pre-hook on `site` and the forward's first cache update (CPU, stand-ins)."""
    from kvresume import compat
    from helpers.offload import loops

    events: list[str] = []
    handle = site.register_forward_pre_hook(lambda module, args: events.append("lag"))
    try:
        with standins.recording_streams():
            cache = compat.dynamic_cache(model.config, offloading=True)
            with tracking.instrument(cache, lambda *a: events.append("update"), lambda i, l, m, original: original), \
                    HostReads(events):
                loops.run_loop(loop, model, ids, 3, cache=cache)
    finally:
        handle.remove()
    return reads_after_marks(events)


def test_the_lag_sits_where_no_host_read_drains_it(dense):
    """4.1: on the first decoder layer no host read (a device sync on CUDA) falls between the sleep and the first cache
    update, in every loop; on the top-level model generate()'s forward reads the mask on the host first (5.17.0)."""
    from kvresume import compat
    from packaging.version import Version

    models, ids = dense
    model, x = models["tiny dense"], ids["tiny dense"]
    site = arms.lag_site(model)
    assert site is model.model.layers[0]
    for loop in ("report", "cpu", "generate"):
        reads = _reads_after_lag(model, x, loop, site)
        assert len(reads) == 3 and reads == [0, 0, 0], (loop, reads)
    top = _reads_after_lag(model, x, "generate", model)
    if Version(compat.TRANSFORMERS_VERSION) < Version("5.18.0"):
        assert top[0] > 0, "the defect the lag site avoids: a host read after a top-level sleep"
    with standins.recording_streams() as log, arms.device_lag(model, 1000):
        model(x)
    assert [e["op"] for e in log.events].count("sleep") == 1
    flat = torch.nn.Linear(2, 2)
    flat.config = model.config
    with pytest.raises(ValueError, match="no decoder layer list"):
        arms.lag_site(flat)


def test_host_reads_after_marks():
    assert reads_after_marks(["read", "lag", "read", "read", "update", "read", "lag", "update", "lag", "read"]) == [2, 0, 1]


def test_the_probe_records_through_the_streams_own_record_event():
    """4.6: after the wait the probe records the waiter's own event kind (no torch.cuda.Event cast onto a torch.Stream)."""
    with standins.recording_streams() as log:
        waiter = torch.Stream()
        before = log.calls.get("torch.cuda.Event", 0)
        calibrate.held_behind_sleep(waiter, tracking.device_event, 1000)
        assert log.calls.get("torch.cuda.Event", 0) == before


def test_the_calibrated_sleep_is_clamped_and_both_are_recorded(dense):
    models, ids = dense
    ex = gpu.experiment(models, ids, ("float32",), loops=("report",), n_steps=2, fixes=(), simulate=True, cycles=10**15)
    row = ex.calibration[0]
    assert row["sleep_cycles_asked"] == 10**15
    from helpers.offload import calibrate

    assert row["sleep_cycles_used"] == round(calibrate.MAX_SLEEP_MS * row["cycles_per_ms"])


def test_each_arm_is_written_as_it_finishes(tmp_path, monkeypatch):
    """4.4: arms.jsonl holds every finished arm even when a later run crashes."""
    real = gpu_run._loop_arms
    calls = {"n": 0}

    def crash_on_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return real(*a, **k)

    monkeypatch.setattr(gpu_run, "_loop_arms", crash_on_second)
    with pytest.raises(RuntimeError, match="device lost"):
        gpu.main(["--simulate", "--out", str(tmp_path), "--n-steps", "2", "--seq-len", "8", "--models", "tiny dense",
                  "--loops", "report", "cpu", "--dtypes", "float32"])
    rows = [json.loads(line) for line in (tmp_path / gpu.ARMS_LOG).read_text().splitlines()]
    assert [(r["loop"], r["variant"]) for r in rows] == [("report", v) for v, *_ in gpu_run.arms_of("report")[2:]]
    assert all(r["steps"] and r["sleep_cycles_used"] >= 0 and "race_counts" in r for r in rows)
    assert not (tmp_path / "gpu-arms.json").exists()


@pytest.mark.parametrize("capability, kept", [((7, 5), ("float32",)), ((8, 0), ("float32", "bfloat16")),
                                              ((9, 0), ("float32", "bfloat16"))])
def test_bfloat16_is_left_out_below_compute_capability_8(monkeypatch, capability, kept):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # as on a T4: not what decides
    got, dropped = gpu_run.usable_dtypes(("float32", "bfloat16"), torch.device("cuda"))
    assert got == kept
    assert (("bfloat16" in dropped) == (capability < (8, 0)))
    if dropped:
        assert "compute capability 7.5" in dropped["bfloat16"]
    assert gpu_run.usable_dtypes(("float32", "bfloat16"), torch.device("cpu")) == (("float32", "bfloat16"), {})
