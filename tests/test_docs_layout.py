"""docs/layout.md against the tree: every package folder of the kit and the library is named, every path named
exists; docs/ stays under its size; every notebook has its page in docs/notebooks/ listing exactly its claims."""
from __future__ import annotations

import re

from helpers import findings
from helpers.pipeline.paths import repo_root

ROOT = repo_root()
LAYOUT = ROOT / "docs" / "layout.md"
DOCS_LIMIT = 100_000  # bytes under docs/, every page together


def _packages() -> list[str]:
    """Every folder holding an __init__.py under helpers/ and packages/, and every folder under examples/, but the
    findings' packages: the page's `helpers/<package>/` row names them all (each found by its finding.py)."""
    found = [p.parent for base in ("helpers", "packages") for p in (ROOT / base).rglob("__init__.py")]
    found += [p for p in (ROOT / "examples").rglob("*") if p.is_dir() and "__pycache__" not in p.parts]
    declared = {path.parent for _, path in findings._modules("finding")}
    return sorted({f"{p.relative_to(ROOT)}/" for p in found if "__pycache__" not in p.parts and p not in declared})


def test_layout_names_every_package_folder_and_only_paths_that_exist():
    text = LAYOUT.read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w./-]+/[\w./-]*)`", text))
    assert [p for p in _packages() if p not in named] == [], "docs/layout.md: name these folders"
    made = ("outputs/",)  # written by a run, absent from a fresh clone
    assert [p for p in named if not p.startswith(made) and not (ROOT / p).exists()] == [], \
        "docs/layout.md names paths that do not exist"


def test_a_folder_missing_from_the_layout_is_caught(tmp_path):
    assert "helpers/pipeline/run/" in _packages() and "examples/repro/" in _packages()
    assert "helpers/triage/" not in _packages(), "a finding's package is named by its finding.py, not by the page"
    named = {"helpers/"}
    assert [p for p in _packages() if p not in named], "the check sees a folder the page leaves out"


def test_docs_stay_under_their_size():
    size = sum(p.stat().st_size for p in (ROOT / "docs").rglob("*.md"))
    assert size <= DOCS_LIMIT, f"docs/ is {size:,} bytes (at most {DOCS_LIMIT:,}): move measurement narratives out"


def test_every_notebook_has_a_page_listing_exactly_its_claims():
    pages = {p.stem: p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "notebooks").glob("*.md")}
    stems = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(pages) == stems, "each notebook has its page docs/notebooks/<stem>.md (docs/adding-a-finding.md)"
    index = (ROOT / "README.md").read_text(encoding="utf-8")  # its generated table: make generate
    assert all(f"(docs/notebooks/{s}.md)" in index for s in stems), "README's notebook table links every page"
    listed = {cid: stem for stem, text in pages.items() for cid in re.findall(r"^\| `([\w.]+)` \|", text, flags=re.M)}
    assert sorted(listed) == sorted(findings.quotes()), "a page lists a claim that is not registered, or misses one"
    for stem, text in pages.items():
        assert len({cid.split(".")[0] for cid, s in listed.items() if s == stem}) == 1, stem
        assert "## How to read" in text, stem
    from helpers.findings import found

    for f in found():  # the page opens with the finding's one description, the one README's table shows
        assert pages[f.stem].splitlines()[2] == f.summary, f.stem
