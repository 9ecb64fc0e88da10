"""outputs/matrix.md: the run, "What changed" (kinds), the releases, every verdict, every difference."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .envs import pinned_release
from .kinds import change_section
from .facts import differences, distinct_texts, group_differences
from ..paths import output_dir
from ..report.summary import commit_text, truncate
from ..report.paste import VERDICT_MARK, cell, fmt_compact
from ..report.records import RUN_STATUS, load_json
from ..report.scrub import scrub

DEFAULT_RELEASES = (  # the default matrix (the Makefile's RELEASES)
    "5.14.1", "5.17.0", "5.19.0", "5.20.0", "5.24.0", "5.25.0")


def _load_release(out_base: Path, release: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    dest = out_base / "matrix" / release
    info = load_json(dest / "release.json") or {"release": release, "ok": False, "reason": "not run (no release.json)"}
    loaded = {path.stem: load_json(path) for path in sorted((dest / "results").glob("*.json"))}
    return info, {stem: data for stem, data in loaded.items() if data}


def _matrix_run(out_base: Path) -> list[str]:
    """The matrix's run record (outputs/matrix/run.json, written by the runner) in one line; loud unless complete."""
    run = load_json(out_base / "matrix" / "run.json")
    if not run:
        return []
    status = run.get("status") or "unknown"
    line = (f"**Matrix run `{cell(run.get('run_id'))}`** · {RUN_STATUS.get(status, cell(status))} · started "
            f"{cell(run.get('started') or '?')}, finished {cell(run.get('finished') or '— (not finished)')} · "
            f"kit commit {commit_text(run)}")
    out = [line, ""]
    if status != "complete":
        out += [f"> ⚠️ **This matrix run is {status}**: releases or notebooks missing below were not run to the end.", ""]
    return out


def build_matrix(out_base: Path, releases: Sequence[str], max_diff_lines: int = 80) -> str:
    pinned = pinned_release()
    loaded = {rel: _load_release(out_base, rel) for rel in releases}
    ran = {rel: res for rel, (info, res) in loaded.items() if res}
    heads = [f"{rel} (pinned)" if rel == pinned else rel for rel in releases]

    rows: dict[tuple[str, str], dict[str, str]] = {}
    for rel, (_, res) in loaded.items():
        for nb, data in res.items():
            for claim in data.get("claims", []):
                rows.setdefault((nb, claim.get("id")), {})[rel] = claim.get("verdict", "error")
    lines = ["# transformers release matrix", "",
             "Every notebook's claims on each transformers release (same torch, same machine). The first section "
             "says what changed; the tables after it hold every verdict and every differing value.", ""]
    lines += _matrix_run(out_base)
    lines += change_section(ran, releases)

    lines += ["## Releases", "", "| release | status | transformers / tokenizers / huggingface-hub | environment | run |",
              "|---|---|---|---|---|"]
    for rel, head in zip(releases, heads):
        info, res = loaded[rel]
        v = info.get("versions") or {}
        if not info.get("ok"):
            status = f"❌ not installed: {info.get('reason', '?')}"
        elif info.get("rc") == 0:
            status = "✅ ran"
        else:
            status = f"⚠️ ran, run-all exit {info.get('rc')}"
        vers = " / ".join(str(v.get(k, "—")) for k in ("transformers", "tokenizers", "huggingface-hub")) if v else "—"
        where = "—"
        if info.get("python"):
            where = ("reused " if info.get("reused") else "built ") + f"`{cell(Path(info['python']).parent.parent.name)}`"
            if extra := [i for i in info.get("installed", []) if not i.startswith("transformers==")]:
                where += " + " + ", ".join(f"`{cell(i)}`" for i in extra)
        run = f"{fmt_compact(info.get('run_seconds'))} s" if info.get("run_seconds") is not None else "—"
        lines.append(f"| {head} | {cell(status)} | {cell(vers)} | {where} | {run} |")
    lines.append("")

    lines += ["## Verdicts", "", "Rows marked **Δ** have a verdict that differs between releases.", "",
              "| Δ | notebook | claim | " + " | ".join(heads) + " |",
              "|---|---|---|" + "---|" * len(heads)]
    for (nb, cid), verdicts in rows.items():
        cells = []
        for rel in releases:
            info, res = loaded[rel]
            if rel in verdicts:
                cells.append(f"{VERDICT_MARK.get(verdicts[rel], '')} {verdicts[rel]}")
            elif not info.get("ok"):
                cells.append("not installed")
            else:
                cells.append("no result" if nb not in res else "claim absent")
        differs = len({c for c in cells if c != "not installed"}) > 1
        lines.append(f"| {'**Δ**' if differs else ''} | {cell(nb)} | `{cell(cid)}` | " + " | ".join(cells) + " |")
    if not rows:
        lines.append("| | — | no results | " + " | ".join("—" for _ in releases) + " |")
    lines.append("")

    lines += ["## Differences", "",
              "Evidence, measurements and environment values (besides the transformers version) that are "
              "not the same in every release that ran the notebook.", ""]
    diffs = differences(ran)
    if len(ran) < 2:
        lines += ["Fewer than two releases produced results: nothing to compare.", ""]
    elif not diffs:
        lines += ["None: every recorded value is identical across releases.", ""]
    for nb, items in diffs.items():
        groups = group_differences(items)
        lines += [f"### {nb}", "", f"{len(items)} differing value(s).", ""]
        for key, values in groups[:max_diff_lines]:
            texts = distinct_texts(list(values.values()))
            vals = " · ".join(f"{rel}: `{text}`" for rel, text in zip(values, texts))
            lines.append(f"- `{key}` — {vals}")
        if len(groups) > max_diff_lines:
            lines.append(f"- … and {len(groups) - max_diff_lines} more (see outputs/matrix/<release>/results/{nb}.json)")
        lines.append("")
    return truncate("\n".join(lines).rstrip() + "\n", what="matrix.md")


def write_matrix(out_base: Path | None = None, releases: Sequence[str] = DEFAULT_RELEASES) -> Path:
    out_base = Path(out_base) if out_base else output_dir()
    path = out_base / "matrix.md"
    path.write_text(scrub(build_matrix(out_base, releases), out_base))
    return path
