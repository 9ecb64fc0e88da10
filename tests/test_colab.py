"""Colab, played offline: a fresh virtual environment holding only what Colab ships (its torch build, numpy,
pandas, matplotlib, ...: here this environment's copies, laid in by tests/venvs.py) and Colab's older jupyter
stack, a stand-in `google.colab` imported at kernel start, KVKIT_REPO pointing at a bare clone of the committed
tree (HEAD: commit before running this), a /content-like working directory. Notebook 01 is executed as a Colab
user opens it: its own first cell installs the kit, then the rest runs on the tiny default. Packages come from
PyPI through pip's cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.pipeline.tools import colab
from helpers.pipeline.paths import repo_root
from helpers.pipeline.releases.envs import pinned_release
from helpers.results import verdict_for
from venvs import fresh_venv  # tests/ is on sys.path

ROOT = repo_root()
NOTEBOOK = "01_identity_reconstruction"
# What Colab ships besides its jupyter stack (its own transformers too: left out, for the cell to install).
COLAB_SHIPS = ["torch", "numpy", "pandas", "matplotlib", "pillow", "requests", "tqdm"]
# Colab's preinstalled jupyter stack (older than the latest releases, as Colab's is): the cell must leave it alone.
COLAB_JUPYTER = ["ipykernel==6.17.1", "ipython==7.34.0", "jupyter_client==7.4.9"]
WATCHED = ["torch", "ipykernel", "ipython", "jupyter_client", "jupyter_core", "traitlets", "tornado", "pyzmq"]
NOT_FOR_COLAB = ["papermill", "pytest", "nbconvert", "nbclient"]
KERNEL_START = "import google.colab; from ipykernel.kernelapp import launch_new_instance; launch_new_instance()"
PROBE = """import json, sys
from importlib import metadata, util
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
names = sys.argv[1:]
spec = util.find_spec("torch")
print(json.dumps({"versions": {n: version(n) for n in names}, "torch_file": spec and spec.origin,
                  "helpers": bool(util.find_spec("helpers"))}))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the kit's own paths and variables (nothing of the kit leaks in),
    with pip's byte-compiling off (pip's cache is kept: packages come from PyPI once)."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JUPYTER_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("KVKIT_")}
    return {**env, "PIP_COMPILE": "0", **extra}  # no byte-compiling at install (PIP_NO_COMPILE=1 would turn it on)


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run cmd, failing the test with its output's tail."""
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{cmd[:4]} exited {out.returncode}:\n{(out.stdout + out.stderr)[-4000:]}"
    return out


def probe(python: Path, cwd: Path) -> dict:
    """Versions of the watched packages, torch's file and whether `helpers` imports, in that python."""
    return json.loads(sh([str(python), "-c", PROBE, *WATCHED, *NOT_FOR_COLAB, "transformers"], cwd=cwd,
                         env=clean_env()).stdout)


@pytest.fixture(scope="session")
def colab_machine(tmp_path_factory) -> dict:
    """The fresh environment, stand-in module, kernelspec, bare clone and /content folder (built once)."""
    tmp = tmp_path_factory.mktemp("colab")
    started = time.monotonic()
    python = fresh_venv(tmp / "venv", COLAB_SHIPS, clean_env())  # this environment's files, linked in
    sh([str(python), "-m", "pip", "install", "-q", *COLAB_JUPYTER], env=clean_env())
    stub = tmp / "colab-stub" / "google" / "colab"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""Stand-in for Colab\'s google.colab (its presence is what the cell tests)."""\n')
    spec = tmp / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-c", KERNEL_START, "-f", "{connection_file}"], "display_name": "Colab stand-in",
        "language": "python", "env": {"PYTHONPATH": str(tmp / "colab-stub")}}))
    bare = tmp / "kit.git"
    sh(["git", "init", "-q", "--bare", str(bare)])
    sh(["git", "-C", str(bare), "config", "receive.shallowUpdate", "true"])  # a shallow checkout pushes too
    sh(["git", "-C", str(ROOT), "push", "-q", str(bare), "HEAD:refs/heads/main"])
    sh(["git", "-C", str(bare), "symbolic-ref", "HEAD", "refs/heads/main"])
    content = tmp / "content"
    content.mkdir()
    return {"tmp": tmp, "python": python, "bare": bare, "content": content, "setup_s": time.monotonic() - started}


