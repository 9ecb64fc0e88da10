"""Notebook 11's verdicts, computed from the chat rows (helpers.chatserver.chat): token counts against what the
rendered prompts share, and first-token times against the ratio the two servers show where they do the same work."""
from __future__ import annotations

from typing import Any

from ..compare import Decision

TIMED = ("plain_s", "pooled_s")


def _turns(rows: list[dict[str, Any]], chat: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("chat") == chat]


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("chat", "turn", "prompt", "before", "common", "reused", "reply", "plain_cached", *TIMED, "equal")
    return {k: row.get(k) for k in keys if k in row}


def same_work_floor(rows: list[dict[str, Any]]) -> float | None:
    """The largest plain/pooled first-token ratio (either way round) over the requests where both servers prefill the
    whole prompt (turn 1 of each chat, the new chat): what one server differs from the other by without reuse."""
    ratios = [max(r["plain_s"] / r["pooled_s"], r["pooled_s"] / r["plain_s"]) for r in rows
              if r.get("turn") == 1 and not r.get("reused") and all((r.get(k) or 0) > 0 for k in TIMED)]
    return max(ratios) if ratios else None


def decide_replies_equal(rows: list[dict[str, Any]]) -> Decision:
    """Every request's reply through kvresume serve equals plain transformers serve's."""
    differ = [_brief(r) for r in rows if r.get("equal") is not True]
    why = (f"{len(rows)} of {len(rows)} replies equal" if rows and not differ else
           f"{len(differ)} of {len(rows)} replies differ: first {differ[0] if differ else 'none (no rows)'}")
    return Decision(bool(rows) and not differ, why, {"differ": differ},
                    {"requests": len(rows), "differ": len(differ)}, {})


def decide_plain_recomputes(rows: list[dict[str, Any]]) -> Decision:
    """Plain transformers serve reports no reused token on any request, and its first token comes later as the chat
    grows: its last stable turn's first-token time over turn 1's exceeds the same-work ratio (one timing's noise)."""
    stable, floor = _turns(rows, "stable"), same_work_floor(rows)
    reported = [r for r in rows if r.get("plain_cached")]
    grows = None
    if len(stable) >= 2 and all((r.get("plain_s") or 0) > 0 for r in (stable[0], stable[-1])):
        grows = stable[-1]["plain_s"] / stable[0]["plain_s"]
    holds = not reported and grows is not None and floor is not None and grows > floor
    why = (f"plain serve reported reused tokens on {len(reported)} requests" if reported else
           f"plain first token at turn {stable[-1]['turn'] if stable else '?'} took {grows or float('nan'):.2f}x turn "
           f"1's (same-work ratio {floor or float('nan'):.2f}), 0 tokens reported reused")
    return Decision(holds, why, {"first": _brief(stable[0]) if stable else {}, "last": _brief(stable[-1]) if stable else {}},
                    {"growth": grows, "same_work_ratio": floor, "reported_reuse": len(reported)}, {})


def decide_pool_reuses_turns(rows: list[dict[str, Any]]) -> Decision:
    """The stable chat: turn 1 and the new chat reuse nothing; each later turn's prompt starts with the previous one
    and the pool reuses at least that prompt and at most that prompt plus the previous reply."""
    stable, miss = _turns(rows, "stable"), _turns(rows, "new chat")
    bad = [_brief(r) for r in stable[:1] + miss if r.get("reused") != 0]
    for r in stable[1:]:
        if not (r.get("common") == r.get("before") and r["before"] <= (r.get("reused") or 0) <= r["before"] + r["reply"]):
            bad.append(_brief(r))
    ok = len(stable) >= 2 and bool(miss) and not bad
    why = ("each later turn reused its previous prompt and up to its reply: " +
           ", ".join(f"{r['reused']}/{r['prompt']}" for r in stable[1:])) if ok else f"off the rule: {bad[:2] or 'no rows'}"
    return Decision(ok, why, {"turns": [_brief(r) for r in stable + miss]}, {"off": len(bad), "turns": len(stable)}, {})


def decide_rerender_stops_reuse(rows: list[dict[str, Any]]) -> Decision:
    """The re-rendered chat: from turn 2 the new prompt differs from the previous one inside it (the template renders
    the earlier turn otherwise), and the pool reuses exactly up to that first different token, no further."""
    later = _turns(rows, "re-rendered")[1:]
    bad = [_brief(r) for r in later if not (r.get("common", 0) < r.get("before", 0) and r.get("reused") == r.get("common"))]
    refed = [r["before"] - r["common"] + r["reply"] for r in later]
    ok = bool(later) and not bad
    why = (f"reuse stopped where the re-rendering began, {refed} tokens of the cached turns re-fed per turn" if ok else
           f"off the rule: {bad[:2] or 'no turns after the first'}")
    return Decision(ok, why, {"turns": [_brief(r) for r in later]}, {"refed": refed, "off": len(bad)}, {})


def decide_first_token_sooner(rows: list[dict[str, Any]]) -> Decision:
    """The stable chat's last turn: plain/pooled first-token time exceeds the same-work ratio of this run."""
    stable, floor = _turns(rows, "stable"), same_work_floor(rows)
    last = stable[-1] if len(stable) >= 2 else {}
    speed = last["plain_s"] / last["pooled_s"] if all((last.get(k) or 0) > 0 for k in TIMED) else None
    holds = speed is not None and floor is not None and speed > floor
    why = (f"turn {last.get('turn', '?')}: pooled first token {speed or float('nan'):.2f}x sooner than plain "
           f"(same-work ratio {floor or float('nan'):.2f})")
    return Decision(holds, why, {"last": _brief(last)}, {"speedup": speed, "same_work_ratio": floor}, {})
