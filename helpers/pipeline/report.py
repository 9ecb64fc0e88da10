"""outputs/SUMMARY.md (the claims of one run in one table) and outputs/html/ (one self-contained
HTML file per executed notebook, its environment at the top).

Both are rebuilt from what is on disk (run.json, results/*.json, figures/*.png, notebooks/*.ipynb,
timings.json), so `python -m helpers.pipeline.runner report` / `html` can be rerun at any time.
The summary describes the run named in run.json: results files of any other run (or of none) are
shown in separate "From an earlier run" sections, never in its claims table or tally. Every text
written here is scrubbed of this machine's absolute paths ({kit}, {outputs}, ~, {tmp}), and figures
are named as files to attach rather than linked, so the summary pastes cleanly into an issue.
"""
from __future__ import annotations

import json
import re
import sys
import sysconfig
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .paths import output_dir, repo_root

MAX_CHARS = 60_000
VERDICT_MARK = {"reproduced": "✅", "not_reproduced": "❌", "skipped": "⏭️", "error": "⚠️"}
ENV_KEYS = ("python", "torch", "transformers", "platform", "cuda_available", "device", "device_name", "dtype",
            "attn_implementation", "model_id", "model_revision", "processor", "seed")
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


# --------------------------------------------------------------------------- machine paths

def machine_paths(out: Path | None = None) -> list[tuple[str, str]]:
    """(absolute path, placeholder) pairs for this machine, most specific first."""
    out = Path(out) if out else output_dir()
    root = repo_root()
    pairs = [(root, "{kit}"), (Path.home(), "~"), (Path(tempfile.gettempdir()), "{tmp}"), (Path("/tmp"), "{tmp}"),
             (Path(sysconfig.get_paths()["stdlib"]), "{python-lib}"), (Path(sys.prefix), "{python-env}")]
    if not _inside(out, root):
        pairs.insert(0, (out, "{outputs}"))
    found: dict[str, str] = {}
    for path, label in pairs:
        for variant in {str(path), str(path.resolve())}:
            if variant.count("/") >= 1 and len(variant) > 1 and variant not in found:
                found[variant] = label
    if _inside(Path(sys.prefix), root):  # the kit's own .venv reads better as {kit}/.venv
        found.pop(str(Path(sys.prefix)), None)
        found.pop(str(Path(sys.prefix).resolve()), None)
    return sorted(found.items(), key=lambda kv: -len(kv[0]))


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def scrub(text: str, out: Path | None = None) -> str:
    """`text` with this machine's absolute paths replaced by placeholders ({kit}/outputs/..., ~/..., {tmp}/...)."""
    for path, label in machine_paths(out):
        text = re.sub(r"(?<![\w./-])" + re.escape(path) + r"(?![\w.-])", lambda _m, lb=label: lb, text)
    return text


