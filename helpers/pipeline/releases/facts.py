"""The values matrix.md compares: each notebook's results flattened to dotted keys, the keys whose value
differs between releases, list rows grouped, values written distinctly, and what kind each difference is."""
from __future__ import annotations

import json
import re
from typing import Any

from ..report.paste import fmt_compact


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts (and lists of dicts) as dotted keys; other lists stay whole values."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items()
                for k, v in flatten(sub, f"{prefix}.{key}" if prefix else str(key)).items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return {k: v for i, sub in enumerate(value) for k, v in flatten(sub, f"{prefix}[{i}]").items()}
    return {prefix: value}


def notebook_facts(data: dict[str, Any]) -> dict[str, Any]:
    facts = {f"environment.{k}": v for k, v in (data.get("environment") or {}).items() if k != "transformers"}
    for claim in data.get("claims", []):
        facts[f"claims.{claim.get('id')}.verdict"] = claim.get("verdict")
        facts.update(flatten(claim.get("evidence") or {}, f"claims.{claim.get('id')}.evidence"))
    facts.update(flatten(data.get("measurements") or {}, "measurements"))
    return facts


_ABSENT = object()


def _sig(value: Any) -> str:
    """A value as releases compare it: its JSON (keys sorted), or a mark that it is absent."""
    return "\0absent" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)


def differences(per_release: dict[str, dict[str, dict[str, Any]]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """notebook -> [(key, {release: value})] for every key whose value is not the same in every
    release that ran that notebook (a key missing in one release counts as a difference)."""
    notebooks = sorted({nb for res in per_release.values() for nb in res})
    diffs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for nb in notebooks:  # one release alone differs from none
        facts = {rel: notebook_facts(res[nb]) for rel, res in per_release.items() if nb in res}
        table = {key: {rel: f.get(key, _ABSENT) for rel, f in facts.items()} for f in facts.values() for key in f}
        if rows := [(key, values) for key, values in table.items() if len(set(map(_sig, values.values()))) > 1]:
            diffs[nb] = rows
    return diffs


def group_differences(items: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Rows of a list (`m[0].x`, `m[1].x`, ...) that differ in the same way become one entry
    `m[0,1,...].x`; order of first appearance is kept."""
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, dict[str, Any]]]] = {}
    for key, values in items:
        groups.setdefault((re.sub(r"\[\d+\]", "[*]", key), tuple(map(_sig, values.values()))), []).append((key, values))
    out = []
    for (pattern, _), members in groups.items():
        key = pattern if len(members) > 1 else members[0][0]
        for pos in range(pattern.count("[*]") if len(members) > 1 else 0):
            seen = list(dict.fromkeys(re.findall(r"\[(\d+)\]", m[0])[pos] for m in members))
            label = ",".join(seen) if len(seen) <= 6 else f"{seen[0]}…{seen[-1]} ({len(seen)})"
            key = key.replace("[*]", f"[{label}]", 1)
        out.append((key, members[0][1]))
    return out


def distinct_texts(values: list[Any], limit: int = 70) -> list[str]:
    """Values written compactly, with more digits where the compact forms would look equal."""
    def text(v: Any, digits: int) -> str:
        if v is _ABSENT:
            return "(absent)"
        if isinstance(v, float):
            return "0" if v == 0 else f"{v:.{digits}g}"
        return fmt_compact(v, limit).replace("`", "'")

    raw = {json.dumps(v, default=str) if v is not _ABSENT else "\0" for v in values}
    for digits in (3, 6, 9, 17):
        texts = [text(v, digits) for v in values]
        if len(set(texts)) == len(raw):
            break
    return texts


_ERROR_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Warning)\b")
_SOURCE_LOCATION = re.compile(r"\.py:\d+")


def _numbers(value: Any) -> list[float] | None:
    """A number or a (nested) list of numbers as a flat list; None for anything else (bools included)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, list):
        subs = [_numbers(item) for item in value]
        return None if any(s is None for s in subs) else [x for s in subs for x in s]  # type: ignore[union-attr]
    return None


def _has_float(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, list) and any(_has_float(v) for v in value))


def relative_size(values: list[Any]) -> float | None:
    """Largest |a - b| / max(|a|, |b|) over every pair of same-length numeric values; None if not all such."""
    flat = [_numbers(v) for v in values]
    if any(f is None for f in flat) or len({len(f) for f in flat}) != 1:
        return None
    worst = 0.0
    for i, a in enumerate(flat):
        for b in flat[i + 1:]:
            for x, y in zip(a, b):
                scale = max(abs(x), abs(y))
                worst = max(worst, abs(x - y) / scale if scale else 0.0)
    return worst


def classify(key: str, values: dict[str, Any]) -> str:
    """'float', 'source location', 'environment' or the behaviour difference one differing value is: 'shape', 'None vs
    a value', 'boolean', 'error type', 'source fact', 'count' or 'text'."""
    present = [v for v in values.values() if v is not _ABSENT]
    low = key.lower()
    if low.startswith("environment."):
        return "environment"
    if "shape" in low:
        return "shape"
    if len(present) < len(values) or any(v is None for v in present):
        return "None vs a value"
    if low.rsplit(".", 1)[-1] in ("line", "lineno") or any(isinstance(v, str) and _SOURCE_LOCATION.search(v) for v in present):
        return "source location"
    if "source_fact" in low:
        return "source fact"
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if any(isinstance(v, str) and _ERROR_NAME.search(v) for v in present) or any(
            w in low for w in ("error", "exception", "raised", "stage")):
        return "error type"
    if any(_has_float(v) for v in present) and relative_size(present) is not None:
        return "float"
    if all(isinstance(v, list) for v in present) and len({len(v) for v in present}) > 1:
        return "shape"  # a list that grew or shrank
    if all(_numbers(v) is not None for v in present):
        return "count"
    return "text"


def _leaf(key: str) -> str:
    """The last component of a dotted key, list indices dropped: what the value is, wherever it sits."""
    parts = re.sub(r"\[[^\]]*\]", "", key).split(".")
    return parts[-1] or key


