"""matrix.md's first section, "What changed between releases": one line per behaviour change, i.e. per notebook and
release boundary, naming the boundary, the verdicts that flip there and the values that change there (grouped by
what they are, helpers.pipeline.releases.facts.classify); a value whose displayed text is the same on both sides is no
change. Float noise, moved source lines, environment values and values a notebook never reached are left to
"Differences", which lists every differing value."""
from __future__ import annotations

import json
import re
from typing import Any, Iterator, Sequence

from .facts import _ABSENT, _leaf, _sig, classify, differences, distinct_texts
from ..report.paste import VERDICT_MARK, cell


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
    present = {_sig(v) for v in values.values() if v is not _ABSENT}
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


MAX_LINES = 12
_LEFT_OUT = {"float", "source location", "environment", "not recorded"}  # listed in "Differences" only


def _kit_skew(ran: dict[str, dict[str, Any]]) -> list[str]:
    """A warning when the releases' results were written by different kit versions (or runs)."""
    kits = {}
    for rel, res in ran.items():
        runs = [d.get("run") for d in res.values() if isinstance(d.get("run"), dict)]
        kits[rel] = sorted({f"{(r.get('kit_commit') or '?')[:12]}{' (dirty)' if r.get('kit_dirty') else ''}" for r in runs})
    if len({json.dumps(k) for k in kits.values()}) <= 1:
        return []
    return ["> ⚠️ **The releases ran different versions of the kit**: "
            + "; ".join(f"{rel}: {', '.join(k) or 'unknown'}" for rel, k in kits.items())
            + ". Some differences below may come from the kit, not from transformers: rerun the matrix in one go.", ""]


def _shown(value: Any) -> str:
    """How matrix.md writes one value (what a reader compares)."""
    return distinct_texts([value])[0]


_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")


def _changes(key: str, old: Any, new: Any) -> bool:
    """A behaviour change between two adjacent releases: shown differently, and not float noise there (floats,
    or the same value around different floats: `matches 4.8e-07` → `matches 6.6e-07`, `[null, 0.12]` → ...)."""
    if _shown(old) == _shown(new) or classify(key, {"a": old, "b": new}) in _LEFT_OUT:
        return False
    masked = [_FLOAT.sub("#", json.dumps(v, sort_keys=True, default=str)) for v in (old, new)]
    return masked[0] != masked[1]


def _verdict_items(nb: str, per_release: dict[str, dict[str, Any]], a: str, b: str) -> list[str]:
    """'`claim` ✅ reproduced → ❌ not_reproduced' for each claim of nb whose verdict differs between a and b."""
    def verdicts(rel: str) -> dict[str, str]:
        return {c.get("id"): c.get("verdict", "error") for c in per_release[rel][nb].get("claims", [])}
    old, new = verdicts(a), verdicts(b)
    return [f"`{cell(cid)}` {VERDICT_MARK.get(old[cid], '')} {old[cid]} → {VERDICT_MARK.get(new[cid], '')} {new[cid]}"
            for cid in old if cid in new and old[cid] != new[cid]]


def _side(texts: list[str]) -> str:
    if len(texts) <= 2:
        return ", ".join(f"`{cell(t)}`" for t in texts)
    return f"{len(texts)} values (`{cell(texts[0])}`, …)"


def _value_items(rows: list[tuple[str, str, str]], per: int = 3) -> list[str]:
    """'`leaf` old → new' per leaf (the paths of one kind of value together, ×n when several); at most `per`."""
    grouped: dict[str, list[tuple[str, str]]] = {}
    for key, old, new in rows:
        grouped.setdefault(_leaf(key), []).append((old, new))
    items = []
    for leaf, pairs in grouped.items():
        olds, news = (list(dict.fromkeys(p[i] for p in pairs)) for i in (0, 1))
        items.append(f"`{cell(leaf)}` {_side(olds)} → {_side(news)}" + (f" (×{len(pairs)})" if len(pairs) > 1 else ""))
    return items[:per] + ([f"+{len(items) - per} more value(s)"] if len(items) > per else [])


def boundary_changes(ran: dict[str, dict[str, Any]], order: Sequence[str]) -> list[tuple[str, str, str, list[str]]]:
    """[(notebook, release before, release after, items)] for every notebook and adjacent pair of the releases
    that ran it where a verdict or a behaviour value (as displayed) changes."""
    releases = [r for r in order if r in ran]
    had = {nb: [r for r in releases if nb in ran[r]] for nb in sorted({nb for res in ran.values() for nb in res})}
    rows: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {}
    for nb, key, _, judged, kind in judged_differences(ran):
        if len(judged) < 2 or kind in _LEFT_OUT:
            continue
        for a, b in zip(had[nb], had[nb][1:]):
            if a in judged and b in judged and _changes(key, judged[a], judged[b]):
                rows.setdefault((nb, a, b), []).append((key, _shown(judged[a]), _shown(judged[b])))
    out = [(nb, a, b, _verdict_items(nb, ran, a, b) + _value_items(rows.get((nb, a, b), [])))
           for nb, rels in had.items() for a, b in zip(rels, rels[1:])]
    return sorted([row for row in out if row[3]], key=lambda row: (releases.index(row[1]), row[0]))


def change_section(ran: dict[str, dict[str, Any]], releases: Sequence[str], max_lines: int = MAX_LINES) -> list[str]:
    """"What changed between releases" (`ran`: the releases with results): one line per notebook and release
    boundary (at most `max_lines`)."""
    lines = ["## What changed between releases", ""]
    if len(ran) < 2:
        return lines + ["Fewer than two releases produced results: nothing to compare.", ""]
    lines += _kit_skew(ran)
    changes = boundary_changes(ran, releases)
    lines += [f"- **{a} → {b}** · {cell(nb)}: " + "; ".join(items) for nb, a, b, items in changes[:max_lines]]
    if len(changes) > max_lines:
        lines.append(f"- … and {len(changes) - max_lines} more (see Differences)")
    if not changes:
        lines.append("No verdict and no behaviour value changes between the releases that ran (floats and moved "
                     "source lines: see below).")
    return lines + ["", "Floats, moved source lines and environment values: \"Differences\" below.", ""]
