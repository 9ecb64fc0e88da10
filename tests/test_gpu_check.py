"""`make gpu-check`: its one-line refusals (before any environment is built), the GPU arms per release with
`python -m helpers.offload.gpu` (faked here), notebook 07's flash step only where papermill imports, the summary,
and the release environments' GPU probe and offline install from wheels/."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from helpers.pipeline.releases import envs
from helpers.pipeline.tools import gpu_check
from helpers.pipeline.paths import repo_root

REFUSALS = ("torch 2.13.0+cpu is a CPU-only build", "no GPU driver or device is present",
            "CUDA_VISIBLE_DEVICES hides every GPU", "torch is not installed")


def _no_work(*args, **kwargs):
    raise AssertionError("gpu-check did work after it should have refused")


@pytest.fixture()
def no_env(monkeypatch):
    monkeypatch.setattr(envs, "ensure_env", _no_work)


@pytest.mark.parametrize("why", REFUSALS)
def test_refuses_in_one_line_from_cuda_status_before_any_work(why, no_env, capsys):
    assert gpu_check.main([], cuda=(False, why), probe=_no_work, run=_no_work, flash=_no_work) == gpu_check.NO_CUDA
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"gpu-check: {why}; the GPU arms need CUDA, nothing was run."]


@pytest.mark.parametrize("probed, expected", [
    ((None, False, ""), "is a CPU-only build (torch.version.cuda is None)"),
    (("12.8", False, ""), "torch.cuda.is_available() is False in"),
    ((None, False, "ModuleNotFoundError: No module named 'torch'"), "torch does not import in"),
])
def test_refuses_in_one_line_when_the_pythons_torch_has_no_cuda(probed, expected, no_env, capsys):
    seen = []
    code = gpu_check.main([], cuda=(True, ""), probe=lambda py: seen.append(py) or probed, run=_no_work, flash=_no_work)
    assert code == gpu_check.NO_CUDA and seen == [sys.executable]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and expected in out[0] and out[0].endswith("nothing was run.")


def test_probe_refusal_passes_a_cuda_torch_with_a_device():
    assert gpu_check.probe_refusal("py", ("12.8", True, "")) == ""
    assert gpu_check.probe_refusal("py", ("12.8", False, "")) != ""


def test_torch_cuda_reads_this_pythons_torch():
    import torch

    version, available, error = gpu_check.torch_cuda(sys.executable)
    assert error == "" and version == torch.version.cuda and available == torch.cuda.is_available()
    assert gpu_check.torch_cuda("/nonexistent/python")[2]


def _arms(out: Path, verdict: str, seconds: float = 12.5) -> None:
    claims = [{"id": cid, "kind": "reproduces", "verdict": verdict, "reason": "r"} for cid in gpu_check.CLAIMS[:5]]
    (out / gpu_check.ARMS_FILE).write_text(json.dumps({
        "schema": "kvkit-gpu-arms/1", "release": out.name, "torch": "2.11.0+cu128", "device_name": "Fake GPU",
        "seconds": seconds, "settings": {}, "claims": claims, "tables": {}}))


def test_runs_the_gpu_arms_per_release_and_writes_the_summary(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    asked = []
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, modules=(): asked.append((release, modules))
                        or envs.ReleaseEnv(release, True, python=sys.executable))
    runs, flashes = [], []

    def fake_run(python, out, timeout, extra=()):
        runs.append(out)
        _arms(out, "reproduced" if out.name == "5.20.0" else "not_reproduced")
        return 0

    def fake_flash(python, out, timeout):
        flashes.append(out)
        if out.name != "5.20.0":
            return gpu_check.FLASH_SKIPPED  # papermill does not import there
        (out / "results").mkdir(exist_ok=True)
        (out / "results" / f"{gpu_check.FLASH_NOTEBOOK}.json").write_text(
            json.dumps({"claims": [{"id": gpu_check.FLASH_CLAIM, "verdict": "holds"}]}))
        return 0

    stale = tmp_path / "gpu" / "5.24.0" / gpu_check.ARMS_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"claims": [{"id": "offload.decode_drifts", "verdict": "stale"}]}))
    assert gpu_check.main(["--releases", "5.24.0", "5.20.0"], cuda=(True, ""), probe=lambda py: ("12.8", True, ""),
                          run=fake_run, flash=fake_flash) == 0
    pinned = envs.pinned_release()
    releases = [pinned, "5.20.0", "5.24.0"]
    assert asked == [(r, envs.GPU_MODULES) for r in releases]
    assert runs == flashes == [tmp_path / "gpu" / r for r in releases]
    summary = json.loads((tmp_path / "gpu" / "gpu-check.json").read_text())
    assert summary["schema"] == "kvkit-gpu-check/1" and summary["seconds"] >= 0
    rows = {row["release"]: row for row in summary["releases"]}
    assert rows["5.20.0"]["verdicts"]["offload.ordering_edge_removes_drift"] == "reproduced"
    assert rows["5.20.0"]["verdicts"][gpu_check.FLASH_CLAIM] == "holds"
    assert rows[pinned]["verdicts"][gpu_check.FLASH_CLAIM] == gpu_check.FLASH_SKIPPED
    assert rows["5.24.0"]["verdicts"]["offload.decode_drifts"] == "not_reproduced"  # not the stale file
    assert rows["5.20.0"]["arms"]["seconds"] == 12.5 and rows["5.20.0"]["arms"]["device_name"] == "Fake GPU"
    assert all("seconds" in row and "arms_seconds" in row for row in rows.values())
    assert str(tmp_path) not in json.dumps(summary)
    out = capsys.readouterr().out
    assert f"  {gpu_check.FLASH_CLAIM}: {gpu_check.FLASH_SKIPPED}" in out
    assert "  offload.record_stream_removes_drift: no result" in out  # the fake wrote only five claims
    assert "transformers 5.20.0: ok in" in out and "on Fake GPU -> gpu/5.20.0/gpu-arms.json" in out
    assert "gpu-check: 3 release(s) in" in out


def test_a_release_environment_without_cuda_torch_runs_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, modules=(): envs.ReleaseEnv(
        release, True, python="/envs/other/python"))
    row = gpu_check.check_release("5.20.0", 10, run=_no_work, flash=_no_work, probe=lambda py: (None, False, ""),
                                  log=lambda *a, **k: None)
    assert not row["environment_ok"] and "CPU-only build" in row["reason"] and row["rc"] is None
    assert not gpu_check.release_ok(row) and "no result" not in row["verdicts"]


def test_a_refusing_or_failing_arms_run_fails_gpu_check():
    row = {"environment_ok": True, "rc": 0, "flash_rc": None, "reason": ""}
    assert gpu_check.release_ok(row) and gpu_check._status(row) == "ok"
    assert not gpu_check.release_ok({**row, "rc": 2}) and "refused" in gpu_check._status({**row, "rc": 2})
    assert not gpu_check.release_ok({**row, "flash_rc": 1}) and "notebook 07 exit 1" in gpu_check._status({**row, "flash_rc": 1})


def test_the_arms_and_flash_commands(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, cwd=None, env=None, timeout=None, **kw):
        calls.append((cmd, cwd, env))
        return subprocess.CompletedProcess(cmd, 0 if "import papermill" not in cmd else 1)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert gpu_check.run_arms("/env/python", tmp_path, 10) == 0
    cmd, cwd, env = calls[0]
    assert cmd == ["/env/python", "-m", "helpers.offload.gpu", "--out", str(tmp_path), "--dtypes", "float32", "bfloat16"]
    assert cwd == str(repo_root()) and env["PYTHONPATH"] == str(repo_root()) and env["KVKIT_OUTPUT_DIR"] == str(tmp_path)
    assert gpu_check.run_flash("/env/python", tmp_path, 10) == gpu_check.FLASH_SKIPPED  # papermill does not import
    monkeypatch.setattr(gpu_check, "has_papermill", lambda python: True)
    assert gpu_check.run_flash("/env/python", tmp_path, 10) == 0
    assert calls[-1][0] == ["/env/python", "-m", "helpers.pipeline.run", "run", "07", *gpu_check.FLASH_ARGS]


def test_makefile_gpu_check_needs_no_env_for_another_python():
    text = (repo_root() / "Makefile").read_text()
    assert "\ngpu-check: ##" in text and "GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)" in text
    assert "pip download -q --no-deps --only-binary=:all: -d wheels/ $$w" in text
    assert "GPU_WHEELS ?= transformers==5.17.0 transformers==5.20.0" in text  # both releases, one download each
    assert "wheels/" in (repo_root() / ".gitignore").read_text().splitlines()


def test_child_processes_import_helpers_from_this_checkout(monkeypatch):
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere")
    env = envs.child_env()
    assert env["PYTHONPATH"] == str(repo_root()) and "VIRTUAL_ENV" not in env


def test_the_gpu_probe_needs_no_jupyter():
    assert not {"papermill", "nbconvert"} & set(envs.GPU_MODULES)
    with pytest.raises(RuntimeError, match="no_such_module_kvkit"):
        envs._probe(sys.executable, ("no_such_module_kvkit",))


def test_wheels_folder_with_the_release_makes_pip_install_offline(monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "wheels_dir", lambda: tmp_path / "wheels")
    assert envs.wheel_args("5.20.0") == []
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "transformers-5.24.0-py3-none-any.whl").write_bytes(b"")
    assert envs.wheel_args("5.20.0") == []
    (tmp_path / "wheels" / "transformers-5.20.0-py3-none-any.whl").write_bytes(b"")
    assert envs.wheel_args("5.20.0") == ["--no-index", "--find-links", str(tmp_path / "wheels")]


def test_build_env_passes_the_offline_options_to_every_pip_call(monkeypatch, tmp_path):
    monkeypatch.setattr(envs, "wheels_dir", lambda: tmp_path / "wheels")
    monkeypatch.setattr(envs, "venvs_dir", lambda: tmp_path / "venvs")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "transformers-5.20.0-py3-none-any.whl").write_bytes(b"")
    site = tmp_path / "site"
    (site / "transformers-5.20.0.dist-info").mkdir(parents=True)  # what pip installed into the release's own site
    (site / "transformers-5.20.0.dist-info" / "METADATA").write_text("Name: transformers\nVersion: 5.20.0\n")
    pips = []

    def fake_run(cmd, timeout=900):
        if "pip" in cmd:
            pips.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, str(site) if "sysconfig" in cmd[-1] else "", "")

    monkeypatch.setattr(envs, "_run", fake_run)
    env = envs.ReleaseEnv("5.20.0", ok=False)
    envs._build_env("5.20.0", env, lambda *a, **k: None, envs.GPU_MODULES)
    offline = ["--no-index", "--find-links", str(tmp_path / "wheels")]
    assert len(pips) == 1 and pips[0][len(envs.PIP) + 1:len(envs.PIP) + 4] == offline
    assert env.installed == ["transformers==5.20.0"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> str:
    """A folder with transformers 5.20.0's wheel: wheels/ where `make gpu-wheels` filled it, else downloaded here
    from PyPI as `make gpu-wheels` does (so CI runs the offline install path too)."""
    if any((repo_root() / "wheels").glob("transformers-5.20.0-*.whl")):
        return str(repo_root() / "wheels")
    folder = tmp_path_factory.mktemp("wheels")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder),
           "transformers==5.20.0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"PyPI unreachable, no transformers 5.20.0 wheel: {done.stderr.strip()[-300:]}")
    return str(folder)


@pytest.fixture(scope="module")
def offline_venvs(tmp_path_factory, wheels) -> dict:
    """5.20.0's environment built from the wheels alone, network refused (the device's case); built once, and the
    end-to-end run below finds it there as a second gpu-check on the device would."""
    folder = tmp_path_factory.mktemp("venvs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVKIT_WHEELS", wheels)
        mp.setenv("KVKIT_RELEASE_VENVS", str(folder))
        mp.setenv("PIP_NO_INDEX", "1")
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):  # any network use fails at once
            mp.setenv(name, "http://127.0.0.1:9")
        start = time.perf_counter()
        env = envs.ensure_env("5.20.0", lambda *a, **k: None, modules=envs.GPU_MODULES)
        print(f"\noffline 5.20.0 environment from wheels/: {time.perf_counter() - start:.1f} s")
    return {"folder": folder, "env": env}


@pytest.mark.e2e
def test_release_environment_installs_offline_from_wheels(offline_venvs):
    env, folder = offline_venvs["env"], offline_venvs["folder"]
    assert env.ok, env.reason
    assert env.versions["transformers"] == "5.20.0" and env.python.startswith(str(folder))
    assert env.installed[0] == "transformers==5.20.0"
    assert os.path.exists(os.path.join(folder, "5.20.0", envs.STAMP))


def test_simulate_skips_the_refusal_and_passes_simulate_to_the_arms(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, modules=(): envs.ReleaseEnv(
        release, True, python="/envs/other/python"))
    cmds = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: cmds.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert gpu_check.main(["--simulate"], cuda=(False, "torch 2.13.0+cpu is a CPU-only build")) == 0
    assert cmds and all(c[1:3] == ["-m", gpu_check.ARMS_MODULE] and c[-1] == "--simulate" for c in cmds)
    assert "regress.flash_attention_2_matches_sdpa: skipped: simulated run" in capsys.readouterr().out


@pytest.mark.e2e
def test_gpu_check_end_to_end_on_cpu_under_stand_ins(monkeypatch, tmp_path, capsys, wheels, offline_venvs):
    monkeypatch.setenv("KVKIT_WHEELS", wheels)
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("KVKIT_RELEASE_VENVS", str(offline_venvs["folder"]))  # built from the wheels by the fixture
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    start = time.perf_counter()
    done = run_device_command(tmp_path, simulate=True, wheels=wheels)  # the documented device command, --simulate appended
    assert "gpu-check exit 0" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "OUT" / "gpu-check.json").read_text())
    with tarfile.open(tmp_path / "OUT" / "gpu.tgz") as tar:
        names = tar.getnames()
        for release in (envs.pinned_release(), "5.20.0"):  # every arm written as it finished, per release
            arms_log = tar.extractfile(f"kvkit-gpu/{release}/arms.jsonl").read().decode().splitlines()
            assert arms_log and all(json.loads(line)["steps"] for line in arms_log), names
    assert len(list((tmp_path / "OUT").iterdir())) <= 8
    assert [r["release"] for r in summary["releases"]] == [envs.pinned_release(), "5.20.0"]
    for row in summary["releases"]:
        assert row["arms"]["schema"] == "kvkit-gpu-arms/1" and row["arms"]["release"] == row["release"], row
        assert row["verdicts"].get("offload.prefill_identical"), row
    assert summary["releases"][1]["lag_from"] == envs.pinned_release()  # the second release ran under the first's lag
    assert summary["claims"][0]["evidence"]["same_lag"] is True and summary["claims"][0]["reason"].startswith("[simulated")
    print(f"\ngpu-check --simulate: {time.perf_counter() - start:.0f} s")


def device_command() -> str:
    """The one device command of docs/gpu-check.md (between its device-command markers)."""
    text = (repo_root() / "docs" / "gpu-check.md").read_text()
    block = text.split("<!-- device-command -->", 1)[1].split("<!-- /device-command -->", 1)[0]
    return block.strip().strip("`").strip()


def run_device_command(tmp_path: Path, simulate: bool = False, python: str = sys.executable,
                       wheels: str = "") -> subprocess.CompletedProcess:
    """The documented command under bash, as on the device: $OUT and TMPDIR in `tmp_path`, GPU_PY `python`; the
    wheels from `wheels` where given (a fresh clone has no wheels/: the fixture downloaded them elsewhere)."""
    cmd = device_command()
    if wheels:
        assert 'KVKIT_WHEELS="$PWD/wheels"' in cmd
        cmd = cmd.replace('KVKIT_WHEELS="$PWD/wheels"', f'KVKIT_WHEELS="{wheels}"')
    if simulate:  # the CPU simulation on a shared 2-core machine is slower than the device: wider limits, same command
        cmd = (cmd.replace("--timeout 200 --budget 540", "--timeout 800 --budget 1600 --simulate")
                  .replace("timeout -k 10 570", "timeout -k 10 1700"))
        assert "--simulate" in cmd and "timeout -k 10 1700" in cmd
    (tmp_path / "OUT").mkdir(exist_ok=True)
    env = {**os.environ, "OUT": str(tmp_path / "OUT"), "TMPDIR": str(tmp_path), "GPU_PY": python}
    return subprocess.run(["bash", "-c", cmd], cwd=str(repo_root()), env=env, capture_output=True, text=True, timeout=1800)


def test_the_device_command_needs_no_make_and_bounds_itself():
    cmd = device_command()
    assert "\n" not in cmd and len(cmd) < 2000 and "make" not in cmd.split()
    for needle in ("timeout -k 10 570", "PYTHONUNBUFFERED=1", " -u -m helpers.pipeline.tools.gpu_check", 'KVKIT_WHEELS="$PWD/wheels"',
                   "--budget 540", '"${GPU_PY:-python3}"', '"$OUT/gpu.tgz"'):
        assert needle in cmd, needle


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_the_device_command_refuses_in_one_line_without_cuda(tmp_path):
    done = run_device_command(tmp_path)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-check: ") and lines[0].endswith("the GPU arms need CUDA, nothing was run."), done.stdout
    assert "gpu-check exit 2" in lines
    out = list((tmp_path / "OUT").iterdir())
    assert [p.name for p in out] == ["gpu.tgz"] and len(out) <= 8


def _arms_with_steps(out: Path, release: str, drift: bool, sleep: int = 1000, runs=None) -> None:
    key = {"loop": "report", "model": "tiny hybrid", "dtype": "bfloat16"}
    steps = [{**key, "variant": "offloading=True", "step": s, "differs": drift and s > 0} for s in range(3)]
    out.mkdir(parents=True, exist_ok=True)
    (out / gpu_check.ARMS_FILE).write_text(json.dumps({
        "schema": "kvkit-gpu-arms/1", "release": release, "claims": [],
        "settings": {"models": ["tiny hybrid"], "dtypes": ["float32", "bfloat16"], "runs": runs or [["tiny hybrid", "bfloat16", ["report"]]]},
        "tables": {"steps": steps, "states_differing": [], "calibration": [
            {"model": "tiny hybrid", "dtype": "bfloat16", "sleep_cycles_used": sleep}]}}))


def test_one_folder_the_lag_of_the_first_release_a_timed_out_step_and_the_cross_release_claim(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print, modules=(): envs.ReleaseEnv(release, True, python=sys.executable))
    seen = {}

    def fake_run(python, out, timeout, extra=()):
        seen[out.name] = extra
        if out.name == "5.24.0":
            return gpu_check.TIMED_OUT  # a hang: this step is lost, not the others
        _arms_with_steps(out, out.name, drift=out.name != "5.20.0")
        return 0

    root = tmp_path / "all"
    code = gpu_check.main(["--out", str(root), "--releases", "5.24.0", "--timeout", "60"], cuda=(True, ""),
                          probe=lambda py: ("12.8", True, ""), run=fake_run, flash=lambda python, out, timeout: gpu_check.FLASH_SKIPPED)
    assert code == 1  # 5.24.0 timed out
    pinned = envs.pinned_release()
    assert seen[pinned] == () and seen["5.20.0"] == ("--lag-from", str(root / pinned / gpu_check.ARMS_FILE))
    assert sorted(p.name for p in root.iterdir()) == sorted(["5.20.0", "5.24.0", pinned, "gpu-check.json", "plan.txt"])
    summary = json.loads((root / "gpu-check.json").read_text())
    assert summary["step_timeout_s"] == 60 and summary["plan"]["step_timeout_s"] == 60
    rows = {r["release"]: r for r in summary["releases"]}
    assert rows["5.20.0"]["lag_from"] == pinned and rows["5.24.0"]["rc"] == gpu_check.TIMED_OUT
    (claim,) = summary["claims"]
    assert claim["id"] == "offload.drift_only_without_ordering_edge" and claim["verdict"] == "holds", claim
    out = capsys.readouterr().out
    assert "transformers 5.24.0: the GPU arms timed out" in out and "offload.drift_only_without_ordering_edge: holds" in out
    assert "-> all/gpu-check.json" in out and str(tmp_path) not in json.dumps(summary)


def test_the_cross_release_claim_from_contradicting_results(tmp_path):
    from helpers.offload import gpu

    def load(release, drift, **kw):
        _arms_with_steps(tmp_path / release, release, drift, **kw)
        return json.loads((tmp_path / release / gpu_check.ARMS_FILE).read_text())

    assert gpu.releases_claim(load("a", True), load("b", False))["verdict"] == "holds"
    assert gpu.releases_claim(load("a", True), load("b", True))["verdict"] == "fails"  # drift with the edge too
    assert gpu.releases_claim(load("a", False), load("b", False))["verdict"] == "fails"  # no drift to remove
    other_lag = gpu.releases_claim(load("a", True), load("b", False, sleep=2000))
    assert other_lag["verdict"] == "skipped" and "different lag" in other_lag["reason"]
    other_models = gpu.releases_claim(load("a", True), load("b", False, runs=[["tiny dense", "bfloat16", ["report"]]]))
    assert other_models["verdict"] == "skipped" and "different models" in other_models["reason"]
    assert gpu.releases_claim({}, load("b", False))["verdict"] == "skipped"


def test_a_step_gets_what_is_left_of_the_budget():
    now = time.monotonic()
    assert gpu_check.step_timeout(200, None) == 200
    assert 90 < gpu_check.step_timeout(200, now + 100) <= 100
    assert gpu_check.step_timeout(200, now + 5) == 0.0  # less than MIN_STEP_S left: not started
    assert gpu_check._step(lambda *a: 0, "py", Path("."), 200, now + 1)[0] == "skipped: the budget was spent"


def test_a_timed_out_step_keeps_its_log(tmp_path):
    code = gpu_check._call([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(30)"], None, 2,
                           tmp_path / "arms.log")
    assert code == gpu_check.TIMED_OUT and "timed out after 2 s" in (tmp_path / "arms.log").read_text()


def test_gpu_plan_prints_the_plan_without_cuda(capsys):
    from helpers.pipeline.tools import gpu_plan

    assert gpu_plan.main(["--timeout", "150"]) == 0
    out = capsys.readouterr().out
    for needle in ("report layout (64): 64 layers, 48 linear_attention / 16 full_attention", "run report layout (64) bfloat16: loops report",
                   "offloading=True (unlagged): unlagged", "pool poisoning:", "1024.0", "per-step timeout: 150 s", "minutes in all"):
        assert needle in out, needle
    from helpers.offload import gpu

    for cid in (*gpu.CUDA_CLAIMS, "offload.drift_only_without_ordering_edge"):
        line = next(l for l in out.splitlines() if l.strip().startswith(cid + ":"))
        if cid in gpu.BY_CONSTRUCTION:
            assert "can fail: no (by construction: " in line, line
        else:
            assert "can fail: yes; decides " in line and "fed by " in line, line
    for cid in ("offload.ordering_edge_removes_drift", "offload.block_overwritten_under_pending_read", "offload.unlagged_run_drifts"):
        assert "64-layer" in next(l for l in out.splitlines() if cid in l)  # the 64-layer arms feed them


def test_makefile_gpu_plan_and_the_step_timeout():
    text = (repo_root() / "Makefile").read_text()
    assert "\ngpu-plan: ##" in text and "--timeout $(GPU_STEP_TIMEOUT)" in text
