"""outputs/SUMMARY.md: the run named in run.json, headline counts per claim kind, one section per source,
and the one file to attach (share.zip). Paste-safe by construction (helpers.pipeline.report.paste): references
and @names in code spans, whole cell values, no JSON, under GitHub's comment limit.

Rebuilt from what is on disk, so `python -m helpers.pipeline.run report` can be rerun at any time.
Results files of any other run (or of none) are shown in "From an earlier run" sections, never counted.
"""
from __future__ import annotations

import json
import re
from html import escape as html_escape
from pathlib import Path
from typing import Any

from .claims_md import (all_claims, by_source, claims_table, counts_table, environment_checks, headline, kind_counts,
                        source_section, statements)
from .first_screen import first_screen
from .statements import statements as source_statements
from .paste import MAX_CHARS, cell, code, code_refs, fmt_scalar, one_line
from ..paths import output_dir
from .records import RUN_STATUS, env_keys, load_json, load_results, run_id_of, split_by_run
from .scrub import scrub, scrub_outputs
from .share import ARCHIVE, current_stems, share_members, write_share

MODEL_KEYS = ("model_id", "model_revision", "dtype", "attn_implementation", "device")
NB_STATUS = {"ok": "✅ ok", "failed": "❌ failed", "interrupted": "⚠️ interrupted", "not_started": "⏭️ not started"}


def short(value: Any, limit: int = 60) -> str:
    """A value for a cell, whole: a scalar, or a list/dict named by its size."""
    if isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(", ", ": "), default=str)
        return text if len(text) <= limit else f"({len(value)} values, in the results file)"
    text = fmt_scalar(value)
    return text if len(text) <= limit else "(long: in the results file)"


def params_text(params: dict[str, Any]) -> str:
    """A run's or notebook's parameters as `k=v, ...` (the runner records them as a dict)."""
    return ", ".join(f"{k}={short(v)}" for k, v in params.items()) if params else "none (notebook defaults)"


def commit_text(run: dict[str, Any]) -> str:
    """The kit commit of a run record, 12 digits, and whether the tree had uncommitted changes."""
    commit = run.get("kit_commit")
    if not commit:
        return "unknown (not a git checkout)"
    dirty = run.get("kit_dirty")
    state = " + uncommitted changes (dirty)" if dirty else " (clean)" if dirty is False else ""
    return f"`{str(commit)[:12]}`{state}"


