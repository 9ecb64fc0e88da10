"""Notebook 05 hands on what it already recorded or built: the same tables as recording again, nothing rebuilt."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pandas.testing import assert_frame_equal

from helpers import hybrid
from helpers.offload import hazards, loops, ordering, replay, schedule, tracking

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_hybrid_offloading_drift.ipynb"


@pytest.fixture(scope="module")
def twins() -> dict[str, torch.nn.Module]:
    return {name: hybrid.build_layout(name) for name in ("tiny hybrid", "tiny dense")}


@pytest.fixture(scope="module")
def twin_ids(twins) -> dict[str, torch.Tensor]:
    return {name: loops.random_ids(m, 2, 8, seed=0) for name, m in twins.items()}


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[tuple]:
    """Replace `module.name` by a wrapper that calls it and notes each call's positional arguments."""
    calls: list[tuple] = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("name", ["tiny hybrid", "tiny dense"])
def test_edge_table_takes_the_recorded_none_row(twins, twin_ids, monkeypatch, name) -> None:
    fresh = hazards.edge_table(twins[name], twin_ids[name], 3, name, tuple(tracking.EDGES))
    [recorded] = ordering.loops_by_models({name: twins[name]}, {name: twin_ids[name]}, 3, ("report",))
    calls = _counting(monkeypatch, hazards, "record_loop")
    reused = hazards.edge_table(twins[name], twin_ids[name], 3, name, tuple(tracking.EDGES), recorded=recorded)
    assert_frame_equal(reused, fresh)
    assert [c[5] for c in calls] == [e for e in tracking.EDGES if e != "none"]  # "none" not recorded again


def test_edge_table_refuses_a_record_of_other_inputs(twins, twin_ids) -> None:
    name, model, x = "tiny dense", twins["tiny dense"], twin_ids["tiny dense"]
    other_loop = ordering.record_loop(model, x, 3, "cpu", name)
    other_steps = ordering.record_loop(model, x, 2, "report", name)
    with_edge = ordering.record_loop(model, x, 3, "report", name, "5.20.0 edge")
    for bad in (other_loop, other_steps, with_edge):
        with pytest.raises(ValueError, match="recorded is"):
            hazards.edge_table(model, x, 3, name, ("none",), recorded=bad)
    with pytest.raises(ValueError, match="recorded is"):
        hazards.edge_table(model, x, 3, "another name", ("none",), recorded=ordering.record_loop(model, x, 3, "report", name))


def test_replay_takes_recorded_lag_zero_runs_and_the_floor(twins, twin_ids, monkeypatch) -> None:
    model, x, dtype = twins["tiny hybrid"], twin_ids["tiny hybrid"], torch.float32
    fresh = replay.race_replay(model, x, 3, [0, 12], dtype, fix_lag=12)
    fresh_report = replay.race_replay(model, x, 3, [0, 12], dtype, fix_lag=12, loops=("report",))
    sched = schedule.record_schedule(model, x, 3)
    report = ordering.record_loop(model, x, 3, "report", "tiny hybrid")
    runs, floors = _counting(monkeypatch, replay, "record_loop"), _counting(monkeypatch, replay, "greedy_run")
    reused = replay.race_replay(model, x, 3, [0, 12], dtype, fix_lag=12, recorded={"cpu": (sched.run, sched.streams)})
    reused_report = replay.race_replay(model, x, 3, [0, 12], dtype, fix_lag=12, loops=("report",),
                                       floor=(reused.reference, reused.again), recorded={"report": (report.run, report.log)})
    assert_frame_equal(reused.table(), fresh.table())
    assert_frame_equal(reused_report.table(), fresh_report.table())
    assert len(floors) == 2  # the first replay's offloading=False pair only
    assert sorted(c[6] for c in runs) == [12, 12, 12, 12]  # lag 12 and its fix, per loop: lag 0 never rerun
    assert reused.runs[0].log is sched.streams and reused_report.runs[0].run is report.run


def test_replay_refuses_a_run_of_another_loop_or_length(twins, twin_ids) -> None:
    model, x = twins["tiny dense"], twin_ids["tiny dense"]
    cpu = ordering.record_loop(model, x, 3, "cpu", "tiny dense")
    with pytest.raises(ValueError, match="recorded is"):
        replay.race_replay(model, x, 3, [0], torch.float32, loops=("report",), recorded={"report": (cpu.run, cpu.log)})
    with pytest.raises(ValueError, match="recorded is"):
        replay.race_replay(model, x, 2, [0], torch.float32, recorded={"cpu": (cpu.run, cpu.log)})
    with pytest.raises(ValueError, match="floor runs"):
        replay.race_replay(model, x, 2, [0], torch.float32, floor=(cpu.run, cpu.run))


def test_layout_models_builds_only_what_it_is_not_given(twins, monkeypatch) -> None:
    calls = _counting(monkeypatch, hybrid, "build_layout")
    given = {"tiny hybrid": twins["tiny hybrid"], "tiny dense": twins["tiny dense"]}
    built = hybrid.layout_models(0, given)
    assert list(built) == list(hybrid.LAYOUTS)
    assert built["tiny hybrid"] is given["tiny hybrid"] and built["tiny dense"] is given["tiny dense"]
    assert [c[0] for c in calls] == ["report layout (64)", "report dense (64)"]  # each built once, the given not at all


def test_only_an_unconverted_twin_counts_as_built() -> None:
    twin = hybrid.build_layout("tiny dense")
    same = hybrid.build_layout("tiny dense")
    assert hybrid.as_built(twin.to(torch.float32).to("cpu"))  # notebook 05's .to() on a float32 CPU run: a no-op
    assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), same.state_dict().values()))
    assert not hybrid.as_built(twin.to(torch.bfloat16))


def test_notebook_05_builds_each_layout_once_and_hands_records_on() -> None:
    source = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code")
    assert source.count("build_layout(") == 1  # section 1's dense twin; the layouts come from hybrid.layout_models
    assert source.count("hybrid.layout_models(seed, built)") == 1
    assert "recorded=recorded.get(name)" in source and "floor=(replay.reference, replay.again)" in source
