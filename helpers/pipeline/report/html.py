"""outputs/html/: one self-contained HTML page per executed notebook: figures embedded, the environment
from its results file at the top, no remote script or style (nbconvert's require.js / MathJax / widget
loaders removed), widgets shown as a static line, machine paths scrubbed."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from ..paths import output_dir
from .asks import lines_for
from .claims_md import all_claims
from .paste import one_line
from .records import env_keys, load_json, load_results, run_id_of
from .scrub import scrub
from .sources import source_of
from .statements import source_key
from .summary import commit_text
from .verdict_line import count_line

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_IMG_SRC = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*[\"']?(?!data:)([^\"'\s>]+)", re.IGNORECASE)
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^>]*>\s*</script>", re.IGNORECASE)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", re.IGNORECASE)
_MATHJAX_CONFIG = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.IGNORECASE | re.DOTALL)


def external_images(html: str) -> list[str]:
    """src of every <img> that is not an embedded data: URI."""
    return _IMG_SRC.findall(html)


def strip_remote(html: str) -> str:
    """nbconvert's remote loaders removed: require.js, MathJax (and its config), widget managers, CDN styles."""
    html = _MATHJAX_CONFIG.sub("", html)
    html = _REMOTE_SCRIPT.sub("", html)
    return _REMOTE_LINK.sub("", html)


def static_widgets(nb: Any) -> int:
    """Replace every widget view output by a static line naming it; drop the widget state. Returns the count."""
    nb.metadata.pop("widgets", None)
    widgets = [out for c in nb.cells for out in c.get("outputs", []) if WIDGET_MIME in (out.get("data") or {})]
    for out in widgets:
        out["data"] = {"text/plain": f"[{widget_value(out['data'].get('text/plain', ''))}: interactive only when "
                                     "the notebook is opened in Jupyter]"}
    return len(widgets)


_CONTROL = re.compile(r"\b(\w+(?:Slider|Text|Dropdown|Checkbox|ToggleButton)\w*)\(([^()]*)\)")
_FIELD = re.compile(r"(\w+)=('[^']*'|-?[\w.]+)")


def widget_value(text: str) -> str:
    """A widget's repr as a static line: 'IntSlider offset = 0 (min -8, max 8)'; 'a widget' when it names no control."""
    found = []
    for kind, args in _CONTROL.findall(text):
        fields = {k: v.strip("'") for k, v in _FIELD.findall(args)}
        label = fields.get("description") or kind
        bounds = ", ".join(f"{k} {fields[k]}" for k in ("min", "max") if k in fields)
        found.append(f"{kind} {label} = {fields.get('value', '?')}" + (f" ({bounds})" if bounds else ""))
    return "; ".join(found) or "a widget"


def environment_markdown(results: dict[str, Any], source: str) -> str:
    """The environment a notebook ran with (from its results file), as a Markdown block for the HTML's top."""
    env = results.get("environment") or {}
    run = results.get("run") or {}
    lines = [f"**Environment this notebook ran with** (from `{source}`, written by the notebook itself)", "",
             f"Run `{run['run_id']}`, started {run.get('started') or '?'}, kit commit {commit_text(run)}"
             if run.get("run_id") else "Not run by the kit's runner (no run id).", "", "| | |", "|---|---|",
             *[f"| {k} | `{one_line(env.get(k))[:120]}` |" for k in env_keys([env])]]
    if warnings := results.get("warnings"):
        lines += ["", "transformers warnings captured during the run (kept out of the cells below):", "",
                  *[f"- `{one_line(w).replace('`', chr(39))}`" for w in warnings]]
    return "\n".join(lines)


def verdict_markdown(stem: str, results: dict[str, Any], out: Path) -> str:
    """The page's opening: the source's verdict and ask (helpers.pipeline.report.asks, over this run's results of that
    source on disk) and this notebook's own count, so the verdict stands above the code."""
    src, release = source_of(stem), str((results.get("environment") or {}).get("transformers") or "?")
    rid = run_id_of(results)
    same = [r for r in load_results(out) if rid and run_id_of(r) == rid and r.get("notebook") != stem] + [results]
    claims = [(nb, c) for nb, c in all_claims(same) if source_key(nb, c) == src.key or nb == stem]
    said = lines_for(src.key, {release: claims}, out)
    mine = count_line({release: [(stem, c) for c in results.get("claims") or []]})
    return "\n".join([f"**Verdict** ({src.short or src.title}, transformers {release}): "
                      + "; ".join(p for p in (said.symptom, f"this notebook: {mine or 'no claim decided'}") if p) + ".",
                      "", f"**Ask:** {said.ask or 'none computed from this notebook alone: see the first screen of `outputs/SUMMARY.md`'}.",
                      "", "(Every claim, its reason and its evidence: the last cells and `outputs/SUMMARY.md`.)"])


@functools.lru_cache(maxsize=1)
def _exporter() -> Any:
    """One HTMLExporter per process: its templates are loaded once, not per page."""
    from nbconvert import HTMLExporter

    return HTMLExporter(embed_images=True)


def render_html(notebook: Path, dest_dir: Path, results: dict[str, Any] | None = None) -> Path:
    """One executed notebook -> a self-contained HTML file, the environment from its results file at the top."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    static_widgets(nb)
    if results is not None:  # fixed cell ids: the same run renders to the same HTML
        new = nbformat.v4.new_markdown_cell
        at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
        title, _, rest = nb.cells[0].source.partition("\n") if at else ("", "", "")
        head = [new(title, id="kvkit-title")] if title.startswith("#") else []
        if head:  # the title's heading, then the verdict and the ask, then the title's text
            nb.cells[0].source = rest.lstrip("\n")
        nb.cells[at:at] = [new(environment_markdown(results, f"results/{notebook.stem}.json"), id="kvkit-environment")]
        nb.cells[:0] = [*head, new(verdict_markdown(notebook.stem, results, dest_dir.parent), id="kvkit-verdict")]
    body, _ = _exporter().from_notebook_node(nb, resources={"metadata": {"path": str(notebook.parent), "name": notebook.stem}})
    body = strip_remote(body)
    for src in external_images(body):  # an image nbconvert could not embed: say so rather than ship a broken link
        body = body.replace(f'src="{src}"', f'src="" alt="not embedded: {src}"')
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{notebook.stem}.html"
    path.write_text(scrub(body, dest_dir.parent), encoding="utf-8")
    return path


def write_html(out: Path | None = None, stems: list[str] | None = None) -> tuple[list[Path], list[str]]:
    """Render every executed notebook in notebooks/ to html/; returns (written, errors)."""
    out = Path(out) if out else output_dir()
    written, errors = [], []
    for nb in sorted(nb for nb in (out / "notebooks").glob("*.ipynb") if stems is None or nb.stem in stems):
        try:
            written.append(render_html(nb, out / "html", load_json(out / "results" / f"{nb.stem}.json")))
        except Exception as exc:  # noqa: BLE001 - one unreadable notebook must not stop the others
            errors.append(scrub(f"{nb.stem}: {type(exc).__name__}: {exc}"[:300], out))
    return written, errors
