"""The runner starts a notebook once more when its kernel died before replying to kernel_info (no cell ran), and
says so in the run record; any other failure, or a second death, is reported as it is."""
from __future__ import annotations

import json
from pathlib import Path

import papermill
import pytest

from helpers.pipeline.run import execute
from helpers.pipeline.run.record import RunRecord
from inprocess import run_one  # tests/ is on sys.path

NB = Path("notebooks/02_mask_position_matrix.ipynb")
EMPTY = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """papermill whose kernel dies on the first `fails` starts (as jupyter_client says it), then runs."""
    calls: list[str] = []

    def run(fails: int = 1, error: str = execute.KERNEL_DIED) -> list[str]:
        def execute_notebook(src: str, out: str, **_kw: object) -> None:
            calls.append(out)
            if len(calls) <= fails:
                raise RuntimeError(error)
            Path(out).write_text(json.dumps(EMPTY))

        monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
        return calls

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    return run


def test_a_kernel_that_died_before_replying_is_started_once_more(standin):
    calls = standin(fails=1)
    res = run_one(NB)
    assert res.ok and res.status == "ok" and len(calls) == 2
    assert res.retried == f"run again once: the first kernel failed (RuntimeError: {execute.KERNEL_DIED})"


def test_a_second_death_or_another_failure_is_not_hidden(standin):
    calls = standin(fails=2)
    res = run_one(NB)
    assert not res.ok and execute.KERNEL_DIED in res.error and res.retried and len(calls) == 2
    calls.clear()
    standin(fails=1, error="ZeroDivisionError in cell 3")
    res = run_one(NB)
    assert not res.ok and not res.retried and len(calls) == 1


def test_the_worker_and_the_run_record_say_it_ran_twice(standin, tmp_path, monkeypatch):
    standin(fails=1)
    monkeypatch.setattr(execute.signal, "signal", lambda *_a: None)  # keep pytest's own handlers
    out = tmp_path / "nb.json"
    assert execute._exec_main([str(NB), "--out-json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and data["retried"].startswith("run again once")
    record = RunRecord(tmp_path, "run", {}, {NB.stem: {}})
    record.notebook(NB.stem, "ok", 1.0, "", data["retried"])
    record.notebook("01_identity_reconstruction", "ok", 1.0)
    saved = json.loads((tmp_path / "run.json").read_text())["notebooks"]
    assert saved[NB.stem]["retried"] == data["retried"] and "retried" not in saved["01_identity_reconstruction"]
