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
    """Plain transformers serve reports no reused token on any request, and its first token at the last stable turn
    comes no sooner than a new chat's of about that length (both prefill all of it): the new chat's time over the
    turn's stays within the same-work ratio (a server that reused the turn would answer it that much sooner)."""
    stable, miss, floor = _turns(rows, "stable"), _turns(rows, "new chat"), same_work_floor(rows)
    reported = [r for r in rows if r.get("plain_cached")]
    last, new = (stable[-1] if len(stable) >= 2 else {}), (miss[0] if miss else {})
    sooner = new["plain_s"] / last["plain_s"] if all((r.get("plain_s") or 0) > 0 for r in (last, new)) else None
    holds = not reported and sooner is not None and floor is not None and sooner <= floor
    why = (f"plain serve reported reused tokens on {len(reported)} requests" if reported else
           f"a new chat's first token ({new.get('prompt')} tokens) took {sooner or float('nan'):.2f}x plain's at turn "
           f"{last.get('turn', '?')} ({last.get('prompt')} tokens; same-work ratio {floor or float('nan'):.2f}), "
           "0 tokens reported reused")
    return Decision(holds, why, {"last": _brief(last), "new chat": _brief(new)},
                    {"new_chat_over_last_turn": sooner, "same_work_ratio": floor, "reported_reuse": len(reported)}, {})


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
