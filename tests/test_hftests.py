"""The hf-tests plugin on a 2-test synthetic suite: a plain and a tracked run, then the comparison."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.pipeline.tools import hftests

ROOT = Path(__file__).resolve().parents[1]
SUITE = '''
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

def test_resume():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 6))
    first = model.generate(ids, max_new_tokens=2, do_sample=False, past_key_values=DynamicCache(), return_dict_in_generate=True)
    out = model.generate(first.sequences, max_new_tokens=2, do_sample=False, past_key_values=first.past_key_values)
    assert out.shape[1] == 10

def test_plain():
    assert True
'''


def _run(tmp: Path, *flags: str) -> dict:
    """One pytest run of the synthetic suite under the plugin; its JSON record."""
    out = tmp / f"run{len(flags)}.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'packages' / 'kvresume'}"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-p",
                    "helpers.pipeline.tools.hftests", "--hf-json", str(out), *flags, str(tmp / "test_suite.py")],
                   cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(out.read_text())


@pytest.mark.e2e  # a multi-step run: in `make test`, not test-fast
def test_plugin_counts_a_tracked_resume(tmp_path: Path) -> None:
    """Both tests pass in both runs; the tracked run sees one tracked resume call and no refusal."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    base, tracked = _run(tmp_path), _run(tmp_path, "--hf-track")
    result = hftests.summary(base, tracked)
    assert result["tests_run"] == 2 and result["with_tracking"] == {"passed": 2} == result["without_tracking"]
    assert base["resume_calls"] == {} and tracked["resume_calls"] == {"tracked": 1}
    assert result["broken_by_tracking"] == [] and result["false_alarms"] == 0


def test_summary_names_a_broken_test() -> None:
    """A test failing only with tracking is listed; a false alarm is counted by its check."""
    base = {"outcomes": {"a": "passed", "b": "failed"}, "false_alarms": [], "refusals": [], "resume_calls": {}}
    fa = {"test": "a", "check": "positions", "message": "m"}
    tracked = {"outcomes": {"a": "failed", "b": "failed"}, "false_alarms": [fa], "refusals": [fa], "resume_calls": {}}
    result = hftests.summary(base, tracked)
    assert result["broken_by_tracking"] == ["a"] and result["false_alarms_by_check"] == {"positions": 1}
    assert result["broken_errors"] == {"a": "?"}


def test_outcome_is_the_worst_report() -> None:
    """A skipped subtest does not hide a later failure, nor a passing call; a setup skip stays skipped."""
    from types import SimpleNamespace as NS
    hftests.STATE["outcomes"].clear()
    hftests.STATE["errors"].clear()
    for nodeid, when, outcome in [("t1", "call", "skipped"), ("t1", "call", "failed"), ("t1", "call", "passed"),
                                  ("t2", "call", "skipped"), ("t2", "call", "passed"), ("t2", "teardown", "passed"),
                                  ("t3", "setup", "skipped"), ("t4", "setup", "passed"), ("t4", "call", "passed")]:
        hftests.pytest_runtest_logreport(NS(nodeid=nodeid, when=when, outcome=outcome, location=("f.py", 1, nodeid)))
    assert hftests.STATE["outcomes"] == {"t1": "failed", "t2": "passed", "t3": "skipped", "t4": "passed"}
    assert list(hftests.STATE["errors"]) == ["t1"]
    hftests.pytest_runtest_logreport(NS(nodeid="::Cls::t5", when="call", outcome="passed", location=("../x/f.py", 1, "")))
    assert hftests.STATE["outcomes"]["../x/f.py::Cls::t5"] == "passed"  # a file outside the rootdir keeps its path
    hftests.STATE["files"]["::Cls::t6"] = "/abs/g.py"  # pytest_itemcollected's record wins over the def's location
    hftests.pytest_runtest_logreport(NS(nodeid="::Cls::t6", when="call", outcome="passed", location=("../x/f.py", 1, "")))
    assert "/abs/g.py::Cls::t6" in hftests.STATE["outcomes"]
    for key in ("../x/f.py::Cls::t5", "/abs/g.py::Cls::t6"):
        del hftests.STATE["outcomes"][key]
    hftests.STATE["files"].clear()
    hftests.STATE["outcomes"].clear()
    hftests.STATE["errors"].clear()


def test_xdist_hook_declared_when_xdist_is_off(tmp_path: Path) -> None:
    """A conftest implementing xdist's pytest_configure_node (as transformers' does) runs under -p no:xdist."""
    (tmp_path / "conftest.py").write_text("def pytest_configure_node(node):\n    pass\n")
    (tmp_path / "test_suite.py").write_text("def test_plain():\n    assert True\n\ndef test_fails():\n    assert 1 == 2\n")
    record = _run(tmp_path)
    assert record["outcomes"] == {"test_suite.py::test_plain": "passed", "test_suite.py::test_fails": "failed"}
    assert record["errors"] == {"test_suite.py::test_fails": "assert 1 == 2"} and record["guard_errors"] == []


def test_guard_crash_and_false_alarm_are_recorded(monkeypatch) -> None:
    """A guard that crashes is a guard_error, a refusal that generate() then accepts a false alarm; both return."""
    import kvresume
    from kvresume.call import refuse
    cache = type("Cache", (), {"get_seq_length": lambda self: 3})()
    generate = hftests._guarded(lambda self, *a, **k: "out")
    for raised, key in [(RuntimeError("boom"), "guard_errors"), (refuse("positions", "m"), "false_alarms")]:
        def check(*args, _err=raised, **kwargs):
            raise _err
        monkeypatch.setattr(kvresume, "check_resume_inputs", check)
        before = len(hftests.STATE[key])
        assert generate(object(), past_key_values=cache) == "out" and len(hftests.STATE[key]) == before + 1
    assert hftests.STATE["guard_errors"][-1]["error"] == "RuntimeError: boom"
    assert hftests.STATE["false_alarms"][-1]["check"] == "positions"


def test_measured_set_names_the_whole_suites() -> None:
    """--files ROOT gives the documented run: tests/generation, the cache tests and 6 model suites, whole (no -k)."""
    value = hftests.measured_set("/src")
    assert value.count("/src/tests/") == 8 and "/src/tests/generation " in value and "-k" not in value
