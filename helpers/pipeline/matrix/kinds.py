"""matrix.md's "Changes by kind of value": behaviour differences one line per kind of value (shape, None vs a value,
boolean, ...), floats and source locations collapsed to one line per notebook (verdict changes: "What changed" and
"Verdicts that change")."""
from __future__ import annotations

import json
import re
from typing import Any, Iterator

from .facts import _ABSENT, KINDS, LARGE_FLOAT, _leaf, classify, differences, distinct_texts, group_differences, relative_size
from ..report.paste import cell, fmt_compact


def _incomplete(ran: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """notebook -> releases on which it stopped early (some claim left `error`)."""
    out: dict[str, set[str]] = {}
    for rel, res in ran.items():
        for nb, data in res.items():
            if any(c.get("verdict") == "error" for c in data.get("claims", [])):
                out.setdefault(nb, set()).add(rel)
    return out


def _not_recorded(values: dict[str, Any], stopped: set[str]) -> bool:
    """Absent only where the notebook stopped early, and the same wherever it was recorded."""
    absent = {rel for rel, v in values.items() if v is _ABSENT}
    present = {json.dumps(v, sort_keys=True, default=str) for v in values.values() if v is not _ABSENT}
    return bool(absent) and absent <= stopped and len(present) <= 1


def judged_differences(ran: dict[str, dict[str, Any]]) -> Iterator[tuple[str, str, dict, dict, str]]:
    """(notebook, key, values, judged, kind) of each differing value but a release's own version number and the
    verdicts: judged leaves out the releases that stopped before reaching it; kind is "not recorded" or classify's."""
    stopped = _incomplete(ran)
    for nb, items in differences(ran).items():
        halted = stopped.get(nb, set())
        for key, values in items:
            if all(v == rel for rel, v in values.items()) or re.fullmatch(r"claims\..*\.verdict", key):
                continue
            judged = {rel: v for rel, v in values.items() if not (v is _ABSENT and rel in halted)}
            yield nb, key, values, judged, "not recorded" if _not_recorded(values, halted) else classify(key, judged)


def sort_differences(ran: dict[str, dict[str, Any]]) -> tuple[dict, dict, dict]:
    """(behaviour {(kind, nb, leaf): rows}, floats {nb: [(relative size, key)]}, collapsed {nb: {what: [keys]}})."""
    behaviour: dict[tuple[str, str, str], list[tuple[str, dict[str, Any]]]] = {}
    floats: dict[str, list[tuple[float, str]]] = {}
    collapsed: dict[str, dict[str, list[str]]] = {}
    for nb, key, values, judged, kind in judged_differences(ran):
        shown = {t for v, t in zip(judged.values(), distinct_texts(list(judged.values()))) if v is not _ABSENT}
        if kind != "not recorded" and len(shown) == 1 and _ABSENT not in judged.values():
            continue  # the same text on every release: never listed as a difference
        if kind == "float":
            size = relative_size([v for v in judged.values() if v is not _ABSENT]) or 0.0
            floats.setdefault(nb, []).append((size, key))
        elif kind in COLLAPSED:
            collapsed.setdefault(nb, {}).setdefault(kind, []).append(key)
        else:
            behaviour.setdefault((kind, nb, _leaf(key)), []).append((key, values))
    return behaviour, floats, collapsed


COLLAPSED = {"source location": "source line number(s) in transformers moved",
             "environment": "environment value(s) differ",
             "not recorded": "value(s) not recorded where the notebook stopped early (see Verdicts)"}


def _behaviour_line(kind: str, nb: str, leaf: str, rows: list[tuple[str, dict[str, Any]]], per: int = 4) -> str:
    """One behaviour line: each release's distinct values (at most `per`) and the first paths that hold them."""
    distinct: dict[str, dict[str, Any]] = {}
    for _, values in rows:
        for rel, value in values.items():
            distinct.setdefault(rel, {}).setdefault(json.dumps(value, default=str), value)
    per_release = {rel: list(vals.values()) for rel, vals in distinct.items()}
    texts = " · ".join(f"{rel}: " + ", ".join(f"`{t}`" for t in distinct_texts(vals[:per]))
                       + (f" (+{len(vals) - per})" if len(vals) > per else "") for rel, vals in per_release.items())
    groups = group_differences(rows)
    where = ", ".join(f"`{k}`" for k, _ in groups[:2]) + (f" and {len(groups) - 2} more" if len(groups) > 2 else "")
    return f"- **{cell(nb)}** · {kind} · `{cell(leaf)}` — {texts} (in {where})"


def detail_section(ran: dict[str, dict[str, Any]], max_lines: int = 40) -> list[str]:
    """"Changes by kind of value" (`ran`: the releases with results): behaviour differences (one line per value,
    grouped by what it is), then float and source-location differences collapsed to one line per notebook."""
    if len(ran) < 2:
        return []
    lines = ["## Changes by kind of value", ""]
    behaviour, floats, collapsed = sort_differences(ran)
    lines += ["### Behaviour", "",
              "Values that are not float noise: shapes, None vs a value, booleans, error types, source facts, counts, text.", ""]
    ordered = sorted(behaviour.items(), key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1]))
    lines += [_behaviour_line(*head, rows) for head, rows in ordered[:max_lines]] or ["None."]
    if len(ordered) > max_lines:
        lines.append(f"- … and {len(ordered) - max_lines} more (see Differences below)")
    lines += ["", "### Float differences (one line per notebook)", ""]
    for nb, found in floats.items():
        worst, key = max(found)
        large = sum(1 for size, _ in found if size > LARGE_FLOAT)
        note = f"; {large} of them above {LARGE_FLOAT:g} relative (see Differences)" if large else ""
        lines.append(f"- {cell(nb)}: {len(found)} float value(s) differ; largest relative difference "
                     f"{fmt_compact(worst)} (`{cell(key)}`){note}")
    lines += [] if floats else ["None."]
    if collapsed:
        lines += ["", "### Also different (collapsed)", ""]
        for nb, kinds in collapsed.items():
            for kind, keys in kinds.items():
                names = ", ".join(list(dict.fromkeys(f"`{_leaf(k)}`" for k in keys))[:6])
                lines.append(f"- {cell(nb)}: {len(keys)} {COLLAPSED[kind]} ({names})")
    return lines + [""]
