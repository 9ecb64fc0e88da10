"""Per source, in a maintainer's words: the symptom and where it shows (per release), and the Ask (what to change
upstream or what the reporter should do) with its evidence: the first release where the behaviour changed (a bisect
record of this kit, else the `make bisect` command that finds it) and the repair the kit applied and its number.
Every phrase is read from the claims' recorded values. The writers live beside their findings (`<package>/ask.py`,
found by helpers.findings); these are the pieces they share."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...findings import writer
from .paste import fmt_scalar
from .records import load_json

Claims = list[tuple[str, dict[str, Any]]]  # (notebook, claim) of one source on one release


@dataclass(frozen=True)
class Lines:
    """A source's symptom (per release, joined) and its ask; '' where its claims say nothing."""

    symptom: str
    ask: str


def claim_of(claims: Claims, cid: str) -> dict[str, Any]:
    return next((c for _, c in claims if c.get("id") == cid), {})


def num(value: Any) -> str:
    return fmt_scalar(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def joined(values: dict[str, str]) -> str:
    """'X on 5.17.0 and 5.25.0' when every release says the same, else 'X on 5.17.0; Y on 5.25.0'."""
    groups: dict[str, list[str]] = {}
    for rel, text in values.items():
        if text:
            groups.setdefault(text, []).append(rel)
    return "; ".join(f"{text} on {' and '.join(rels)}" for text, rels in groups.items())


def bisect_record(out: Path, notebook: str, claim: str) -> dict[str, Any]:
    """The bisect this kit ran for the claim (outputs/bisect/<nb>-<claim>.json), {} where none ran."""
    found = (load_json(path) for path in sorted((out / "bisect").glob(f"{notebook}*-{claim}.json")))
    return next((data for data in found if data.get("status") == "complete" and data.get("changes")), {})


def first_change(out: Path, notebook: str, claim: str, releases: list[str], differs: bool, prefer: str = "") -> str:
    """'first changed in 5.20.0 (after 5.19.0): `+ line`' from a bisect record; else the command that finds it
    where the claim differs between the releases measured; '' where it does not."""
    if data := bisect_record(out, notebook, claim):
        change = data["changes"][0]
        line = ""
        diffs = sorted((change.get("source_diff") or {}).items(), key=lambda kv: prefer not in kv[0] if prefer else 0)
        for name, diff in diffs:
            added = [ln[1:].strip() for ln in str(diff.get("diff") or "").splitlines()
                     if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()
                     and not ln[1:].strip().startswith("#")]
            added = [ln for ln in added if not ln.endswith(":")] or added  # a statement over its bare `if ...:`
            added = [ln for ln in added if len(ln) <= 60]  # a line is quoted whole or not at all, never cut
            if added:
                line = f"; `{'.'.join(name.split('.')[-2:])}`: `+ {added[0]}`"
                break
        return f"first changed in {change['first_different']} (`make bisect`: same through {change['last_same']}{line})"
    if differs and len(releases) > 1:
        return (f"first release that changed: `make bisect NB={notebook} CLAIM={claim} GOOD={releases[0]} "
                f"BAD={releases[-1]}`")
    return ""


def error_head(text: str) -> str:
    """'RuntimeError: cannot reshape tensor of 0 elements' (the message up to its first shape or clause)."""
    head = re.split(r" into | because |\(inside", str(text))[0].strip()
    where = re.search(r"raised in ([\w.]+)", str(text))
    return f"`{head}`" + (f" in `{where.group(1)}`" if where else "")


def lines_for(key: str, by_release: dict[str, Claims], out: Path) -> Lines:
    """The source's symptom and Ask from the writer its findings name (KeyError for a source none declares)."""
    return writer(key)(by_release, out)
