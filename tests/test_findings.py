"""Each finding declares itself once (helpers.findings), and each source beside the finding answering it: the
declarations are complete, every list derives from them, and a new notebook with a new source is its own few files:
a scratch finding built in tmp from docs/adding-a-finding.md alone shows up in every derived list."""
from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from helpers import findings, quotes
from helpers.findings import Decisions, DeclarationError, Finding
from helpers.pipeline.paths import repo_root
from helpers.pipeline.report import sources

ROOT = repo_root()


def test_every_notebook_and_only_they_declare_a_finding():
    assert [f.stem for f in findings.found()] == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")), \
        "each notebook declares one FINDING: see docs/adding-a-finding.md"
    assert len({f.number for f in findings.found()}) == len(findings.found()) == len(findings.prefixes())


@pytest.mark.parametrize("finding", findings.found(), ids=lambda f: f.stem)
def test_a_declaration_names_what_exists(finding):
    assert finding.source in findings.sources() and (ROOT / finding.repro).is_file(), \
        f"{finding.stem}: its source's helpers/<package>/ask.py and its repro file (docs/adding-a-finding.md)"
    assert all(name.startswith("transformers.") for name in finding.functions)
    assert set(finding.kinds().values()) <= set(quotes.ROLES)
    for cid, q in finding.claims.items():  # every claim has a quote: text from a source, or (environment) none
        assert isinstance(q, quotes.Quote) and cid.startswith(finding.prefix + ".")
        assert (q.text and q.source) or q.role == "machine", cid
    assert finding.estimate_s > 0


def test_every_source_is_declared_once_with_its_writer_and_answered():
    declared = [importlib.import_module(name).SOURCE.key for name, _ in findings._modules("ask")]
    assert len(declared) == len(set(declared)), f"a source declared twice: {sorted(declared)}"
    assert set(declared) == {f.source for f in findings.found()}, "every source answered, every answer declared"
    for key in declared:
        assert callable(findings.writer(key)), key


def test_a_declaration_loads_no_report_and_no_other_finding():
    for name, path in findings._modules("finding") + findings._modules("decisions"):
        imported = {n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        assert not [m for m in imported if m.startswith(("..pipeline", "...pipeline"))], f"{name} imports the pipeline"


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
    fields = dict(stem="99_scratch", title="Scratch", source="scratch-thread",
                  claims={"scratch.holds": quotes.passage("scratch-thread", "extends", "a scratch passage")},
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
    fields = {k: v for k, v in vars(_scratch()).items() if k != "repro"}
    with pytest.raises(TypeError, match="repro"):
        Finding(**fields)
    with pytest.raises(DeclarationError, match="bisect claim matrix.neither_fails"):
        _scratch(bisect="matrix.neither_fails")
    with pytest.raises(DeclarationError, match="decisions scratchkit/zz/decisions.py: .* a kill file"):
        Decisions("scratchkit/zz/decisions.py", ("decide_*",), "")


DECLARATION = '''from helpers.findings import Decisions, Finding
from helpers.quotes import passage

FINDING = Finding(stem="99_scratch", title="Scratch", source="scratch-thread",
                  claims={"scratch.holds": passage("scratch-thread", "extends", "a scratch passage")}, bisect="scratch.holds",
                  functions=("transformers.cache_utils.Cache.update",), repro="examples/repro/scratch.py",
                  decisions=(Decisions("scratchkit/zz/decisions.py", ("decide_*",), "tests/test_kill_scratch.py"),),
                  estimate_s=3.0, summary="A scratch finding.", models="`tiny-qwen3`", needs="CPU")
'''
ASK = '''from pathlib import Path

from helpers.findings import Source
from helpers.pipeline.report.asks import Claims, Lines, claim_of


SOURCE = Source("scratch-thread", "A scratch thread", {"release": "5.17.0"}, "nothing", "examples/repro/scratch.py",
                "what it prints", "Scratch thread")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    held = [rel for rel, claims in by_release.items() if claim_of(claims, "scratch.holds").get("verdict") == "holds"]
    return Lines("holds on " + " and ".join(held), "nothing to ask")
'''
FILES = {  # a new notebook's files, its source's among them: nothing else in the kit is edited
    "notebooks/99_scratch.ipynb": "{}", "scratchkit/__init__.py": "", "scratchkit/zz/__init__.py": "",
    "scratchkit/zz/decisions.py": "def decide_thing(x):\n    return x\n", "scratchkit/zz/finding.py": DECLARATION,
    "scratchkit/zz/ask.py": ASK, "tests/test_kill_scratch.py": "CASES = []\n",
    "examples/repro/scratch.py": "print('scratch')\n", "docs/notebooks/99_scratch.md": "# Scratch\n",
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


@pytest.fixture
def before():
    """The first screen's budget before the scratch source is declared."""
    from helpers.pipeline.report import first_screen

    return first_screen.screen_chars()


def test_a_scratch_finding_appears_in_every_derived_list(before, scratch):
    from test_decisions import registered

    from helpers.pipeline.bisect import upstream_code
    from helpers.pipeline.report import asks, first_screen
    from helpers.pipeline.run import schedule
    from helpers.pipeline.tools import colab, mutants

    assert len(FILES) <= 10
    assert findings.quotes()["scratch.holds"].text == "a scratch passage" and findings.quote_for("scratch.holds")
    assert findings.quotes_of("99_scratch") == {"scratch.holds": findings.quote_for("scratch.holds")}
    assert sources.source_of("99_scratch").key == "scratch-thread" and list(findings.sources())[-1] == "scratch-thread"
    said = asks.lines_for("scratch-thread", {"5.17.0": [("99_scratch", {"id": "scratch.holds", "verdict": "holds"})]}, scratch)
    assert said == asks.Lines("holds on 5.17.0", "nothing to ask")
    assert first_screen.screen_chars() == before + first_screen.BLOCK_CHARS + first_screen.REPRO_CHARS
    assert ("99", "scratch.holds") in findings.bisect_claims()
    assert upstream_code.relevant("99_scratch") == ("transformers.cache_utils.Cache.update",)
    assert "scratchkit/zz/decisions.py" in [s.module for s in mutants.decision_scopes()]
    assert registered()["scratchkit.zz.decisions"] == ["decide_thing"]
    assert schedule.expected_seconds([Path("notebooks/99_scratch.ipynb")], None) == {"99_scratch": 3.0}
    assert {f.stem: set(f.claims) for f in findings.found()}["99_scratch"] == {"scratch.holds"} and findings.prefixes()["scratch"] == "99_scratch"
    assert ("| [99_scratch](notebooks/99_scratch.ipynb) | A scratch finding. ([more](docs/notebooks/99_scratch.md)) | "
            "`tiny-qwen3` | CPU |") in colab.notebook_table()


def test_readme_notebook_table_is_the_rendered_one():
    from helpers.pipeline.tools import colab

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert colab.notebook_table() in text, "README.md's notebook table is stale: run `make generate` (see docs/adding-a-finding.md)"
    assert colab.render_readme(text) == text
