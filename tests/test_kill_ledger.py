"""Kill tests for notebook 08's ledger claims (helpers/proposal/ledger_decisions.py), on hand-made cells and advice rows:
each condition of each decision changed alone flips the verdict. CASES feeds tests/test_decisions.py's registry."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers.proposal import ledger_decisions as ld
from helpers.proposal.cells import Cell

Case = tuple[str, Callable[[], Any], bool]


def cell(plain: str, guard: str, tracked: bool = True, group: str = "prefix", name: str = "", resume: str = "worked",
         resume_diff: float | None = 1e-7, untracked: str = "passed", scope: str = "") -> Cell:
    c = Cell(group, name or f"{plain}/{guard}/{resume}", plain, guard, threshold=1e-6, untracked=untracked,
             tracked=tracked, resume_status=resume, resume_diff=resume_diff)
    c.resume_scope = scope
    return c


WRONG = cell("silently_wrong", "raised", name="recipe · no deepcopy")
GOOD = [cell("worked", "passed", name="recipe · deepcopy"), WRONG, cell("raised", "raised", name="too long")]
BLIND = cell("silently_wrong", "passed", group="04", name="double processing · original · full mask (L+1)")
ADVICE = [{"cell": "prefix: a", "tracked": True, "check": "ledger_tokens", "max_abs_diff": 2e-7, "restores": True},
          {"cell": "prefix: b", "tracked": True, "check": "ledger_positions", "max_abs_diff": 1e-7, "restores": True},
          {"cell": "02: c", "tracked": False, "check": "nothing_fed", "max_abs_diff": 0.2, "restores": False}]

CASES: list[Case] = [
    ("ledger refuses: every silent tracked cell refused", lambda: ld.decide_ledger_refuses(GOOD), True),
    ("ledger refuses: a silent tracked cell passed", lambda: ld.decide_ledger_refuses(
        GOOD + [cell("silently_wrong", "passed", name="padded prefix · no positions")]), False),
    ("ledger refuses: a named blind spot passed", lambda: ld.decide_ledger_refuses(GOOD + [BLIND]), True),
    ("ledger refuses: a silent untracked cell passed is counted apart", lambda: ld.decide_ledger_refuses(
        GOOD + [cell("silently_wrong", "passed", tracked=False, group="06")]), True),
    ("ledger refuses: a false alarm on a tracked cell", lambda: ld.decide_ledger_refuses(
        GOOD + [cell("worked", "raised")]), False),
    ("ledger refuses: an internal call refused", lambda: ld.decide_ledger_refuses(
        GOOD, [{"shape": "assisted", "model": "main", "call": 2, "refused": True}]), False),
    ("ledger refuses: no silent tracked cell", lambda: ld.decide_ledger_refuses(GOOD[:1]), False),
    ("ledger advice: every tracked refusal's fix restores", lambda: ld.decide_advice_restores(ADVICE), True),
    ("ledger advice: one tracked fix does not restore", lambda: ld.decide_advice_restores(
        ADVICE + [{"cell": "prefix: d", "tracked": True, "check": "ledger_mask", "max_abs_diff": 0.3, "restores": False}]),
     False),
    ("ledger advice: no tracked refusal", lambda: ld.decide_advice_restores(ADVICE[2:]), False),
    ("ledger resume: every silent tracked cell matches", lambda: ld.decide_resume_matches(GOOD), True),
    ("ledger resume: one differs through resume", lambda: ld.decide_resume_matches(
        GOOD + [cell("silently_wrong", "raised", name="x", resume="silently_wrong", resume_diff=0.3)]), False),
    ("ledger resume: one not run", lambda: ld.decide_resume_matches(
        GOOD + [cell("silently_wrong", "raised", name="y", resume="", resume_diff=None)]), False),
    ("ledger resume: one out of resume's scope, named", lambda: ld.decide_resume_matches(
        GOOD + [cell("silently_wrong", "raised", name="bart", resume="", resume_diff=None, scope="encoder-decoder")]), True),
    ("ledger resume: nothing silently wrong", lambda: ld.decide_resume_matches(GOOD[:1]), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_ledger_decisions(name, thunk, expected):
    assert thunk().holds is expected, (name, thunk().why)


def test_the_deciding_values():
    d = ld.decide_ledger_refuses(GOOD + [BLIND, cell("silently_wrong", "raised", name="z", untracked="raised")])
    assert d.deciding == {"silently_wrong_tracked": 3, "refused": 2, "named_blind_spots": 1, "unnamed_misses": 0,
                          "refused_without_ledger": 1, "false_alarms": 0, "internal_refused": 0}
    d = ld.decide_advice_restores(ADVICE)
    assert d.deciding == {"refusals": 2, "restored": 2, "defects": 0, "untracked_refusals": 1, "untracked_restored": 0}
    assert d.evidence["untracked_defects"] == ["02: c"]