@pytest.fixture(scope="session")
def colab_run(colab_machine) -> dict:
    """Notebook 01 from the committed tree, executed in the Colab stand-in: first cell, then the rest."""
    m = colab_machine
    tmp, content = m["tmp"], m["content"]
    before = probe(m["python"], tmp)
    opened = tmp / f"{NOTEBOOK}.ipynb"  # what Colab opens from GitHub: the committed notebook
    opened.write_text(sh(["git", "-C", str(m["bare"]), "show", f"main:notebooks/{NOTEBOOK}.ipynb"]).stdout)
    executed = tmp / f"{NOTEBOOK}.executed.ipynb"
    env = clean_env(JUPYTER_PATH=str(tmp / "jupyter"), KVKIT_REPO=f"file://{m['bare']}",
                    KVKIT_DIR=str(content / "kv-resume-kit"), PATH=f"{m['python'].parent}:{os.environ['PATH']}")
    started = time.monotonic()
    sh([sys.executable, "-m", "papermill", "-k", "colab", "--cwd", str(content), str(opened), str(executed)],
       env=env, timeout=1200)
    run_s = time.monotonic() - started
    after = probe(m["python"], tmp)
    report = subprocess.run([str(m["python"]), "-m", "helpers.pipeline.run", "report"], cwd=content,
                            capture_output=True, text=True, env=clean_env())
    print(f"\ncolab e2e: environment {m['setup_s']:.0f} s, first cell + notebook {run_s:.0f} s")
    return {**m, "before": before, "after": after, "opened": opened, "executed": executed, "report": report}


@pytest.mark.e2e
def test_colab_cell_keeps_torch_and_the_jupyter_stack(colab_run):
    before, after = colab_run["before"], colab_run["after"]
    assert not before["helpers"] and before["versions"]["transformers"] is None, "the fresh environment has nothing of the kit"
    assert [f"{n}=={before['versions'][n]}" for n in ("ipykernel", "ipython", "jupyter_client")] == COLAB_JUPYTER
    assert before["versions"]["torch"] == after["versions"]["torch"] and before["torch_file"] == after["torch_file"]
    for name in WATCHED:
        assert after["versions"][name] == before["versions"][name], f"the Colab cell changed {name}"
    assert {n: after["versions"][n] for n in NOT_FOR_COLAB} == dict.fromkeys(NOT_FOR_COLAB), "dev tools installed in Colab"
    assert after["versions"]["transformers"] == pinned_release()


@pytest.mark.e2e
def test_colab_cell_installs_the_kit_non_editable(colab_run):
    import nbformat

    first = colab.first_code_cell(json.loads(colab_run["opened"].read_text()))
    source = first["source"] if isinstance(first["source"], str) else "".join(first["source"])
    assert source == colab.cell_source(), "the committed notebook's cell is the template"
    python, content = colab_run["python"], colab_run["content"]
    where = sh([str(python), "-c", "import helpers.pipeline, helpers.offload; print(helpers.__file__)"], cwd=colab_run["tmp"],
               env=clean_env()).stdout.strip()
    assert "site-packages" in where and not where.startswith(str(content)), where
    executed = nbformat.read(colab_run["executed"], as_version=4)
    assert all(not c.get("outputs") or c.outputs[0].get("output_type") != "error" for c in executed.cells)
    keep = (content / "kv-resume-kit" / "colab-keep.txt").read_text().splitlines()
    assert f"torch=={colab_run['after']['versions']['torch']}" in keep


@pytest.mark.e2e
def test_colab_outputs_land_in_the_working_directory(colab_run):
    out = colab_run["content"] / "outputs"
    data = json.loads((out / "results" / f"{NOTEBOOK}.json").read_text())
    assert data["claims"] and data["environment"]["transformers"] == pinned_release()
    for claim in data["claims"]:
        assert claim["verdict"] == verdict_for(claim["kind"], True), claim
    assert list((out / "figures").glob(f"{NOTEBOOK}-*.png")), "no figure under outputs/figures"
    assert colab_run["report"].returncode == 0, colab_run["report"].stderr[-2000:]
    assert "identity.kv_bitwise_equal" in (out / "SUMMARY.md").read_text()  # `kvkit report` in a Colab cell
    assert not (colab_run["content"] / "kv-resume-kit" / "outputs" / "results").exists()


def test_write_replaces_only_the_first_code_cell_and_is_idempotent(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("old cell"),
                                         nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    assert colab.main(["--check", str(path)]) == 1
    assert colab.main(["--write", str(path)]) == 0
    once = path.read_text()
    assert colab.main(["--check", str(path)]) == 0 and colab.main(["--write", str(path)]) == 0 and path.read_text() == once
    cells = nbformat.read(path, as_version=4).cells
    assert cells[1].source == colab.cell_source() and [cells[0].source, cells[2].source] == ["# t", "x = 1"]


def test_readme_badges_follow_the_repository_address():
    text = f"| [01_a](x) | {colab.badge('01_a', 'https://github.com/old/name')} |"
    assert colab.render_readme(text, "https://github.com/new/kit") == f"| [01_a](x) | {colab.badge('01_a', 'https://github.com/new/kit')} |"
    assert "KVKIT_DIR" in colab.cell_source() and colab.CLONE_DIR == "/content/kv-resume-kit"