def scrub_file(path: Path, out: Path | None = None) -> bool:
    """Rewrite one text file with machine paths scrubbed; True if it changed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub(text, out)
    if clean != text:
        path.write_text(clean, encoding="utf-8")
    return clean != text


def scrub_outputs(out: Path | None = None) -> list[Path]:
    """Scrub run.json, timings.json, SUMMARY.md, results/*.json, html/*.html and the executed notebooks under `out`."""
    out = Path(out) if out else output_dir()
    paths = [out / "run.json", out / "timings.json", out / "SUMMARY.md", *sorted((out / "results").glob("*.json")),
             *sorted((out / "html").glob("*.html")), *sorted((out / "notebooks").glob("*.ipynb"))]
    return [p for p in paths if p.is_file() and scrub_file(p, out)]


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


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def load_timings(out: Path | None = None) -> dict[str, Any]:
    return _load_json((Path(out) if out else output_dir()) / "timings.json")


def load_run(out: Path | None = None) -> dict[str, Any]:
    """outputs/run.json (the runner's record of the last run), {} when there is none."""
    return _load_json((Path(out) if out else output_dir()) / "run.json")


def run_id_of(data: dict[str, Any]) -> str | None:
    """The run id a results or timings file belongs to (top-level "run": {"run_id"} or "run_id")."""
    run = data.get("run")
    rid = run.get("run_id") if isinstance(run, dict) else None
    return rid or data.get("run_id") or None


def split_by_run(results: list[dict[str, Any]], run_id: str | None) -> tuple[list[dict[str, Any]], dict[str | None, list[dict[str, Any]]]]:
    """(results of run `run_id`, {other run id or None: their results}); no run id -> nothing is current."""
    current = [r for r in results if run_id and run_id_of(r) == run_id]
    others: dict[str | None, list[dict[str, Any]]] = {}
    for r in results:
        if not (run_id and run_id_of(r) == run_id):
            others.setdefault(run_id_of(r), []).append(r)
    return current, others


# --------------------------------------------------------------------------- SUMMARY.md

RUN_STATUS = {"complete": "✅ complete", "running": "⏳ still running (or stopped without saying so)",
              "interrupted": "⚠️ **INTERRUPTED**", "failed": "❌ **FAILED**"}
NB_STATUS = {"ok": "✅ ok", "failed": "❌ failed", "interrupted": "⚠️ interrupted", "not_started": "⏭️ not started"}


def _params(params: Any) -> str:
    if not params:
        return "none (notebook defaults)"
    if isinstance(params, dict):
        return ", ".join(f"{k}={fmt_value(v, 60)}" for k, v in params.items())
    return fmt_value(params, 200)


def commit_text(run: dict[str, Any]) -> str:
    """The kit commit of a run record, 12 digits, and whether the tree had uncommitted changes."""
    commit = run.get("kit_commit")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = run.get("kit_dirty")
    state = " + uncommitted changes (dirty)" if dirty else " (clean)" if dirty is False else ""
    return f"`{str(commit)[:12]}`{state}"


def _run_section(run: dict[str, Any], notebooks: int, timings: dict[str, Any]) -> list[str]:
    """Who ran what and when: the run record at the top of SUMMARY.md."""
    if not run:
        return ["> ⚠️ **No run record** (run.json is missing): the results below were not written by one recorded run "
                "of the runner, so none of them is presented as this run's. Run `make run-all` for a summary of one run.", ""]
    status = run.get("status") or "unknown"
    lines = [f"**Run `{cell(run.get('run_id'))}`** · `{cell(run.get('command', '?'))}` · "
             f"{RUN_STATUS.get(status, cell(status))}", ""]
    if status != "complete":
        nbs = run.get("notebooks") or {}
        done = sum(1 for n in nbs.values() if (n or {}).get("status") == "ok")
        what = {"interrupted": "was interrupted before it finished", "failed": "failed",
                "running": "has no finish time: it is still running or was killed"}.get(status, f"ended with status {status!r}")
        after = ("the failed notebooks' claims are `error`; the other notebooks' verdicts stand" if status == "failed"
                 else "claims of unfinished notebooks are `error`; nothing below is a complete result")
        lines += [f"> ⚠️ **This run {what}**: {done} of {len(nbs) or notebooks} notebooks finished ok; {after}.", ""]
    rows = [("run id", f"`{cell(run.get('run_id'))}`"), ("command", f"`{cell(run.get('command'))}`"),
            ("status", RUN_STATUS.get(status, cell(status))), ("started", cell(run.get("started") or "—")),
            ("finished", cell(run.get("finished") or "— (not finished)")), ("kit commit", commit_text(run)),
            ("parameters", f"`{cell(_params(run.get('parameters')))}`")]
    if timings and run_id_of(timings) == run.get("run_id") and timings.get("total_seconds") is not None:
        rows.append(("wall-clock", f"{fmt_value(timings['total_seconds'])} s, {timings.get('jobs', '?')} notebook(s) at a time"))
    return lines + ["| run | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]


def _pairs(values: Any) -> str:
    if not isinstance(values, dict) or not values:
        return ""
    return "; ".join(f"{k}={fmt_value(v)}" for k, v in values.items())


def _claim_row(nb: str, c: dict[str, Any]) -> str:
    verdict = c.get("verdict", "error")
    measured = _pairs(c.get("deciding")) or key_numbers(c.get("evidence"))
    if verdict in ("error", "skipped") and not c.get("deciding"):
        measured = " ".join(str(c.get("reason", "")).split())[:120] or measured
    return (f"| {cell(nb)} | `{cell(c.get('id', '?'))}` | {VERDICT_MARK.get(verdict, '')} {verdict} "
            f"| {cell(measured)} | {cell(_pairs(c.get('source')) or '—')} |")


def _claims_tables(results: list[dict[str, Any]], run: dict[str, Any], label: str) -> tuple[list[str], dict[str, int], int]:
    """Findings table, then environment checks; returns (lines, finding counts by verdict, checks)."""
    findings = [(r["notebook"], c) for r in results for c in r.get("claims", []) if c.get("kind") not in ("environment", "environment_check")]
    checks = [(r["notebook"], c) for r in results for c in r.get("claims", []) if c.get("kind") in ("environment", "environment_check")]
    counts: dict[str, int] = {}
    for _, c in findings:
        counts[c.get("verdict", "error")] = counts.get(c.get("verdict", "error"), 0) + 1
    head = [f"| notebook | claim | verdict | {label} | source report |", "|---|---|---|---|---|"]
    lines = head + [_claim_row(nb, c) for nb, c in findings]
    have = {r["notebook"] for r in results}
    for nb, info in sorted((run.get("notebooks") or {}).items()):
        info = info or {}
        if nb not in have:
            why = info.get("error") or {"not_started": "not started", "interrupted": "interrupted", "ok": "the notebook "
                                        "ran but wrote no results file"}.get(info.get("status"), "notebook failed")
            lines.append(f"| {cell(nb)} | — | ⚠️ error | no results file from this run: {cell(why)} | — |")
    if len(lines) == 2:
        lines.append("| — | no claims | | | |")
    lines.append("")
    if checks:
        lines += ["### Environment checks", "",
                  "Facts about the machine that ran the kit, not findings of a source report: never counted above.", "",
                  *head, *[_claim_row(nb, c) for nb, c in checks], ""]
    return lines, counts, len(checks)


def _notebook_runs(run: dict[str, Any], timings: dict[str, Any]) -> list[str]:
    nbs = run.get("notebooks") or {}
    if not nbs:
        return []
    same = timings and run_id_of(timings) == run.get("run_id")
    seconds = {t.get("notebook"): t.get("seconds") for t in (timings.get("notebooks") or []) if isinstance(t, dict)} if same else {}
    lines = ["## Notebooks in this run", "", "| notebook | status | seconds | parameters |", "|---|---|---|---|"]
    for nb, info in sorted(nbs.items()):
        info = info or {}
        status = NB_STATUS.get(info.get("status"), cell(info.get("status")))
        if info.get("error") and info["error"] != info.get("status"):
            status += f": {info['error']}"
        secs = info.get("seconds") if info.get("seconds") is not None else seconds.get(nb)
        lines.append(f"| {cell(nb)} | {cell(status)} | {fmt_value(secs) if secs is not None else '—'} "
                     f"| `{cell(_params(info.get('parameters') or run.get('parameters')))}` |")
    return lines + [""]


def _files(out: Path, folder: str, pattern: str, stems: set[str]) -> list[str]:
    where = out / folder
    found = sorted(where.glob(pattern)) if where.is_dir() else []
    return [f"{folder}/{p.name}" for p in found if any(p.stem == s or p.stem.startswith(s + "-") for s in stems)]


def _details(results: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for r in results:
        lines += [f"<details><summary><b>{r['notebook']}</b></summary>", ""]
        if r.get("load_error"):
            lines += [f"- results file unreadable: {r['load_error']}"]
        for c in r.get("claims", []):
            kind = " _(environment check)_" if c.get("kind") in ("environment", "environment_check") else ""
            lines += [f"- `{c.get('id')}`{kind} — {VERDICT_MARK.get(c.get('verdict'), '')} **{c.get('verdict')}**: "
                      f"{' '.join(str(c.get('statement', '')).split())}  ",
                      f"  _{' '.join(str(c.get('reason', '')).split())[:400]}_  ",
                      f"  evidence: `{fmt_value(c.get('evidence'), 600).replace('`', chr(39))}`"]
        lines += ["", "</details>", ""]
    return lines


def _earlier_sections(others: dict[str | None, list[dict[str, Any]]]) -> list[str]:
    lines: list[str] = []
    for rid, results in sorted(others.items(), key=lambda kv: str(kv[0])):
        started = next((r.get("run", {}).get("started") for r in results if isinstance(r.get("run"), dict)), None)
        if rid:
            lines += [f"## From an earlier run (run `{cell(rid)}`, started {cell(started or 'unknown')})", ""]
        else:
            lines += ["## From an earlier run (no run id: run by hand or by an older kit, time unknown)", ""]
        lines += ["These results files were not written by the run above: shown for reference only, never counted in "
                  "its tally. Run the notebooks again to bring them into one run.", ""]
        lines += _claims_tables(results, {}, "that run")[0] + _details(results)
    return lines


def _environment_section(results: list[dict[str, Any]], run_env: dict[str, Any] | None = None) -> list[str]:
    """The environment shared by every notebook once, then what differs per notebook."""
    envs = {r["notebook"]: r.get("environment") or {} for r in results} or {"run": run_env or {}}
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
    """The SUMMARY.md text for the run named in run.json under `out` (default outputs/)."""
    out = Path(out) if out else output_dir()
    run = load_run(out)
    timings = load_timings(out)
    current, others = split_by_run(load_results(out), run.get("run_id"))
    table, counts, n_checks = _claims_tables(current, run, "this run")
    findings = sum(counts.values())
    order = list(VERDICT_MARK)
    tally = ", ".join(f"{VERDICT_MARK.get(v, '')} {n} {v}" for v, n in sorted(
        counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))) or "no findings"
    checks = f"; {n_checks} environment check(s), listed separately" if n_checks else ""
    lines = [f"# {title}", "", *_run_section(run, len(current), timings)]
    lines += [f"**{len(current)} notebook(s) of this run, {findings} finding(s): {tally}{checks}.**"
              + (f" {sum(len(v) for v in others.values())} results file(s) from other runs are listed at the end, apart."
                 if others else ""), ""]
    lines += ["## Claims", "", "_this run_: the value(s) the verdict was computed from; _source report_: the source's "
              "value for the same quantity, where it gives one.", "", *table]
    lines += _notebook_runs(run, timings)
    if current or run.get("environment"):
        lines += _environment_section(current, run.get("environment"))
    stems = {r["notebook"] for r in current}
    figures, htmls = _files(out, "figures", "*.png", stems), _files(out, "html", "*.html", stems)
    if figures or htmls:
        lines += ["## Files to attach", "", "Not linked, so this text pastes cleanly into an issue: drag these files from "
                  "the outputs folder into the thread. The HTML files are self-contained (figures embedded).", ""]
        lines += [f"- `{name}`" for name in figures + htmls] + [""]
    lines += ["## Claim details", "", *_details(current)]
    lines += _earlier_sections(others)
    return scrub(truncate("\n".join(lines).rstrip() + "\n", what="SUMMARY.md"), out)


def write_summary(out: Path | None = None) -> Path:
    """Scrub machine paths from the files read, then write SUMMARY.md."""
    out = Path(out) if out else output_dir()
    scrub_outputs(out)
    path = out / "SUMMARY.md"
    path.write_text(build_summary(out))
    return path


# --------------------------------------------------------------------------- HTML

_IMG_SRC = re.compile(r"<img\b[^>]*?\bsrc\s*=\s*[\"']?(?!data:)([^\"'\s>]+)", re.IGNORECASE)


def external_images(html: str) -> list[str]:
    """src of every <img> that is not an embedded data: URI."""
    return _IMG_SRC.findall(html)


def environment_markdown(results: dict[str, Any], source: str) -> str:
    """The environment a notebook ran with (from its results file), as a Markdown block for the HTML's top."""
    env = results.get("environment") or {}
    run = results.get("run") if isinstance(results.get("run"), dict) else {}
    keys = [k for k in ENV_KEYS if k in env] + sorted(set(env) - set(ENV_KEYS))
    lines = [f"**Environment this notebook ran with** (from `{source}`, written by the notebook itself)", ""]
    if run.get("run_id"):
        lines += [f"Run `{run['run_id']}`, started {run.get('started') or '?'}, kit commit {commit_text(run)}", ""]
    else:
        lines += ["Not run by the kit's runner (no run id).", ""]
    lines += ["| | |", "|---|---|", *[f"| {k} | `{cell(fmt_value(env.get(k), 120))}` |" for k in keys]]
    return "\n".join(lines)


def render_html(notebook: Path, dest_dir: Path, results: dict[str, Any] | None = None) -> Path:
    """One executed notebook -> a self-contained HTML file (inline PNGs, Markdown images embedded), with
    the environment from its results file at the top (after the title cell) and machine paths scrubbed."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4)
    if results is not None:
        at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
        env_cell = nbformat.v4.new_markdown_cell(environment_markdown(results, f"results/{notebook.stem}.json"))
        if "id" in env_cell:
            env_cell["id"] = "kvkit-environment"  # a fixed id: the same run renders to the same HTML
        nb.cells.insert(at, env_cell)
    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"path": str(notebook.parent),
                                                                      "name": notebook.stem}})
    missing = external_images(body)
    if missing:  # an image nbconvert could not embed: say so rather than ship a broken link
        for src in missing:
            body = body.replace(f'src="{src}"', f'src="" alt="not embedded: {src}"')
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{notebook.stem}.html"
    path.write_text(scrub(body, dest_dir.parent), encoding="utf-8")
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
            results = _load_json(out / "results" / f"{nb.stem}.json")
            written.append(render_html(nb, out / "html", results))
        except Exception as exc:  # noqa: BLE001 - one unreadable notebook must not stop the others
            errors.append(scrub(f"{nb.stem}: {type(exc).__name__}: {exc}"[:300], out))
    return written, errors
