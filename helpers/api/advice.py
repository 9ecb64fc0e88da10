"""Every refusal's advice, run: the fix its message names applied to the same call, compared with the full forward.

A cell the guard refused carries the refusal's `fix` (helpers.api.ledger_checks / checks, or the group's own where the
message names a rebuild or a route: 07's rebuild with linear states, 06's logical positions, 09's repair call);
`cell.rerun(fix)` runs the call again with it. `advice_rows` gives notebook 08's `measurements.advice`: one row per
refusal, `restores` true where the fixed call matches the reference within the cell's floor. A refusal without a
fix to run, or whose fix does not restore, is a defect (`defects`). Rows of untracked caches (rebuilt from tensors
without token ids) carry the shape rules' advice, a guess from lengths: shown beside, decided apart.
"""
from __future__ import annotations

from typing import Any

from .cells import Cell


WORDS = {"crop": "cache.crop to {} tokens", "cache": "a rebuilt cache", "call": "the call the message names",
         "resume": "resume() on the whole sequence"}


def describe(fix: dict[str, Any] | None) -> str:
    """The fix in words (what was applied)."""
    if not fix:
        return "no fix named"
    return "; ".join(WORDS[key].format(value) if key in WORDS else f"{key} {list(getattr(value, 'shape', []))}" + (
        f" from {value.reshape(-1, value.shape[-1])[:, 0].tolist()}" if key == "position_ids" else "")
        for key, value in fix.items())


def advice_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    """{cell, check, advice, applied, max_abs_diff, restores} for every cell the guard refused."""
    rows = []
    for c in cells:
        if c.guard != "raised" or c.undecided:
            continue
        status, value = c.rerun(c.fix) if c.fix and c.rerun is not None else ("", None)
        rows.append({"cell": f"{c.group}: {c.cell}", "tracked": c.tracked, "check": c.guard_check,
                     "advice": c.guard_message[:200],
                     "applied": describe(c.fix), "max_abs_diff": value, "threshold": c.threshold,
                     "restores": status == "worked"})
    return rows


def defects(rows: list[dict[str, Any]]) -> list[str]:
    """The refusals whose advice does not restore (or names nothing to run)."""
    return [r["cell"] for r in rows if not r["restores"]]
