"""The runner: one run, one record (run.json, run ids in results), interrupts that stop cleanly,
parameters refused before any kernel starts, failure lines naming the notebook's exception, and no
machine path in what a user shares. The end-to-end tests use notebooks 01 and 05 only."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import findings
from helpers.pipeline.run import params
from helpers.pipeline.run import batch, execute, procs, record
from helpers.pipeline.paths import repo_root

ROOT = repo_root()
NB01, NB05 = "01_identity_reconstruction", "05_hybrid_offloading_drift"
NOISE = ("Traceback", "ZMQ", "zmq", "DeadKernelError", "KeyboardInterrupt", "IPKernelApp")


def _cli(out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVKIT_OUTPUT_DIR": str(out)}
    return subprocess.run([sys.executable, "-m", "helpers.pipeline.run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _stale_results(out: Path, stem: str) -> None:
    """A results file of an earlier run that says everything reproduced."""
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{stem}.json").write_text(json.dumps({
        "notebook": stem, "run": {"run_id": "20000101T000000Z-0000", "started": "2000-01-01T00:00:00Z",
                                  "kit_commit": None, "kit_dirty": None},
        "environment": {}, "measurements": {},
        "claims": [{"id": "stale.claim", "statement": "old", "verdict": "reproduced", "reason": "old", "evidence": {}}]}))


def _no_machine_paths(out: Path) -> None:
    files = [out / "run.json", out / "timings.json", out / "SUMMARY.md", *(out / "results").glob("*.json"),
             *(out / "html").glob("*.html")]
    for path in [f for f in files if f.exists()]:
        text = path.read_text()
        for machine in (str(ROOT), str(out), str(out.parent)):
            assert machine not in text, f"{path.name} holds {machine}"


# --------------------------------------------------------------------------- parameters (no kernel)

REFUSALS = [
    (["-p", "dtype", "banana"], ["unknown dtype 'banana'", "float32", "bfloat16"]),
    (["-p", "seq_len", "0"], ["seq_len=0", "minimum 2"]),
    (["-p", "n_steps", "0"], ["n_steps=0", "minimum 2"]),
    (["-p", "batch_size", "0"], ["batch_size=0", "minimum 1"]),
    (["-p", "attn_implementation", "fastest"], ["unknown attn_implementation 'fastest'", "eager", "sdpa"]),
    (["-p", "colour", "red"], ["unknown parameter 'colour'", "model_id", "seq_len"]),
    (["-p", "seq_len", "many"], ["seq_len='many'", "integer"]),
]
if not params.cuda_status()[0]:
    REFUSALS.append((["-p", "device", "cuda"], ["device=cuda needs CUDA", "-p device cpu", "-p device auto"]))


@pytest.mark.parametrize("args,words", REFUSALS, ids=[" ".join(a[1:]) for a, _ in REFUSALS])
def test_bad_parameter_is_refused_in_one_line_before_any_kernel(tmp_path, args, words):
    start = time.perf_counter()
    proc = _cli(tmp_path, "run", "05", *args, timeout=60)
    seconds = time.perf_counter() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("refused: "), proc.stderr
    for word in words:
        assert word in lines[0]
    assert not (tmp_path / "notebooks").exists() and not (tmp_path / "run.json").exists()  # nothing started
    assert seconds < 4, f"refusal took {seconds:.1f}s"  # 2 s on a quiet machine; the CI box is shared


def test_parameters_go_only_to_the_notebooks_that_declare_them():
    nb01, nb05 = execute.find_notebook("01"), execute.find_notebook("05")
    per = params.check([nb01, nb05], {"seq_len": 8, "dtype": "bf16"})
    assert per[NB05] == {"seq_len": 8, "dtype": "bf16"} and per[NB01] == {"dtype": "bf16"}
    assert "model_id" in params.declared(nb01) and "sdpa" in params.attention_implementations()


def test_parameter_check_is_cheap():
    code = ("import sys, time; t = time.perf_counter(); from helpers.pipeline.run import execute, params; "
            "params.check(execute.notebooks(), {'dtype': 'float16', 'attn_implementation': 'eager'}); "
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == ["False", "False"] and float(out[0]) < 2


# --------------------------------------------------------------------------- pieces

def test_failure_line_names_the_notebooks_exception():
    from papermill.exceptions import PapermillExecutionError

    exc = PapermillExecutionError(3, 3, "import torchvision", "ImportError", "No module named 'torchvision'\nmore",
                                  ["...", "Please note that you may need to restart your runtime after installation."])
    assert execute.failure_line(exc) == "ImportError: No module named 'torchvision'"
    assert execute.failure_line(ValueError("bad\nworse")) == "ValueError: bad"


def test_interrupted_notebook_keeps_no_verdict(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"run": {"run_id": "A"}, "claims": [
        {"id": "x", "verdict": "reproduced", "reason": "ok", "evidence": {"v": 1}, "deciding": {"v": 1}},
        {"id": "y", "verdict": "error", "reason": "not reached", "evidence": {}}]}))
    assert not record.mark_interrupted(path, "B")  # another run's file is left alone
    assert record.mark_interrupted(path, "A")
    claims = _json(path)["claims"]
    assert {c["verdict"] for c in claims} == {"error"} and all("interrupted" in c["reason"] for c in claims)
    assert claims[0]["evidence"]["verdict_before_the_stop"] == "reproduced" and claims[0]["deciding"] == {}


def test_results_carry_the_run_stamp(tmp_path, monkeypatch):
    from helpers.results import Results

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    bare = Results("nb", {"c": "s"}, env={})
    assert _json(bare.path)["run"] == {"run_id": None, "started": None, "kit_commit": None, "kit_dirty": None}
    monkeypatch.setenv("KVKIT_RUN_ID", "R1")
    monkeypatch.setenv("KVKIT_RUN_STARTED", "2026-01-01T00:00:00Z")
    monkeypatch.setenv("KVKIT_KIT_COMMIT", "abc")
    monkeypatch.setenv("KVKIT_KIT_DIRTY", "false")
    stamped = Results("nb", {"c": "s"}, env={})
    assert _json(stamped.path)["run"] == {"run_id": "R1", "started": "2026-01-01T00:00:00Z", "kit_commit": "abc",
                                          "kit_dirty": False}


# --------------------------------------------------------------------------- real runs

@pytest.mark.e2e
def test_interrupted_run_all_stops_fast_and_says_so(tmp_path):
    out = tmp_path / "out"
    _stale_results(out, "03_rope_deltas_perturbation")
    # the last run's timings make 01 the longest, so it starts first (longest first) and 05 waits
    (out / "timings.json").write_text(json.dumps({"notebooks": [{"notebook": NB01, "ok": True, "seconds": 100.0}]}))
    env = {**os.environ, "KVKIT_OUTPUT_DIR": str(out)}
    proc = subprocess.Popen([sys.executable, "-m", "helpers.pipeline.run", "run-all", "--notebooks", "01", "05",
                             "--jobs", "1"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    results = out / "results" / f"{NB01}.json"
    deadline = time.monotonic() + 240
    while not results.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the first notebook's kernel has started once its results file exists
    assert proc.poll() is None, proc.communicate()
    workers = procs.descendants(proc.pid)
    servers = [p for p in psutil.Process(proc.pid).children() if "_zygote" in p.cmdline()]
    assert len(servers) == 1 and servers[0].children(), "the notebook's worker was not forked by the warm process"
    os.killpg(proc.pid, signal.SIGINT)
    start = time.monotonic()
    stdout, stderr = proc.communicate(timeout=30)
    stopped_in = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert stopped_in < 10, f"took {stopped_in:.1f}s to stop"
    assert not any(procs._alive(p) for p in workers), "a worker or kernel survived the interrupt"
    for noise in NOISE:
        assert noise not in stdout + stderr, (noise, stdout, stderr)

    run = _json(out / "run.json")
    assert run["status"] == "interrupted" and run["finished"] and run["command"] == "run-all"
    assert run["notebooks"][NB01]["status"] == "interrupted" and run["notebooks"][NB05]["status"] == "not_started"
    assert not (out / "results" / "03_rope_deltas_perturbation.json").exists(), "an earlier run's results survived"
    data = _json(results)
    assert data["run"]["run_id"] == run["run_id"]
    assert data["claims"] and all(c["verdict"] == "error" and "interrupted" in c["reason"] for c in data["claims"])
    summary = (out / "SUMMARY.md").read_text()
    assert "INTERRUPTED" in summary and "✅ reproduced" not in summary
    assert _json(out / "timings.json")["run_id"] == run["run_id"]
    _no_machine_paths(out)


@pytest.mark.e2e
def test_failing_single_run_after_a_full_run_shows_no_stale_claims(tmp_path):
    out = tmp_path / "out"
    full = _cli(out, "run-all", "--notebooks", "01")
    assert full.returncode == 0, full.stdout + full.stderr
    first = _json(out / "run.json")
    assert first["status"] == "complete" and first["notebooks"][NB01]["status"] == "ok"
    assert {c["verdict"] for c in _json(out / "results" / f"{NB01}.json")["claims"]} == {"reproduced"}
    assert (out / "html" / f"{NB01}.html").exists()
    timings = _json(out / "timings.json")
    assert timings["run_id"] == first["run_id"]
    assert {"kernel_start_s", "imports_s", "model_build_s", "experiments_s", "html_s"} <= set(timings["notebooks"][0]["phases"])
    for noise in NOISE:
        assert noise not in full.stdout + full.stderr, noise
    assert full.stdout.count(NB01) == 1  # once in the progress, with its time

    bad = _cli(out, "run", "01", "-p", "model_id", "tiny-does-not-exist")
    assert bad.returncode == 1
    run = _json(out / "run.json")
    assert run["command"] == "run" and run["status"] == "failed" and run["run_id"] != first["run_id"]
    assert list(run["notebooks"]) == [NB01] and run["notebooks"][NB01]["parameters"] == {"model_id": "tiny-does-not-exist"}
    assert run["notebooks"][NB01]["error"].startswith("ModelUnavailableError: ")
    data = _json(out / "results" / f"{NB01}.json")
    assert data["run"]["run_id"] == run["run_id"]
    assert {c["verdict"] for c in data["claims"]} == {"error"}
    summary = (out / "SUMMARY.md").read_text()
    assert run["run_id"] in summary and "✅ reproduced" not in summary.split("## Claim details")[0]
    _no_machine_paths(out)


@pytest.mark.e2e
def test_run_all_without_warm_processes_starts_plain_workers_and_kernels(tmp_path):
    """KVKIT_WARM_KERNELS=0: no fork server; each worker is a fresh Python and its kernel a plain ipykernel."""
    out = tmp_path / "out"
    env = {**os.environ, "KVKIT_OUTPUT_DIR": str(out), "KVKIT_WARM_KERNELS": "0"}
    done = subprocess.run([sys.executable, "-m", "helpers.pipeline.run", "run-all", "--notebooks", "01", "--no-report"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _json(out / "run.json")["notebooks"][NB01]["status"] == "ok"
    timings = _json(out / "timings.json")
    assert timings["run"]["warm_imports_s"] is None  # no warm process was started
    assert timings["notebooks"][0]["phases"]["imports_s"] > 0.5  # the kernel imported torch itself


def test_timings_are_handed_to_finish_timings_after_they_are_written(tmp_path, monkeypatch):
    """timings.json is written after SUMMARY.md and share.zip: the run passes it to share.finish_timings
    (which scrubs it and adds it to share.zip), once, after writing it."""
    from helpers.pipeline.report import share

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    seen = []
    monkeypatch.setattr(share, "finish_timings", lambda out=None: seen.append(json.loads((Path(out) / "timings.json").read_text())))
    nb = execute.find_notebook("01")
    run = batch.Run("run", [nb], {}, {}, 1)
    run.results[nb.stem] = execute.RunResult(nb.stem, True, 1.0, str(tmp_path / "notebooks" / nb.name), "", "ok", {"cells_s": 1.0})
    run.record.finish("complete")
    run._write_timings(2.0, 1.5, 0.1)
    assert len(seen) == 1 and seen[0]["run_id"] == run.record.run_id and seen[0]["notebooks"][0]["notebook"] == nb.stem
    run.tmp.rmdir()


def test_floor_is_warm_imports_plus_experiments_and_html_over_the_cores():
    from helpers.pipeline.run import schedule

    assert schedule.floor_seconds(5.3, {"experiments_s": 35.9, "html_s": 17.6, "kernel_start_s": 9.0}, 2) == 32.05
    assert schedule.floor_seconds(None, {"experiments_s": 3.0}, 1) == 3.0


def test_timings_state_the_floor_and_its_ratio(tmp_path, monkeypatch):
    from helpers.pipeline.report import share

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(share, "finish_timings", lambda out=None: None)
    nbs = [execute.find_notebook("01"), execute.find_notebook("05")]
    run = batch.Run("run-all", nbs, {}, {}, 2)
    for nb, (exp, html) in zip(nbs, [(1.0, 0.5), (9.0, 1.5)]):
        run.results[nb.stem] = execute.RunResult(nb.stem, True, exp + html, "", "", "ok",
                                                 {"kernel_start_s": 1.0, "experiments_s": exp, "html_s": html})
    run.warm_s = 4.0
    run.record.finish("complete")
    run._write_timings(12.0, 11.0, 0.1)
    floor = _json(tmp_path / "timings.json")["floor"]
    assert floor["seconds"] == 4.0 + (1.0 + 9.0 + 0.5 + 1.5) / 2 == 10.0 and floor["cores"] == 2
    assert floor["ratio"] == 1.2 and floor["start_order"][0] == "05_hybrid_offloading_drift"
    run.tmp.rmdir()


def test_longest_first_from_the_last_timings_else_the_static_estimate(tmp_path):
    from helpers.pipeline.run import schedule

    nbs = execute.notebooks()
    estimates = schedule.expected_seconds(nbs, tmp_path / "missing.json")
    static = schedule.longest_first(nbs, estimates)
    assert [estimates[nb.stem] for nb in static] == sorted(estimates.values(), reverse=True)
    assert estimates == {f.stem: f.estimate_s for f in findings.found()}  # each finding's own estimate
    rows = [{"notebook": nb.stem, "ok": True, "seconds": 1.0} for nb in nbs]
    rows[0]["seconds"] = 99.0
    rows[1].update(ok=False, seconds=500.0)  # a failed notebook's time says nothing: the estimate stands
    (tmp_path / "timings.json").write_text(json.dumps({"notebooks": rows}))
    expected = schedule.expected_seconds(nbs, tmp_path / "timings.json")
    order = schedule.longest_first(nbs, expected)
    assert order[0] == nbs[0] and expected[nbs[1].stem] == 5.0
    assert [nb for nb in order if expected[nb.stem] == 1.0] == [nb for nb in nbs if expected[nb.stem] == 1.0]  # ties: in order
    (tmp_path / "timings.json").write_text("not json")
    assert schedule.expected_seconds(nbs, tmp_path / "timings.json") == schedule.expected_seconds(nbs, None)


def test_workers_get_passive_openmp_waits_unless_set(monkeypatch):
    from helpers.pipeline.run import schedule

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert schedule.child_env(A="1")["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert schedule.child_env()["OMP_WAIT_POLICY"] == "ACTIVE"
