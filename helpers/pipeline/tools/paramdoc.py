"""docs/parameters.md: every notebook's `parameters` cell as a table (name, default, the cell's own comment),
rendered from the notebooks so the page cannot fall behind them (written and checked by tools.colab)."""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from ..paths import repo_root
from ..report.paste import cell, code
from ..run.params import parameters_source

PAGE = Path("docs") / "parameters.md"
HEAD = """# Notebook parameters

Every notebook's `parameters` cell (`python -m helpers.pipeline.tools.colab --write docs/parameters.md`).
Pass any of them as `make run NB=.. ARGS="-p NAME VALUE"` (or `make run-all ARGS=...`: a parameter only some
notebooks declare goes only to those); values are checked before any kernel starts
([running.md](running.md)). In Colab, edit the `parameters` cell itself.
"""

# What the parameters every notebook shares mean, where a notebook's cell says nothing more.
COMMON = {
    "model_id": "a tiny default, a hub name or a local folder (loaded with from_pretrained)",
    "revision": "the hub revision (commit) of model_id; None for the tiny defaults",
    "dtype": "float32, float16 or bfloat16 (the noise floor is measured in the same dtype)",
    "attn_implementation": "sdpa, eager, or another implementation transformers knows",
    "device": "cpu, cuda or auto (refused where CUDA is absent)",
    "seed": "the seed of the tiny defaults' weights and inputs",
    "trust_remote_code": "off unless you pass True",
}


def parameter_rows(path: Path) -> list[tuple[str, str, str]]:
    """(name, default as written, the line's comment) for each assignment in the cell tagged `parameters`."""
    source = parameters_source(path)
    comments = {t.start[0]: t.string.lstrip("# ").strip()
                for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    return [(node.targets[0].id, ast.get_source_segment(source, node.value) or "",
             comments.get(node.lineno) or COMMON.get(node.targets[0].id, ""))
            for node in ast.parse(source).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)]


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    return ["| parameter | default | what it is |", "|---|---|---|",
            *[f"| `{name}` | {code(default)} | {cell(note)} |" for name, default, note in rows], ""]


def usual(cells: dict[str, list[tuple[str, str, str]]]) -> list[tuple[str, str, str]]:
    """Per parameter every notebook declares, the row (default and meaning) more than half of them hold, if any."""
    if len(cells) < 2:
        return []
    rows = [row for rows in cells.values() for row in rows]
    names = [name for name, _, _ in next(iter(cells.values())) if all(name in {r[0] for r in c} for c in cells.values())]
    out = []
    for name in names:
        best = max((row for row in rows if row[0] == name), key=rows.count)
        if 2 * rows.count(best) > len(cells):
            out.append(best)
    return out


def render(root: Path | None = None) -> str:
    """The whole page: each parameter's usual row once, then each notebook's rows that differ from it."""
    root = root or repo_root()
    cells = {p.stem: rows for p in sorted((root / "notebooks").glob("*.ipynb")) if (rows := parameter_rows(p))}
    shared = usual(cells)
    out = [HEAD, "## Every notebook, unless its section says otherwise", "", *_table(shared)] if shared else [HEAD]
    for stem, rows in cells.items():
        own = [row for row in rows if row not in shared]
        out += [f"## {stem}", ""] + (_table(own) if own else ["Only the parameters every notebook has.", ""])
    return "\n".join(out)
