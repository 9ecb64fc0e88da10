"""Each finding declares itself once (helpers.findings): the declarations are complete, every list derives from them,
and a new notebook is its own few files: a scratch finding built in tmp shows up in every derived list."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from helpers import findings, quotes
from helpers.findings import Decisions, DeclarationError, Finding
from helpers.pipeline.paths import repo_root
from helpers.pipeline.report import asks, sources

ROOT = repo_root()


def test_every_notebook_and_only_they_declare_a_finding():
    assert [f.stem for f in findings.found()] == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")), \
        "each notebook declares one FINDING: see docs/adding-a-finding.md"
    assert len({f.number for f in findings.found()}) == len(findings.found()) == len(findings.prefixes())


@pytest.mark.parametrize("finding", findings.found(), ids=lambda f: f.stem)
def test_a_declaration_names_what_exists(finding):
    assert finding.source in sources.SOURCES and (ROOT / finding.repro).is_file(), \
        f"{finding.stem}: its source entry and repro file (docs/adding-a-finding.md)"
    assert all(name.startswith("transformers.") for name in finding.functions)
    assert set(finding.kinds().values()) <= set(quotes.ROLES)
    for cid, q in finding.claims.items():  # every claim has a quote: text from a source, or (environment) none
        assert isinstance(q, quotes.Quote) and cid.startswith(finding.prefix + ".")
        assert (q.text and q.source) or q.role == "machine", cid
    assert finding.ask.__module__ == asks.__name__ and finding.estimate_s > 0


def test_every_source_has_one_ask_writer():
    for key in sources.SOURCES:
        named = {f.ask for f in findings.found() if f.source == key}
        assert len(named) == 1, f"source {key}: Ask writers {named}"


def _defines_decisions(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("decide_") for n in tree.body)


def test_every_decisions_module_is_declared_mutated_and_has_kill_cases():
    from helpers.pipeline.tools import mutants

    declared = {d.module for d in findings.decisions()}
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "helpers").rglob("*decisions.py")}
    assert files and files <= declared, f"deciding modules no finding declares: {sorted(files - declared)}"
    # hazards and ordering decide the CPU record's tables: mutated and killed in their own tests, no CASES table yet
    loose = {"helpers/offload/hazards.py", "helpers/offload/ordering.py"}
    others = {str(p.relative_to(ROOT)) for p in (ROOT / "helpers").rglob("*.py") if _defines_decisions(p)} - loose
    assert others <= declared, sorted(others - declared)
    scoped = {s.module: s for s in mutants.SCOPE}
    for d in findings.decisions():
        assert d.kill in scoped[d.module].tests and (ROOT / d.kill).is_file(), d.module
        assert "CASES" in (ROOT / d.kill).read_text(), f"{d.kill} has no CASES table"


def _scratch(**override) -> Finding:
    fields = dict(stem="99_scratch", title="Scratch", source="control",
                  claims={"scratch.holds": quotes.passage(quotes.CONTROL, "extends", quotes.SLICED)}, ask=asks.control,
                  bisect="scratch.holds", functions=("transformers.cache_utils.Cache.update",),
                  repro="examples/repro/scratch.py", decisions=(Decisions("scratchkit/zz/decisions.py", ("decide_*",),
                                                                          "tests/test_kill_scratch.py"),),
                  estimate_s=3.0, summary="A scratch finding.", models="`tiny-qwen3`", needs="CPU")
    return Finding(**{**fields, **override})


@pytest.mark.parametrize("field", ["repro", "summary", "functions", "decisions", "source"])
def test_a_declaration_missing_a_piece_is_refused_by_name(field):
    empty = {"functions": (), "decisions": ()}.get(field, "")
    with pytest.raises(DeclarationError, match=f"finding 99_scratch: no {field}"):
        _scratch(**{field: empty})


def test_a_declaration_leaving_a_piece_out_or_bisecting_a_foreign_claim_is_refused():
    fields = {k: v for k, v in vars(_scratch()).items() if k != "ask"}
    with pytest.raises(TypeError, match="ask"):
        Finding(**fields)
    with pytest.raises(DeclarationError, match="bisect claim matrix.neither_fails"):
        _scratch(bisect="matrix.neither_fails")
    with pytest.raises(DeclarationError, match="decisions scratchkit/zz/decisions.py: .* a kill file"):
        Decisions("scratchkit/zz/decisions.py", ("decide_*",), "")


DECLARATION = '''from helpers.findings import Decisions, Finding
from helpers.pipeline.report import asks
from helpers.quotes import CONTROL, SLICED, passage

FINDING = Finding(stem="99_scratch", title="Scratch", source="control",
                  claims={"scratch.holds": passage(CONTROL, "extends", SLICED)}, ask=asks.control, bisect="scratch.holds",
                  functions=("transformers.cache_utils.Cache.update",), repro="examples/repro/scratch.py",
                  decisions=(Decisions("scratchkit/zz/decisions.py", ("decide_*",), "tests/test_kill_scratch.py"),),
                  estimate_s=3.0, summary="A scratch finding.", models="`tiny-qwen3`", needs="CPU")
'''
FILES = {  # a new notebook's files: nothing else in the kit is edited
    "notebooks/99_scratch.ipynb": "{}", "scratchkit/__init__.py": "", "scratchkit/zz/__init__.py": "",
    "scratchkit/zz/decisions.py": "def decide_thing(x):\n    return x\n", "scratchkit/zz/finding.py": DECLARATION,
    "tests/test_kill_scratch.py": "CASES = []\n", "examples/repro/scratch.py": "print('scratch')\n",
    "docs/scratch.md": "# Scratch\n",
}


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(findings, "ROOTS", [*findings.ROOTS, (tmp_path / "scratchkit", "scratchkit")])
    findings.reset()
    yield tmp_path
    findings.reset()
    for name in [m for m in sys.modules if m.split(".")[0] == "scratchkit"]:
        del sys.modules[name]


def test_a_scratch_finding_appears_in_every_derived_list(scratch):
    from test_decisions import registered

    from helpers.pipeline.bisect import upstream_code
    from helpers.pipeline.run import schedule
    from helpers.pipeline.tools import colab, mutants

    assert len(FILES) <= 10
    assert findings.quotes()["scratch.holds"].text == quotes.SLICED and findings.quote_for("scratch.holds")
    assert sources.source_of("99_scratch").key == "control" and findings.writer("control") is asks.control
    assert ("99", "scratch.holds") in findings.bisect_claims()
    assert upstream_code.relevant("99_scratch") == ("transformers.cache_utils.Cache.update",)
    assert "scratchkit/zz/decisions.py" in [s.module for s in mutants.decision_scopes()]
    assert registered()["scratchkit.zz.decisions"] == ["decide_thing"]
    assert schedule.expected_seconds([Path("notebooks/99_scratch.ipynb")], None) == {"99_scratch": 3.0}
    assert findings.expected_claims()["99_scratch"] == {"scratch.holds"} and findings.prefixes()["scratch"] == "99_scratch"
    assert ("| [99_scratch](notebooks/99_scratch.ipynb) | A scratch finding. ([more](docs/notebooks/99_scratch.md)) | "
            "`tiny-qwen3` | CPU |") in colab.notebook_table()


def test_readme_notebook_table_is_the_rendered_one():
    from helpers.pipeline.tools import colab

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert colab.notebook_table() in text, "README.md's notebook table is stale: run `make generate` (see docs/adding-a-finding.md)"
    assert colab.render_readme(text) == text
