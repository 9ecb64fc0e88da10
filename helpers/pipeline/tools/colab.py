"""The Colab cell (every notebook's first code cell) and README's Colab badges, rendered from the one
repository address in pyproject.toml's `[project.urls] Repository`; README's notebook table, rendered from the
findings' declarations (helpers.findings); docs/parameters.md (tools.paramdoc).

    python -m helpers.pipeline.tools.colab --write notebooks/*.ipynb README.md   # rewrite those, nothing else
    python -m helpers.pipeline.tools.colab --check notebooks/*.ipynb README.md docs/parameters.md   # exit 1 if stale

`--write` replaces only a notebook's first code cell, README's notebook table and its Colab badge links, and the whole
parameters page; it is idempotent.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

from ..paths import repo_root

CLONE_DIR = "/content/kv-resume-kit"  # Colab's default; KVKIT_DIR overrides it (tests/test_colab.py does)
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_BADGE_LINK = re.compile(r"https://colab\.research\.google\.com/github/[^)\s]*?/notebooks/([\w.-]+?)\.ipynb")

CELL_TEMPLATE = '''import os, subprocess, sys
if "google.colab" in sys.modules:  # Colab only: install the kit beside Colab's own torch and jupyter
    from importlib import metadata
    repo = os.environ.get("KVKIT_REPO", "{repo}")  # a fork: set KVKIT_REPO
    kit = os.environ.get("KVKIT_DIR", "{clone_dir}")
    if not os.path.isdir(kit):
        subprocess.run(["git", "clone", "-q", "--depth", "1", repo, kit], check=True)
    keep = {{"torch", "torchvision", "torchaudio", "ipykernel", "ipython", "jupyter_client", "jupyter_core",
            "jupyter_server", "notebook", "tornado", "traitlets", "pyzmq"}}  # Colab's: pinned as they are
    pins = sorted({{f"{{d.metadata['Name']}}=={{d.version}}" for d in metadata.distributions()
                   if (d.metadata["Name"] or "").lower().replace("-", "_") in keep}})
    with open(os.path.join(kit, "colab-keep.txt"), "w") as f:  # pip may add packages, never replace these
        f.write("\\n".join(pins) + "\\n")
    pip = [sys.executable, "-m", "pip", "install", "-q", "-c", os.path.join(kit, "colab-keep.txt")]
    subprocess.run(pip + ["-r", os.path.join(kit, "requirements-runtime.txt")], check=True)  # no torch, no jupyter
    subprocess.run(pip + ["--no-deps", os.path.join(kit, "packages", "kvresume"), kit], check=True)  # kvresume + the kit
'''


def repository_url(root: Path | None = None) -> str:
    """pyproject.toml's `[project.urls] Repository`."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    data = tomllib.loads(((root or repo_root()) / "pyproject.toml").read_text(encoding="utf-8"))
    return data["project"]["urls"]["Repository"].rstrip("/")


def cell_source(repo: str | None = None) -> str:
    """The text of every notebook's first code cell."""
    return CELL_TEMPLATE.format(repo=repo or repository_url(), clone_dir=CLONE_DIR).rstrip("\n")


def colab_url(stem: str, repo: str | None = None) -> str:
    """The Colab address that opens notebooks/<stem>.ipynb of the repository's main branch."""
    path = (repo or repository_url()).split("://", 1)[-1].removeprefix("github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/main/notebooks/{stem}.ipynb"


def badge(stem: str, repo: str | None = None) -> str:
    """README's Open-in-Colab badge for one notebook."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(stem, repo)})"


def first_code_cell(nb: dict) -> dict:
    """The notebook's first code cell (the Colab cell)."""
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


def render_notebook(raw: str, repo: str | None = None) -> str:
    """The notebook JSON with only its first code cell replaced (formatted as nbformat writes it)."""
    nb = json.loads(raw)
    first_code_cell(nb)["source"] = cell_source(repo).splitlines(keepends=True)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


TABLE_HEAD = "| notebook | finding | default model | needs | Colab |\n|---|---|---|---|---|\n"


def notebook_table(repo: str | None = None) -> str:
    """README's notebook table: one row per declared finding."""
    from ...findings import found

    return TABLE_HEAD + "".join(f"| [{f.stem}](notebooks/{f.stem}.ipynb) | {f.summary} ([more](docs/notebooks/{f.stem}.md)) "
                                f"| {f.models} | {f.needs} | {badge(f.stem, repo)} |\n" for f in found())


def render_readme(text: str, repo: str | None = None) -> str:
    """README with its notebook table rendered and every Colab badge link pointing at the repository."""
    if TABLE_HEAD in text:
        head, rest = text.split(TABLE_HEAD, 1)
        tail = "".join(itertools.dropwhile(lambda line: line.startswith("|"), rest.splitlines(keepends=True)))
        text = head + notebook_table(repo) + tail
    return _BADGE_LINK.sub(lambda m: colab_url(m.group(1), repo), text)


def render(path: Path, repo: str | None = None) -> str:
    """What `path` (a notebook, README.md or docs/parameters.md) should hold."""
    from . import paramdoc

    text = path.read_text(encoding="utf-8")
    if path.name == paramdoc.PAGE.name:
        return paramdoc.render()
    return render_notebook(text, repo) if path.suffix == ".ipynb" else render_readme(text, repo)


def main(argv: list[str] | None = None) -> int:
    """--write or --check the given notebooks and README."""
    ap = argparse.ArgumentParser(prog="python -m helpers.pipeline.tools.colab", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the Colab cell / badges in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if any file differs from the rendering")
    ap.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args(argv)
    repo, stale = repository_url(), []
    for path in args.paths:
        wanted = render(path, repo)
        if wanted != path.read_text(encoding="utf-8"):
            stale.append(str(path))
            if args.write:
                path.write_text(wanted, encoding="utf-8")
    verb = "rewrote" if args.write else "differs from the rendering"
    for path in stale:
        print(f"{verb}: {path}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
