"""outputs/SUMMARY.md (every claim of every notebook in one table) and outputs/html/ (one
self-contained HTML file per executed notebook).

Both are rebuilt from what is on disk (results/*.json, figures/*.png, notebooks/*.ipynb,
timings.json), so `python -m helpers.pipeline.runner report` / `html` can be rerun at any time.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .paths import output_dir

MAX_CHARS = 60_000
VERDICT_MARK = {"reproduced": "✅", "not_reproduced": "❌", "skipped": "⏭️", "error": "⚠️"}
ENV_KEYS = ("python", "torch", "transformers", "platform", "cuda_available", "device", "device_name", "dtype",
            "attn_implementation", "model_id", "model_revision", "seed")
# Keys that name the model a notebook ran: shown per notebook when they differ between notebooks.
MODEL_KEYS = ("model_id", "model_revision", "dtype", "attn_implementation", "device")


# --------------------------------------------------------------------------- formatting helpers

def fmt_value(value: Any, limit: int = 40) -> str:
    """A JSON value written compactly: 0.0 -> 0, 1.234567e-07 -> 1.23e-07, True -> true."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "0" if value == 0 else f"{value:.3g}"
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_num(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not (isinstance(value, float) and value != value)


def _summarise(key: str, value: Any) -> tuple[int, str] | None:
    """(priority, text) for one evidence field: 0 numeric/bool scalar, 1 aggregate of such, 2 other."""
    if _is_num(value):
        return 0, f"{key}={fmt_value(value)}"
    values = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
    if values is not None and values and all(isinstance(v, (bool, int, float, str)) or v is None for v in values):
        if all(isinstance(v, bool) for v in values):
            return 1, f"{key}={sum(values)}/{len(values)} true"
        if len(set(map(json.dumps, values))) == 1:
            times = f" (×{len(values)})" if len(values) > 1 else ""
            return (1 if _is_num(values[0]) else 2), f"{key}={fmt_value(values[0])}{times}"
        if all(_is_num(v) for v in values):
            return 1, f"{key}={fmt_value(values, 30)}"
        return 2, f"{key}={fmt_value(values, 30)}"
    if isinstance(value, str) and value:
        return 2, f"{key}={fmt_value(value, 30)}"
    return None


# Evidence fields that state a setting (a tolerance, the dtype) rather than a measurement: shown last.
SETTING_PREFIXES = ("tolerance", "dtype", "seed")


def key_numbers(evidence: dict[str, Any] | None, n: int = 2) -> str:
    """The one or two fields that decide a claim, picked generically from its evidence.

    Numeric and boolean scalars come first, then aggregates of them (a dict of booleans becomes
    `k=3/4 true`, a uniform list `k=4 (×4)`), then anything else, then settings such as tolerances;
    evidence order is kept.
    """
    if not isinstance(evidence, dict):
        return ""
    found = [(s[0] + (3 if k.startswith(SETTING_PREFIXES) else 0), i, s[1])
             for i, (k, v) in enumerate(evidence.items()) if (s := _summarise(k, v))]
    best = sorted(found)[:n]
    return "; ".join(text for _, _, text in sorted(best, key=lambda t: t[1]))


def cell(text: Any) -> str:
    """Text safe for one Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def truncate(text: str, limit: int = MAX_CHARS, what: str = "this report") -> str:
    """Cut text at a line boundary so that it, with a note saying so, stays under `limit` chars."""
    if len(text) < limit:
        return text
    note = (f"\n\n> **Truncated:** {what} was {len(text):,} characters; cut to stay under {limit:,}. "
            "The full data is in the JSON files next to it.\n")
    cut = text[: limit - len(note) - 1]
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    if cut.count("```") % 2:  # never leave a code fence open
        cut += "\n```"
    return cut + note


# --------------------------------------------------------------------------- loading

def load_results(out: Path | None = None) -> list[dict[str, Any]]:
    """Every results/*.json under `out` (default outputs/), sorted by notebook."""
    out = Path(out) if out else output_dir()
    rows = []
    for path in sorted((out / "results").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            data = {"notebook": path.stem, "environment": {}, "claims": [], "measurements": {},
                    "load_error": f"{type(exc).__name__}: {exc}"}
        data.setdefault("notebook", path.stem)
        rows.append(data)
    return rows


def load_timings(out: Path | None = None) -> dict[str, Any]:
    path = (Path(out) if out else output_dir()) / "timings.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- SUMMARY.md

def _environment_section(results: list[dict[str, Any]]) -> list[str]:
    envs = {r["notebook"]: r.get("environment") or {} for r in results}
    keys = [k for k in ENV_KEYS if any(k in e for e in envs.values())]
    keys += sorted({k for e in envs.values() for k in e} - set(keys))
    shared, varying = [], []
    for key in keys:
        values = {json.dumps(e.get(key), sort_keys=True) for e in envs.values()}
        (shared if len(values) == 1 else varying).append(key)
    lines = ["## Environment", "", "| | |", "|---|---|"]
    first = next(iter(envs.values()), {})
    lines += [f"| {key} | `{cell(fmt_value(first.get(key), 120))}` |" for key in shared]
    if varying:
        cols = [k for k in MODEL_KEYS if k in varying] + [k for k in varying if k not in MODEL_KEYS]
        lines += ["", "Differs between notebooks:", "", "| notebook | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for nb, env in envs.items():
            lines.append(f"| {nb} | " + " | ".join(f"`{cell(fmt_value(env.get(k), 60))}`" for k in cols) + " |")
    return lines + [""]


def build_summary(out: Path | None = None, title: str = "KV resume kit: results") -> str:
    """The SUMMARY.md text for the results under `out` (default outputs/)."""
    out = Path(out) if out else output_dir()
    results = load_results(out)
    timings = load_timings(out)
    runs = {t["notebook"]: t for t in timings.get("notebooks", [])}
    claims = [(r["notebook"], c) for r in results for c in r.get("claims", [])]
    counts: dict[str, int] = {}
    for _, c in claims:
        counts[c.get("verdict", "error")] = counts.get(c.get("verdict", "error"), 0) + 1
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tally = ", ".join(f"{VERDICT_MARK.get(v, '')} {n} {v}" for v, n in sorted(counts.items())) or "no claims"
    lines = [f"# {title}", "", f"{len(results)} notebooks, {len(claims)} claims: {tally}. Generated {stamp}.", ""]

    lines += ["## Claims", "", "| notebook | claim | verdict | deciding numbers |", "|---|---|---|---|"]
    for nb, c in claims:
        verdict = c.get("verdict", "error")
        lines.append(f"| {cell(nb)} | `{cell(c.get('id', '?'))}` | {VERDICT_MARK.get(verdict, '')} {verdict} "
                     f"| {cell(key_numbers(c.get('evidence')))} |")
    have = {r["notebook"] for r in results}
    for nb, run in sorted(runs.items()):
        if nb not in have:
            lines.append(f"| {cell(nb)} | — | ⚠️ error | no results file: {cell(run.get('error') or 'notebook failed')} |")
    lines.append("")

    failed = [t for t in runs.values() if not t.get("ok")]
    if runs:
        total = timings.get("total_seconds")
        lines += ["## Runs", "", f"{len(runs)} notebooks, {timings.get('jobs', '?')} at a time, "
                  f"{fmt_value(total)} s wall-clock.", "", "| notebook | status | seconds |", "|---|---|---|"]
        for nb, run in sorted(runs.items()):
            status = "ok" if run.get("ok") else f"failed: {run.get('error', '')}"
            lines.append(f"| {cell(nb)} | {cell(status)} | {fmt_value(run.get('seconds'))} |")
        lines.append("")
    if failed:
        lines += [f"**{len(failed)} notebook(s) failed**; their partially executed copies are in notebooks/.", ""]

    lines += _environment_section(results) if results else []

    figures = sorted((out / "figures").glob("*.png")) if (out / "figures").is_dir() else []
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            lines += [f"**{fig.stem}**", "", f"![{fig.stem}](figures/{fig.name})", ""]

    htmls = sorted((out / "html").glob("*.html")) if (out / "html").is_dir() else []
    if htmls:
        lines += ["## Rendered notebooks", "", "Self-contained HTML (figures embedded): "
                  + ", ".join(f"[{h.stem}](html/{h.name})" for h in htmls), ""]

    lines += ["## Claim details", ""]
    for r in results:
        lines += [f"<details><summary><b>{r['notebook']}</b></summary>", ""]
        if r.get("load_error"):
            lines += [f"- results file unreadable: {r['load_error']}"]
        for c in r.get("claims", []):
            lines += [f"- `{c.get('id')}` — {VERDICT_MARK.get(c.get('verdict'), '')} **{c.get('verdict')}**: "
                      f"{' '.join(str(c.get('statement', '')).split())}  ",
                      f"  _{' '.join(str(c.get('reason', '')).split())[:400]}_  ",
                      f"  evidence: `{fmt_value(c.get('evidence'), 600).replace('`', chr(39))}`"]
        lines += ["", "</details>", ""]
    return truncate("\n".join(lines).rstrip() + "\n", what="SUMMARY.md")


def write_summary(out: Path | None = None) -> Path:
    out = Path(out) if out else output_dir()
    path = out / "SUMMARY.md"
    path.write_text(build_summary(out))
    return path


# --------------------------------------------------------------------------- HTML

_IMG_SRC = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*[\"']?(?!data:)([^\"'\s>]+)", re.IGNORECASE)


def external_images(html: str) -> list[str]:
    """src of every <img> that is not an embedded data: URI."""
    return _IMG_SRC.findall(html)


def render_html(notebook: Path, dest_dir: Path) -> Path:
    """One executed notebook -> a self-contained HTML file (inline PNGs, Markdown images embedded)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4)
    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(notebook.parent),
                                                                      "name": notebook.stem}})
    missing = external_images(body)
    if missing:  # an image nbconvert could not embed: say so rather than ship a broken link
        for src in missing:
            body = body.replace(f'src="{src}"', f'src="" alt="not embedded: {src}"')
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{notebook.stem}.html"
    path.write_text(body, encoding="utf-8")
    return path


def write_html(out: Path | None = None, stems: Iterable[str] | None = None) -> tuple[list[Path], list[str]]:
    """Render every executed notebook in notebooks/ to html/; returns (written, errors)."""
    out = Path(out) if out else output_dir()
    wanted = set(stems) if stems is not None else None
    written, errors = [], []
    for nb in sorted((out / "notebooks").glob("*.ipynb")):
        if wanted is not None and nb.stem not in wanted:
            continue
        try:
            written.append(render_html(nb, out / "html"))
        except Exception as exc:  # noqa: BLE001 - one unreadable notebook must not stop the others
            errors.append(f"{nb.stem}: {type(exc).__name__}: {exc}"[:300])
    return written, errors
