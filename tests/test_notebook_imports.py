"""What a notebook loads: its cells' imports and its results file's opening (helpers.results, as session.start does)
load its finding's package, the shared helpers/ tools and the output paths; never the report
(helpers.pipeline.report), bisect, a source's Ask writer (ask.py) or another finding's declaration. Another finding's
measuring code only where the notebook or its package imports it by name (08 measures the kit's own resume calls)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import findings
from helpers.pipeline.paths import repo_root

ROOT = repo_root()
# One interpreter for every notebook (torch imported once): each notebook starts with no helpers module loaded.
PROBE = r'''
import ast, json, sys, tempfile
from pathlib import Path

out = {}
for path in sys.argv[1:]:
    for name in [m for m in sys.modules if m == "helpers" or m.startswith("helpers.")]:
        del sys.modules[name]
    cells = [c for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]
    imports = []
    for cell in cells:
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:  # a cell with IPython syntax imports nothing of the kit
            continue
        imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    exec("\n".join(imports), {})
    from helpers.results import Results
    Results(Path(path).stem, {}, env={"probe": True}, path=Path(tempfile.mkdtemp()) / "results.json")
    out[Path(path).stem] = sorted(m for m in sys.modules if m.startswith("helpers."))
print(json.dumps(out))
'''


def _packages() -> dict[str, str]:
    """Each notebook's finding package: its stem -> the folder holding its finding.py (from the declarations)."""
    return {findings.of(stem).stem: path.parent.name for _, path in findings._modules("finding")
            for stem in [_stem(path)]}


def _stem(path: Path) -> str:
    """A declaration's `stem=`, read without importing it."""
    return next(str(k.value.value) for k in ast.walk(ast.parse(path.read_text()))
                if isinstance(k, ast.keyword) and k.arg == "stem")


def _named(stem: str, package: str, packages: set[str]) -> set[str]:
    """The finding packages the notebook's cells or its own package's modules import by name."""
    texts = ["".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    texts += [p.read_text() for p in (ROOT / "helpers" / package).glob("*.py")]
    return {p for p in packages for t in texts if f"helpers.{p} import" in t or f"from ..{p}" in t}


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    notebooks = sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb"))
    run = subprocess.run([sys.executable, "-c", PROBE, *notebooks], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_a_notebook_loads_its_finding_the_tools_and_the_paths_only(loaded):
    packages = _packages()
    assert sorted(loaded) == sorted(packages), "every notebook probed, each with its finding package"
    for stem, mods in loaded.items():
        mine = packages[stem]
        assert f"helpers.{mine}.finding" in mods, f"{stem}: its results file reads its own declaration"
        bad = [m for m in mods if m.startswith(("helpers.pipeline.report", "helpers.pipeline.bisect")) or m.endswith(".ask")
               or (m.endswith(".finding") and m != f"helpers.{mine}.finding")]
        assert not bad, f"{stem} loads {bad}"
        others = {m.split(".")[1] for m in mods if m.split(".")[1] in set(packages.values()) - {mine}}
        assert others <= _named(stem, mine, set(packages.values())), f"{stem} loads other findings' code unnamed: {others}"
        pipeline = [m for m in mods if m.startswith("helpers.pipeline.")]
        assert all(m.startswith(("helpers.pipeline.paths", "helpers.pipeline.run")) for m in pipeline), \
            f"{stem}: of the pipeline only the output paths and the run stamp, not {pipeline}"
