"""README and docs/: the README stays short and links every docs page; every make target, Makefile parameter and
notebook parameter is documented somewhere under README.md or docs/; `make help` lists every target."""
from __future__ import annotations

import re
import subprocess

from helpers.pipeline.paths import repo_root
from helpers.pipeline.run import execute, params
from helpers.pipeline.tools import paramdoc

ROOT = repo_root()
README_LIMIT = 15_000


def _docs_text() -> str:
    """README.md and every docs/ page, as one text."""
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _targets() -> list[str]:
    """Every rule the Makefile defines (its own lines `name: ...`, not variables or patterns)."""
    make = (ROOT / "Makefile").read_text()
    return re.findall(r"^([a-z][a-z-]*):(?!=)", make, flags=re.M)


def _make_variables() -> list[str]:
    """The parameters the Makefile reads from its command line (`NAME ?=`)."""
    return re.findall(r"^([A-Z_]+) \?=", (ROOT / "Makefile").read_text(), flags=re.M)


def test_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= README_LIMIT, f"README.md is {len(readme)} characters (at most {README_LIMIT})"
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages
    unlinked = [p for p in pages if f"(docs/{p}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_relative_links_resolve():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\((?!https?:)([^)#\s]+)", path.read_text(encoding="utf-8")):
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"


def test_make_help_lists_every_target():
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert sorted(listed) == sorted(set(_targets())), out
    assert all(len(line.split(None, 1)) == 2 for line in out.splitlines() if line.strip()), "one line each, with its text"


def test_every_target_and_parameter_is_documented():
    text = _docs_text()
    missing = [f"make {t}" for t in _targets() if t != "help" and f"make {t}" not in text]
    missing += [f"{v}=" for v in _make_variables() if f"{v}=" not in text]
    for nb in execute.notebooks():
        missing += [f"{nb.stem[:2]}: `{name}`" for name in params.declared(nb) if f"`{name}`" not in text
                    and f"-p {name} " not in text]
    assert not missing, f"not documented under README.md or docs/: {missing}"


def test_readme_commands_name_what_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for file, func in re.findall(r"-p rebuild (examples/[\w/]+\.py):(\w+)", readme):
        assert re.search(rf"^def {func}\(", (ROOT / file).read_text(), flags=re.M), f"{file}:{func} does not exist"
    for nb in re.findall(r"make run NB=(\d\d)", readme):
        assert execute.select([nb]), nb


def test_parameters_page_is_rendered_from_the_notebooks():
    page = (ROOT / paramdoc.PAGE).read_text(encoding="utf-8")
    assert page == paramdoc.render(), "docs/parameters.md is stale: run `make generate` (see docs/adding-a-finding.md)"
    assert "| `seq_len` | `64` | 05 | the report used 4096 |" in page and "| `revision` | `None` | all |" in page