def run_section(run: dict[str, Any], notebooks: int, timings: dict[str, Any]) -> list[str]:
    """Who ran what and when: the run record at the top."""
    if not run:
        return ["> ⚠️ **No run record** (run.json is missing): the results below were not written by one recorded run "
                "of the runner, so none of them is presented as this run's. Run `make run-all` for a summary of one run.", ""]
    status = run.get("status") or "unknown"
    lines = [f"**Run {code(run.get('run_id'))}** · {code(run.get('command', '?'))} · {RUN_STATUS.get(status, cell(status))}", ""]
    if status != "complete":
        nbs = run.get("notebooks") or {}
        done = sum(1 for n in nbs.values() if n.get("status") == "ok")
        what = {"interrupted": "was interrupted before it finished", "failed": "failed",
                "running": "has no finish time: it is still running or was killed"}.get(status, f"ended with status {status!r}")
        after = ("the failed notebooks' claims are `error`; the other notebooks' verdicts stand" if status == "failed"
                 else "claims of unfinished notebooks are `error`; nothing below is a complete result")
        lines += [f"> ⚠️ **This run {what}**: {done} of {len(nbs) or notebooks} notebooks finished ok; {after}.", ""]
    rows = [("run id", code(run.get('run_id'))), ("command", code(run.get('command'))),
            ("status", RUN_STATUS.get(status, cell(status))), ("started", cell(run.get("started") or "—")),
            ("finished", cell(run.get("finished") or "— (not finished)")), ("kit commit", commit_text(run)),
            ("parameters", code(params_text(run.get('parameters'))))]
    if timings and run_id_of(timings) == run.get("run_id") and timings.get("total_seconds") is not None:
        rows.append(("wall-clock", f"{fmt_scalar(timings['total_seconds'])} s, {timings.get('jobs', '?')} notebook(s) at a time"))
    return lines + ["| run | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]


def missing_notebooks(results: list[dict[str, Any]], run: dict[str, Any]) -> list[str]:
    """Notebooks of the run that left no results file of this run, with why."""
    have = {r["notebook"] for r in results}
    lines = []
    for nb, info in sorted((run.get("notebooks") or {}).items()):
        info = info or {}
        if nb not in have:
            why = info.get("error") or {"not_started": "not started", "interrupted": "interrupted", "ok": "the notebook "
                                        "ran but wrote no results file"}.get(info.get("status"), "notebook failed")
            lines.append(f"- {code(nb)} ⚠️ error: no results file from this run: {code_refs(one_line(why))}")
    return ["## Notebooks without results", "", *lines, ""] if lines else []


def notebook_runs(run: dict[str, Any]) -> list[str]:
    """Each notebook of the run: its status, seconds and parameters."""
    nbs = run.get("notebooks") or {}
    if not nbs:
        return []
    lines = ["## Notebooks in this run", "", "| notebook | status | seconds | parameters |", "|---|---|---|---|"]
    for nb, info in sorted(nbs.items()):
        status = NB_STATUS.get(info.get("status"), cell(info.get("status")))
        if info.get("error") and info["error"] != info.get("status"):
            status += f": {info['error']}"
        secs = info.get("seconds")
        lines.append(f"| {cell(nb)} | {cell(status)} | {fmt_scalar(secs) if secs is not None else '—'} "
                     f"| {code(params_text(info.get('parameters') or run.get('parameters')))} |")
    return lines + [""]


def captured_warnings(results: list[dict[str, Any]]) -> list[str]:
    """transformers' warnings captured by helpers.session (kept out of the cells), once each, with where."""
    seen: dict[str, list[str]] = {}
    for r in results:
        for w in r.get("warnings") or []:
            seen.setdefault(one_line(w), []).append(r["notebook"].split("_", 1)[0])
    if not seen:
        return []
    return ["transformers warnings captured during the run (kept out of the notebooks' cells):", "",
            *[f"- {code_refs(w)} _(notebook{'s' if len(set(nbs)) > 1 else ''} {', '.join(dict.fromkeys(nbs))})_" for w, nbs in seen.items()], ""]


def environment_section(results: list[dict[str, Any]], run_env: dict[str, Any] | None = None) -> list[str]:
    """The environment shared by every notebook once, then what differs per notebook, then captured warnings."""
    envs = {r["notebook"]: r.get("environment") or {} for r in results} or {"run": run_env or {}}
    shared, varying = [], []
    for key in env_keys(list(envs.values())):
        values = {json.dumps(e.get(key), sort_keys=True) for e in envs.values()}
        (shared if len(values) == 1 else varying).append(key)
    first = next(iter(envs.values()), {})
    lines = ["## Environment", "", "| | |", "|---|---|", *[f"| {k} | {code(short(first.get(k), 120))} |" for k in shared]]
    if varying:
        cols = [k for k in MODEL_KEYS if k in varying] + [k for k in varying if k not in MODEL_KEYS]
        lines += ["", "Differs between notebooks:", "", "| notebooks | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        rows: dict[str, list[str]] = {}  # one row per distinct set of values, its notebooks by number
        for nb, env in envs.items():
            rows.setdefault(" | ".join(code(short(env.get(k))) for k in cols), []).append(nb.split("_", 1)[0])
        lines += [f"| {', '.join(nbs)} | {values} |" for values, nbs in rows.items()]
    return lines + ["", *captured_warnings(results)]


def attach_section(out: Path, stems: set[str]) -> list[str]:
    names = [n for n in share_members(out, stems) if n not in ("SUMMARY.md", "run.json", "timings.json")]
    html, figs, res, repro = (sum(n.startswith(f"{folder}/") for n in names) for folder in ("html", "figures", "results",
                                                                                            "repro"))
    return ["## Attach", "", f"Attach one file: **`{ARCHIVE}`** from the outputs folder (GitHub does not accept `.html`). "
            f"It holds this summary, {html} self-contained HTML page(s), {figs} figure(s), {res} results file(s) "
            f"with every measured value, {repro} repro(s) and the run record (run.json; timings.json once the runner "
            "has written it).", ""]


def earlier_sections(others: dict[str | None, list[dict[str, Any]]]) -> list[str]:
    lines: list[str] = []
    for rid, results in sorted(others.items(), key=lambda kv: str(kv[0])):
        started = next((r["run"].get("started") for r in results if r.get("run")), None)
        lines += [f"## From an earlier run (run {code(rid)}, started {cell(started or 'unknown')})" if rid else
                  "## From an earlier run (no run id: run by hand or by an older kit, time unknown)", "",
                  "Not written by the run above: shown for reference only, never counted. Run the notebooks again to "
                  "bring them into one run.", "", *claims_table(all_claims(results), "that run"),
                  *statements(all_claims(results), "Statements and reasons")]
    return lines


def truncate(text: str, limit: int = MAX_CHARS, what: str = "this report") -> str:
    """Cut text at a line boundary so that it, with a note saying so, stays under `limit` chars."""
    if len(text) < limit:
        return text
    note = (f"\n\n> **Truncated:** {what} was {len(text):,} characters; cut to stay under {limit:,}. "
            f"Everything is in the JSON files next to it (and in `{ARCHIVE}`).\n")
    cut = text[: limit - len(note) - 40]
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    if cut.count("```") % 2:  # never leave a code fence open
        cut += "\n```"
    cut += "\n\n</details>" * max(0, cut.count("<details>") - cut.count("</details>"))
    return cut + note


def details(summary: str, body: list[str]) -> list[str]:
    """Lines folded into one <details> block (nothing when there is nothing to fold); the summary's code spans as
    <code> (Markdown is not rendered inside <summary>, and a reference there must stay out of GitHub's linker)."""
    summary = re.sub(r"`([^`]*)`", lambda m: "<code>" + html_escape(m.group(1)) + "</code>", code_refs(summary))
    return ["<details><summary>" + summary + "</summary>", "", *body, "</details>", ""] if body else []


def build_summary(out: Path) -> str:
    """The SUMMARY.md text for the run named in run.json under `out`: the first screen (verdicts, releases, repros),
    then everything else in <details> sections."""
    run, timings = load_json(out / "run.json"), load_json(out / "timings.json")
    current, others = split_by_run(load_results(out), run.get("run_id"))
    claims = all_claims(current)
    counts = kind_counts(claims)
    screen, folded = first_screen(out, run, current)
    lines = ["# KV resume kit: results", "", *screen]
    for summary_text, block in folded:
        lines += details(summary_text, block)
    if others:
        lines += [f"{sum(len(v) for v in others.values())} results file(s) from other runs are listed at the end, apart.", ""]
    head = headline(counts, len(current), source_statements(claims))  # pooled over sources: here, never on the screen
    record = [*run_section(run, len(current), timings), "## Counts per kind", "", head, "", *counts_table(counts), ""]
    if current or run:
        record += attach_section(out, {r["notebook"] for r in current})
    lines += details("Run record, counts per kind, attach", record)
    for source, results in by_source(current):
        lines += details(f"{source.title}: every claim, its quote and its verdict", source_section(source, results))
    rest = environment_checks(current) + missing_notebooks(current, run) + notebook_runs(run)
    if current or run.get("environment"):
        rest += environment_section(current, run.get("environment"))
    lines += details("Environment, notebooks, captured warnings", rest)
    lines += details("From earlier runs (never counted)", earlier_sections(others))
    return scrub(truncate("\n".join(lines).rstrip() + "\n", what="SUMMARY.md"), out)


def first_screen_of(text: str) -> str:
    """Everything before the first <details>: what a reader sees without opening anything."""
    return text.split("<details>", 1)[0]


def write_summary(out: Path | None = None) -> Path:
    """Scrub machine paths from the files read, write SUMMARY.md, then share.zip beside it."""
    out = Path(out) if out else output_dir()
    scrub_outputs(out)
    path = out / "SUMMARY.md"
    path.write_text(build_summary(out))
    write_share(out, current_stems(out))
    return path
