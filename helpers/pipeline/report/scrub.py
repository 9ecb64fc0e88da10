"""Machine paths out of everything a user shares: this machine's absolute paths become placeholders
(paths inside the kit relative to it, `./outputs/...`; {outputs}, ~, {tmp}, {python-env}) in SUMMARY.md, the HTML, the results, run.json and timings.json."""
from __future__ import annotations

import re
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..paths import output_dir, repo_root


def machine_paths(out: Path | None = None) -> list[tuple[str, str]]:
    """(absolute path, placeholder) pairs for this machine, most specific first."""
    out = Path(out) if out else output_dir()
    root = repo_root()
    pairs = [(root, "."), (Path.home(), "~"), (Path(tempfile.gettempdir()), "{tmp}"), (Path("/tmp"), "{tmp}"),
             (Path(sysconfig.get_paths()["stdlib"]), "{python-lib}")]
    if not Path(sys.prefix).resolve().is_relative_to(root.resolve()):  # the kit's own .venv reads better as ./.venv
        pairs.append((Path(sys.prefix), "{python-env}"))
    if not out.resolve().is_relative_to(root.resolve()):
        pairs.insert(0, (out, "{outputs}"))
    found = {variant: label for path, label in reversed(pairs) for variant in (str(path), str(path.resolve()))
             if variant.count("/") >= 1 and len(variant) > 1}  # reversed: the first pair naming a path wins
    return sorted(found.items(), key=lambda kv: -len(kv[0]))


def scrub(text: str, out: Path | None = None) -> str:
    """`text` with this machine's absolute paths replaced by placeholders (./outputs/..., ~/..., {tmp}/...)."""
    for path, label in machine_paths(out):
        if path not in text:  # the search below scans the whole text (an HTML page is megabytes)
            continue
        text = re.sub(r"(?<![\w./-])" + re.escape(path) + r"(?![\w.-])", lambda _m, lb=label: lb, text)
    return text


def scrub_file(path: Path | str, out: Path | None = None) -> bool:
    """Rewrite one text file (e.g. timings.json) with machine paths scrubbed; True if it changed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub(text, out if out is not None else path.parent)
    if clean != text:
        path.write_text(clean, encoding="utf-8")
    return clean != text


def scrub_outputs(out: Path) -> list[Path]:
    """Scrub run.json, timings.json, SUMMARY.md, results/*.json, html/*.html and the executed notebooks under `out`."""
    paths = [out / "run.json", out / "timings.json", out / "SUMMARY.md", *sorted((out / "results").glob("*.json")),
             *sorted((out / "html").glob("*.html")), *sorted((out / "notebooks").glob("*.ipynb"))]
    return [p for p in paths if p.is_file() and scrub_file(p, out)]
