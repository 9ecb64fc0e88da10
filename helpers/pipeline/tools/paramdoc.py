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

Every notebook's `parameters` cell (`python -m helpers.pipeline.tools.colab --write docs/parameters.md`), each
distinct row (name, default, meaning) once, with the notebooks (by number) whose cell declares it.
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


def _where(stems: list[str], every: list[str]) -> str:
    """The notebooks a row holds in: `all`, `all but 05`, or their numbers."""
    if stems == every:
        return "all"
    if 2 * len(stems) <= len(every):
        return " ".join(stems)
    return "all but " + " ".join(s for s in every if s not in stems)


def render(root: Path | None = None) -> str:
    """The whole page: each distinct row (name, default, meaning) once, with the notebooks that declare it."""
    root = root or repo_root()
    cells = {p.stem[:2]: rows for p in sorted((root / "notebooks").glob("*.ipynb")) if (rows := parameter_rows(p))}
    held: dict[tuple[str, str, str], list[str]] = {}
    for nb, rows in cells.items():
        for row in rows:
            held.setdefault(row, []).append(nb)
    names = list(dict.fromkeys(name for name, _, _ in held))
    out = [HEAD, "| parameter | default | notebooks | what it is |", "|---|---|---|---|"]
    for row, nbs in sorted(held.items(), key=lambda item: names.index(item[0][0])):
        out.append(f"| `{row[0]}` | {code(row[1])} | {_where(nbs, list(cells))} | {cell(row[2])} |")
    return "\n".join(out + [""])
