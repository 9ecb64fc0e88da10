"""Kill tests for notebook 11's decisions (make mutants: helpers/chatserver/decisions.py), on hand-made chat rows:
each condition of each decision changed alone flips the verdict, and the same-work ratio's edges. CASES feeds
tests/test_decisions.py's registry (which pins every case's reason and evidence in tests/golden/decision_outputs.json)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers.chatserver import decisions as d

Case = tuple[str, Callable[[], Any], bool]


def row(chat: str = "stable", turn: int = 1, prompt: int = 100, before: int = 0, common: int = 0, reused: int = 0,
        reply: int = 12, plain_s: float = 0.5, pooled_s: float = 0.5, equal: bool = True, **extra: Any) -> dict:
    """A chat row: both servers did the same work in 0.5 s unless told otherwise."""
    return dict(chat=chat, turn=turn, prompt=prompt, before=before, common=common, reused=reused, reply=reply,
                plain_cached=None, plain_s=plain_s, pooled_s=pooled_s, equal=equal, **extra)


FIRST = row(plain_s=0.5, pooled_s=0.625)  # the same work: ratio 1.25 (exact in binary)
SECOND = row(turn=2, prompt=230, before=100, common=100, reused=111, plain_s=1.0, pooled_s=0.5)
LAST = row(turn=3, prompt=360, before=230, common=230, reused=241, plain_s=1.5, pooled_s=0.5)
MISS = row("new chat", prompt=350, plain_s=1.5, pooled_s=1.5)
RE1 = row("re-rendered", prompt=110)
RE2 = row("re-rendered", 2, prompt=240, before=110, common=97, reused=97)
CHAT = [FIRST, SECOND, LAST, RE1, RE2, MISS]


def but(base: dict, **change: Any) -> list[dict]:
    """CHAT with one row changed."""
    return [{**r, **change} if r is base else r for r in CHAT]


CASES: list[Case] = [
    # same_work_floor: the largest ratio either way round over the full-prefill requests
    ("serve floor: the largest same-work ratio", lambda: d.decide_first_token_sooner(CHAT), True),
    ("serve floor: a turn that reused is not same work", lambda: d.decide_first_token_sooner(
        but(SECOND, turn=1, plain_s=5.0)), True),
    ("serve floor: the pooled side slower counts too", lambda: d.decide_first_token_sooner(
        but(MISS, plain_s=0.5, pooled_s=1.0)), True),
    ("serve floor: the pooled side far slower on the same work", lambda: d.decide_first_token_sooner(
        but(MISS, plain_s=0.5, pooled_s=2.0)), False),
    # decide_replies_equal
    ("serve equal: every reply", lambda: d.decide_replies_equal(CHAT), True),
    ("serve equal: one differs", lambda: d.decide_replies_equal(but(RE2, equal=False)), False),
    ("serve equal: not compared", lambda: d.decide_replies_equal(but(MISS, equal=None)), False),
    ("serve equal: no rows", lambda: d.decide_replies_equal([]), False),
    # decide_plain_recomputes
    ("serve plain: no sooner than a new chat, reports nothing", lambda: d.decide_plain_recomputes(CHAT), True),
    ("serve plain: reported reuse", lambda: d.decide_plain_recomputes(but(SECOND, plain_cached=100)), False),
    ("serve plain: a reported 0 is no reuse", lambda: d.decide_plain_recomputes(but(SECOND, plain_cached=0)), True),
    ("serve plain: the last turn far sooner (reused)", lambda: d.decide_plain_recomputes(but(LAST, plain_s=0.5)), False),
    ("serve plain: sooner by the same-work ratio", lambda: d.decide_plain_recomputes(
        but(MISS, plain_s=1.875, pooled_s=1.875)), True),
    ("serve plain: sooner just past it", lambda: d.decide_plain_recomputes(but(MISS, plain_s=1.9, pooled_s=1.9)), False),
    ("serve plain: the last turn slower", lambda: d.decide_plain_recomputes(but(LAST, plain_s=3.0)), True),
    ("serve plain: one turn only", lambda: d.decide_plain_recomputes([FIRST, MISS]), False),
    ("serve plain: no new chat", lambda: d.decide_plain_recomputes([FIRST, SECOND, LAST]), False),
    ("serve plain: an untimed turn", lambda: d.decide_plain_recomputes(but(LAST, plain_s=None)), False),
    ("serve plain: an untimed new chat", lambda: d.decide_plain_recomputes(but(MISS, plain_s=None)), False),
    # decide_pool_reuses_turns
    ("serve pool: each turn's previous prompt", lambda: d.decide_pool_reuses_turns(CHAT), True),
    ("serve pool: exactly the previous prompt", lambda: d.decide_pool_reuses_turns(but(SECOND, reused=100)), True),
    ("serve pool: one short of it", lambda: d.decide_pool_reuses_turns(but(SECOND, reused=99)), False),
    ("serve pool: the prompt and the whole reply", lambda: d.decide_pool_reuses_turns(but(SECOND, reused=112)), True),
    ("serve pool: past the reply", lambda: d.decide_pool_reuses_turns(but(SECOND, reused=113)), False),
    ("serve pool: the rendering changed", lambda: d.decide_pool_reuses_turns(but(LAST, common=229)), False),
    ("serve pool: a first turn reused", lambda: d.decide_pool_reuses_turns(but(FIRST, reused=3)), False),
    ("serve pool: the new chat reused", lambda: d.decide_pool_reuses_turns(but(MISS, reused=5)), False),
    ("serve pool: no new chat", lambda: d.decide_pool_reuses_turns([r for r in CHAT if r is not MISS]), False),
    ("serve pool: one turn only", lambda: d.decide_pool_reuses_turns([FIRST, MISS]), False),
    ("serve pool: reuse not reported", lambda: d.decide_pool_reuses_turns(but(SECOND, reused=None)), False),
    # decide_rerender_stops_reuse
    ("serve rerender: up to the change", lambda: d.decide_rerender_stops_reuse(CHAT), True),
    ("serve rerender: one past the change", lambda: d.decide_rerender_stops_reuse(but(RE2, reused=98)), False),
    ("serve rerender: one before it", lambda: d.decide_rerender_stops_reuse(but(RE2, reused=96)), False),
    ("serve rerender: no change in the rendering", lambda: d.decide_rerender_stops_reuse(
        but(RE2, common=110, reused=110)), False),
    ("serve rerender: no later turn", lambda: d.decide_rerender_stops_reuse([r for r in CHAT if r is not RE2]), False),
    # decide_first_token_sooner
    ("serve sooner: 3x against 1.25", lambda: d.decide_first_token_sooner(CHAT), True),
    ("serve sooner: within the same-work ratio", lambda: d.decide_first_token_sooner(but(LAST, plain_s=0.55)), False),
    ("serve sooner: at the same-work ratio", lambda: d.decide_first_token_sooner(but(LAST, plain_s=0.625)), False),
    ("serve sooner: just past it", lambda: d.decide_first_token_sooner(but(LAST, plain_s=0.63)), True),
    ("serve sooner: untimed", lambda: d.decide_first_token_sooner(but(LAST, pooled_s=None)), False),
    ("serve sooner: no same-work request", lambda: d.decide_first_token_sooner(
        [r for r in CHAT if r.get("turn") != 1]), False),
    ("serve sooner: one turn only", lambda: d.decide_first_token_sooner([FIRST, MISS]), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_case(name, thunk, expected):
    out = thunk()
    assert out.holds is expected, (name, out.why)
    assert out.why and isinstance(out.evidence, dict) and isinstance(out.deciding, dict)


def test_the_same_work_ratio_is_the_largest_either_way():
    assert d.same_work_floor(CHAT) == 1.25
    assert d.same_work_floor(but(MISS, plain_s=0.5, pooled_s=1.25)) == 2.5
    assert d.same_work_floor([SECOND, LAST]) is None
