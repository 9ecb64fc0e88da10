"""Kill tests for notebook 08's decisions (make mutants: helpers/proposal/decisions.py), on hand-made cells and rows: each
condition of each decision changed alone flips the verdict. CASES feeds tests/test_decisions.py's registry."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers.proposal import decisions
from helpers.proposal.cells import Cell

Case = tuple[str, Callable[[], Any], bool]


def cell(plain: str, guard: str, same: bool | None = True, group: str = "02", undecided: str = "", name: str = "",
         with_length: str = "") -> Cell:
    return Cell(group, name or f"{plain}/{guard}", plain, guard, guarded_equals_plain=same if guard == "passed" else None,
                undecided=undecided, with_length=with_length)


NAMED_MISS = cell("silently_wrong", "passed", group="04", name="double processing · original · full mask (L+1)",
                  with_length="raised")


GOOD = [cell("worked", "passed"), cell("silently_wrong", "raised", group="04"), cell("raised", "raised", group="07")]
FAMS = {f: {"state_equal": True, "seq_length": [5, 5]} for f in decisions.FAMILIES}
REFUSED = [{"input": f"bad {i}", "refused": True, "names_mismatch": True} for i in range(10)]
PORT = [{"family": "dense", "hook": [], "restored_ok": True, "bare_ok": True, "restored_vs_same": 0.0, "bare_vs_same": 0.0,
         "noise_threshold": 1e-6},
        {"family": "multimodal", "hook": ["rope_deltas"], "restored_ok": True, "bare_ok": True, "restored_vs_same": 0.0,
         "bare_vs_same": 0.5, "noise_threshold": 1e-6}]


def port(i: int, **change: Any) -> list[dict[str, Any]]:
    return [{**r, **change} if j == i else r for j, r in enumerate(PORT)]


CASES: list[Case] = [
    ("api catches: every silent cell raised", lambda: decisions.decide_guard_catches(GOOD), True),
    ("api catches: a silent cell passed", lambda: decisions.decide_guard_catches(GOOD + [cell("silently_wrong", "passed")]), False),
    ("api catches: a named blind spot passed", lambda: decisions.decide_guard_catches(GOOD + [NAMED_MISS]), True),
    ("api catches: a blind spot's name in another group is not named", lambda: decisions.decide_guard_catches(
        GOOD + [cell("silently_wrong", "passed", group="02", name="double processing · original")]), False),
    ("api catches: only named blind spots, nothing caught", lambda: decisions.decide_guard_catches(
        [cell("worked", "passed"), NAMED_MISS]), True),
    ("api catches: no silent cell at all", lambda: decisions.decide_guard_catches([cell("worked", "passed")]), False),
    ("api catches: an undecided silent pass is not counted", lambda: decisions.decide_guard_catches(
        GOOD + [cell("silently_wrong", "passed", undecided="no reference")]), True),
    ("api passes: every working cell passed", lambda: decisions.decide_guard_passes(GOOD), True),
    ("api passes: a false alarm", lambda: decisions.decide_guard_passes(GOOD + [cell("worked", "raised")]), False),
    ("api passes: a false alarm given processed_length only", lambda: decisions.decide_guard_passes(
        GOOD + [cell("worked", "passed", with_length="raised")]), False),
    ("api passes: an internal call refused", lambda: decisions.decide_guard_passes(
        GOOD, [{"shape": "assisted", "model": "main", "call": 1, "refused": True}]), False),
    ("api passes: internal calls all passed", lambda: decisions.decide_guard_passes(
        GOOD, [{"shape": "assisted", "model": "main", "call": 1, "refused": False}]), True),
    ("api passes: a passed call not bitwise the plain one", lambda: decisions.decide_guard_passes(
        GOOD + [cell("raised", "passed", same=False)]), False),
    ("api passes: no working cell", lambda: decisions.decide_guard_passes([cell("raised", "raised")]), False),
    ("api factory: every family equal", lambda: decisions.decide_factory_matches(FAMS), True),
    ("api factory: one family unequal", lambda: decisions.decide_factory_matches(
        {**FAMS, "hybrid": {"state_equal": False, "seq_length": [5, 5]}}), False),
    ("api factory: one family's seq length differs", lambda: decisions.decide_factory_matches(
        {**FAMS, "sliding": {"state_equal": True, "seq_length": [39, 15]}}), False),
    ("api factory: a family missing", lambda: decisions.decide_factory_matches(
        {k: v for k, v in FAMS.items() if k != "padded_batch"}), False),
    ("api refuses: ten refused and named", lambda: decisions.decide_factory_refuses(REFUSED), True),
    ("api refuses: nine only", lambda: decisions.decide_factory_refuses(REFUSED[:9]), False),
    ("api refuses: one accepted", lambda: decisions.decide_factory_refuses(
        REFUSED + [{"input": "x", "refused": False, "names_mismatch": False}]), False),
    ("api refuses: one message naming nothing", lambda: decisions.decide_factory_refuses(
        REFUSED + [{"input": "x", "refused": True, "names_mismatch": False}]), False),
    ("api portable: restored matches, hook needed", lambda: decisions.decide_portable(PORT), True),
    ("api portable: restored differs", lambda: decisions.decide_portable(port(0, restored_vs_same=1e-3)), False),
    ("api portable: restored failed", lambda: decisions.decide_portable(port(1, restored_ok=False)), False),
    ("api portable: the hook made no difference", lambda: decisions.decide_portable(port(1, bare_vs_same=1e-7)), False),
    ("api portable: no hooked model", lambda: decisions.decide_portable(PORT[:1]), False),
    ("api portable: restored exactly at the threshold matches", lambda: decisions.decide_portable(
        port(0, restored_vs_same=1e-6)), True),
    ("api portable: without the hook exactly at the threshold is no difference", lambda: decisions.decide_portable(
        port(1, bare_vs_same=1e-6)), False),
    ("api portable: nothing measured", lambda: decisions.decide_portable([]), False),
    ("api portable: without the hook it raised", lambda: decisions.decide_portable(port(1, bare_ok=False, bare_vs_same=None)), True),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_api_decisions(name, thunk, expected):
    assert thunk().holds is expected, (name, thunk().why)


def test_the_deciding_values():
    d = decisions.decide_guard_catches(GOOD + [cell("silently_wrong", "passed", group="07"), NAMED_MISS])
    assert d.deciding == {"silently_wrong": 3, "caught": 1, "named_misses": 1, "unnamed_misses": 1}
    assert [m["cell"] for m in d.evidence["misses"]] == ["07: silently_wrong/passed", f"04: {NAMED_MISS.cell}"]
    assert d.evidence["caught_only_with_processed_length"] == [f"04: {NAMED_MISS.cell}"]
    assert d.evidence["by_group"]["07"]["misses"] == 1 and d.evidence["by_group"]["04"]["caught"] == 1
    d = decisions.decide_guard_passes(GOOD + [cell("worked", "raised", group="06")])
    assert d.deciding == {"worked": 2, "false_alarms": 1, "internal_refused": 0}
    assert d.evidence["false_alarms"] == ["06: worked/raised"]
    assert decisions.decide_factory_refuses(REFUSED).deciding == {"refused_and_named": "10/10"}
    assert decisions.decide_portable(PORT).deciding == {"restored_vs_same": 0.0, "without_hook_vs_same": 0.5}
