"""outputs/bisect/<notebook>-<claim or key>.md and .json: the change points, every release tried, the
releases that could not be installed, and the source diff of the notebook's relevant functions."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .search import Search
from .upstream_code import changed_lines
from ..report.paste import cell, fmt_compact
from ..report.scrub import scrub


def shown(value: Any) -> str:
    """A value as the report writes it; a KEY's several paths as their distinct values (×n when repeated)."""
    if isinstance(value, dict) and value:
        texts = [json.dumps(v, separators=(",", ":"), default=str) for v in value.values()]
        counts = {t: texts.count(t) for t in dict.fromkeys(texts)}
        return ", ".join(t + (f" (×{n})" if n > 1 else "") for t, n in counts.items()) + f" over {len(texts)} paths"
    return fmt_compact(value, 120)


def summary(search: Search, what: str) -> list[str]:
    """One line per change point (or why there is none)."""
    if search.interrupted and not search.changes:
        return [f"Interrupted before a change point of {what} was found; the releases tried are listed below."]
    if not search.changes:
        if sum(p.ok for p in search.tried()) < 2:
            return ["Fewer than two releases gave a value: nothing to compare."]
        return [f"{what} is the same on the first and the last release that ran (a change and its reversal "
                "between them would not be seen)."]
    lines = [f"- **{first}** is the first release where {what} differs from {last}: "
             f"`{cell(shown(search.probes[last].value))}` → `{cell(shown(search.probes[first].value))}`"
             for last, first in search.changes]
    if len(search.changes) > 1:
        lines.append(f"- the value is not monotonic: it changes {len(search.changes)} times")
    return lines


def to_json(search: Search, meta: dict[str, Any], diffs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The bisect as data: its arguments, status, change points with their diffs, every release tried."""
    return {**meta, "status": "interrupted" if search.interrupted else "complete",
            "notebook_runs": search.runs, "releases_considered": search.releases,
            "changes": [{"last_same": a, "first_different": b, "value_before": search.probes[a].value,
                         "value_after": search.probes[b].value, "source_diff": diffs.get(f"{a}..{b}", {})}
                        for a, b in search.changes],
            "tried": [{"release": p.release, "ok": p.ok, "value": p.value, "reason": p.reason, "seconds": p.seconds}
                      for p in search.tried()],
            "not_installable": {r: why for r, why in search.skipped.items() if not why.startswith("notebook")}}


def to_markdown(data: dict[str, Any]) -> str:
    """The bisect's .md: result first, then the diffs, then every release tried."""
    what = data["what"]
    lines = [f"# bisect: {cell(data['notebook'])} · {cell(what)}", "",
             f"GOOD {data['good']} · BAD {data['bad']} · {len(data['releases_considered'])} release(s) between them "
             f"(inclusive) · {data['notebook_runs']} notebook run(s) · {fmt_compact(data.get('seconds'))} s · {data['status']}", ""]
    if data["status"] == "interrupted":
        lines += ["> ⚠️ **Interrupted**: what was measured before the stop is kept below.", ""]
    lines += ["## Result", ""]
    lines += [*(data.get("summary") or []), ""]
    for change in data["changes"]:
        a, b = change["last_same"], change["first_different"]
        lines += [f"## Source diff {a} → {b}", ""]
        diffs = change["source_diff"]
        unchanged = [n for n, d in diffs.items() if d["status"] == "same"]
        if not diffs:
            lines += ["No source diff was recorded (the functions are named by the notebook's finding, helpers.findings).", ""]
        for name, d in ((n, d) for n, d in diffs.items() if d["status"] not in ("same", "unreadable")):
            quote = d.get("quote") or changed_lines(d["diff"])
            lines += [f"### `{name}` ({d['status']})", ""] + [f"    {q}" for q in quote] + ["", "```diff", d["diff"].rstrip(), "```", ""]
        if unchanged:
            lines += ["Unchanged: " + ", ".join(f"`{n}`" for n in unchanged), ""]
        if diffs and not any(d["status"] in ("changed", "added", "removed") for d in diffs.values()):
            lines += ["None of the named functions changed between these releases: the change is elsewhere.", ""]
    lines += ["## Releases tried", "", "| release | value | note |", "|---|---|---|"]
    for row in data["tried"]:
        value = f"`{cell(shown(row['value']))}`" if row["ok"] else "—"
        note = cell(row["reason"]) if not row["ok"] else f"{fmt_compact(row['seconds'])} s"
        lines.append(f"| {row['release']} | {value} | {note} |")
    lines.append("")
    if data["not_installable"]:
        lines += ["## Not installable here (skipped, never guessed)", ""]
        lines += [f"- {r}: {cell(why)}" for r, why in data["not_installable"].items()] + [""]
    return "\n".join(lines)


def write(out: Path, stem: str, data: dict[str, Any]) -> tuple[Path, Path]:
    """Both files, machine paths scrubbed."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    js.write_text(scrub(json.dumps(data, indent=2, default=str), out.parent) + "\n")
    md.write_text(scrub(to_markdown(data), out.parent))
    return md, js
