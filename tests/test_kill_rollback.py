"""Kill tests for notebook 10's decisions (make mutants: helpers/rollback/decisions.py), on hand-made rows: each
condition of each decision changed alone flips the verdict, and the noise-floor edges. CASES feeds
tests/test_decisions.py's registry (which pins every case's reason and evidence in tests/golden/decision_outputs.json)."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers.compare import NoiseFloor
from helpers.rollback import decisions as d

Case = tuple[str, Callable[[], Any], bool]
FLOOR = NoiseFloor(measured=2e-7, resolution=6e-8, margin=4.0, dtype="float32", scale=0.5, what="kill")
T = FLOOR.threshold  # 8e-7
ABOVE = T * (1 + 1e-6)
WIDE = NoiseFloor(measured=1e-2, resolution=6e-8, margin=4.0, dtype="float32", scale=0.5, what="wide")  # threshold 0.04
FLOORS = {"dense": WIDE, "sliding": FLOOR, "static": FLOOR, "hybrid": FLOOR}


def r(family: str = "dense", mode: str = "plain", outcome: str = "restored", diff: float | None = 0.0, **extra: Any) -> dict:
    """A probe row: a crop that ran holds K/V equal to the fresh cache's (kv_held_diff 0.0) unless told otherwise."""
    return {"family": family, "mode": mode, "outcome": outcome, "next_logits_diff": diff, "kv_held_diff": 0.0, **extra}


def refused(family: str, mode: str, error: str | None = "RuntimeError: crop") -> dict:
    return {"family": family, "mode": mode, "outcome": "refused", "error": error}


FULL = r("dense", "plain", "restored", 0.0, length=20, conv_diff=0.0, recurrent_diff=0.0, error="none")  # every _brief key
STALE = r("hybrid", "record", "silently wrong", 0.0075, conv_diff=0.0, recurrent_diff=0.0046)
GOOD_HYBRID = r("hybrid", "record_keep", "restored", 0.0, conv_diff=0.0, recurrent_diff=0.0)


def dense(*rows: dict) -> Any:
    return d.decide_dense_crop(list(rows), FLOOR)


def plain(*rows: dict) -> Any:
    return d.decide_plain_never_silent(list(rows), FLOORS)


def stale(*rows: dict) -> Any:
    return d.decide_recurrent_not_rolled_back(list(rows), FLOOR)


def family(fam: str, *rows: dict) -> Any:
    return d.decide_family_recorded(list(rows), fam, FLOOR)


def cont(s: int = 8, call: str = "generate()", fed: int | None = 8, diff: float | None = 1e-7, **extra: Any) -> dict:
    return {"suffix": s, "call": call, "fed": fed, "max_abs_diff": diff, **extra}


CONT = [cont(1, "forward()", 1, 0.0), cont(1, "generate()", 1, 2e-7), cont(8, "forward()", 8, 1e-7)]
ORIGINAL = {"rebuild": "original", "length": 23, "fed": 1, "max_abs_diff": 0.0}


def rebuilt(name: str = "hand", **change: Any) -> dict:
    return {**ORIGINAL, "rebuild": name} | change


def rebuild(*rows: dict, names: tuple[str, ...] = ("hand",)) -> Any:
    return d.decide_rebuild(list(rows), names)


def a(fam: str, way: str, outcome: str) -> dict:
    return {"family": fam, "way": way, "outcome": outcome, "error": "ValueError: stateful" if outcome == "refused" else None,
            "tokens": [1, 2], "no_cache_tokens": [1, 2], "steps": 2}


EQUAL = [a(f, w, "equal") for f in ("dense", "hybrid") for w in ("greedy", "prompt lookup", "own assistant")]
HYBRID_REFUSED = EQUAL[:4] + [a("hybrid", "prompt lookup", "refused"), a("hybrid", "own assistant", "refused")]
USER = {"case": "user StaticCache(max_cache_len=20), reused", "outcome": "raises", "error": "IndexError: 20"}
CONFIG = {"case": "cache_implementation='static', cache_config max_cache_len=64", "outcome": "matches", "capacity": 35,
          "requested": 64, "needed": 35}

CASES: list[Case] = [
    # decide_dense_crop
    ("rollback dense: restored, every field", lambda: dense(FULL), True),
    ("rollback dense: at the threshold", lambda: dense(r(diff=T)), True),
    ("rollback dense: just past the threshold", lambda: dense(r(diff=ABOVE)), False),
    ("rollback dense: silently wrong outcome within the noise", lambda: dense(r(outcome="silently wrong", diff=1e-7)), True),
    ("rollback dense: held K/V not measured", lambda: dense(r(kv_held_diff=None)), True),
    ("rollback dense: held K/V differ", lambda: dense(r(kv_held_diff=0.5)), False),
    ("rollback dense: refused", lambda: dense(refused("dense", "plain")), False),
    ("rollback dense: refused without an error, diff given", lambda: dense(r(outcome="refused", diff=0.0)), False),
    ("rollback dense: the plain row, not the recorded one first",
     lambda: dense(r(mode="record", outcome="silently wrong", diff=0.3), r(family="hybrid"), r()), True),
    ("rollback dense: no rows", lambda: dense(), False),
    # decide_plain_never_silent
    ("rollback plain: restores or refuses", lambda: plain(r(), refused("hybrid", "plain")), True),
    ("rollback plain: one silently wrong", lambda: plain(r(), refused("hybrid", "plain"), r("static", outcome="silently wrong", diff=0.01)), False),
    ("rollback plain: restored outcome but beyond its floor", lambda: plain(r("sliding", diff=ABOVE)), False),
    ("rollback plain: at its floor", lambda: plain(r("sliding", diff=T)), True),
    ("rollback plain: within its own family's floor", lambda: plain(r("dense", outcome="silently wrong", diff=0.01)), True),
    ("rollback plain: refused row with a large diff", lambda: plain(r("static", outcome="refused", diff=0.5)), True),
    ("rollback plain: a recorded row is not plain", lambda: plain(r(), r("static", "record", "silently wrong", 0.5)), True),
    ("rollback plain: no plain rows", lambda: plain(r("static", "record")), False),
    # decide_recurrent_not_rolled_back
    ("rollback recurrent: conv rolled back, recurrent not", lambda: stale(STALE, refused("hybrid", "record_keep", "TypeError: x")), True),
    ("rollback recurrent: restored outcome with the stale mechanism", lambda: stale({**STALE, "outcome": "restored"}), True),
    ("rollback recurrent: just past the noise", lambda: stale({**STALE, "next_logits_diff": ABOVE}), True),
    ("rollback recurrent: at the noise", lambda: stale({**STALE, "next_logits_diff": T}), False),
    ("rollback recurrent: another mode restored", lambda: stale(STALE, GOOD_HYBRID), False),
    ("rollback recurrent: the other mode kept a recurrent difference", lambda: stale(STALE, {**GOOD_HYBRID, "recurrent_diff": 0.1}), True),
    ("rollback recurrent: the other mode kept a conv difference", lambda: stale(STALE, {**GOOD_HYBRID, "conv_diff": 0.1}), True),
    ("rollback recurrent: the other mode's held K/V differ", lambda: stale(STALE, {**GOOD_HYBRID, "kv_held_diff": 0.1}), True),
    ("rollback recurrent: the other mode not measured", lambda: stale(STALE, {**GOOD_HYBRID, "recurrent_diff": None, "conv_diff": None}), False),
    ("rollback recurrent: conv state off too", lambda: stale({**STALE, "conv_diff": 0.3}), False),
    ("rollback recurrent: conv state not measured", lambda: stale({**STALE, "conv_diff": None}), False),
    ("rollback recurrent: recurrent state equal", lambda: stale({**STALE, "recurrent_diff": 0.0}), False),
    ("rollback recurrent: recurrent state not measured", lambda: stale({**STALE, "recurrent_diff": None}), False),
    ("rollback recurrent: recurrent state off by more than one", lambda: stale({**STALE, "recurrent_diff": 2.5}), True),
    ("rollback recurrent: refused with the stale numbers", lambda: stale({**STALE, "outcome": "refused", "error": "E"}), False),
    ("rollback recurrent: only the plain mode", lambda: stale({**STALE, "mode": "plain"}), False),
    ("rollback recurrent: only another family", lambda: stale({**STALE, "family": "dense"}), False),
    ("rollback recurrent: two stale modes", lambda: stale(STALE, {**STALE, "mode": "record_keep", "recurrent_diff": 0.9}), True),
    ("rollback recurrent: raised, with and without error",
     lambda: stale(refused("hybrid", "record", "TypeError: x"), refused("hybrid", "record_keep", None)), False),
    ("rollback recurrent: no rows", lambda: stale(), False),
    # decide_recording_runs
    ("rollback recording: ran", lambda: d.decide_recording_runs([STALE]), True),
    ("rollback recording: refused at crop still ran the forward", lambda: d.decide_recording_runs([refused("hybrid", "record")]), True),
    ("rollback recording: raised while recording", lambda: d.decide_recording_runs(
        [{**refused("hybrid", "record", "TypeError: rec"), "outcome": "raised while recording"}]), False),
    ("rollback recording: not offered", lambda: d.decide_recording_runs(
        [{**refused("hybrid", "record", "AttributeError: no"), "outcome": "not offered"}]), False),
    ("rollback recording: the hybrid record row, not the first",
     lambda: d.decide_recording_runs([{**STALE, "family": "dense", "outcome": "not offered"}, {**STALE, "mode": "plain",
                                                                                                 "outcome": "not offered"}, STALE]), True),
    ("rollback recording: no row", lambda: d.decide_recording_runs([r()]), False),
    # decide_family_recorded
    ("rollback family: sliding restored with recording", lambda: family(
        "sliding", refused("sliding", "plain"), refused("sliding", "record"), r("sliding", "record_keep"), r("sliding", "record_all")), True),
    ("rollback family: at the threshold", lambda: family("sliding", r("sliding", "record", diff=T)), True),
    ("rollback family: just past the threshold", lambda: family("sliding", r("sliding", "record", diff=ABOVE)), False),
    ("rollback family: every mode off", lambda: family(
        "sliding", refused("sliding", "record"), r("sliding", "record_keep", "silently wrong", 0.01),
        {**refused("sliding", "record_all", None), "outcome": "not offered"}), False),
    ("rollback family: only the plain crop restored", lambda: family("sliding", r("sliding", "plain")), False),
    ("rollback family: another family restored", lambda: family("sliding", r("dense", "record")), False),
    ("rollback family: held K/V differ", lambda: family("sliding", r("sliding", "record", kv_held_diff=0.2)), False),
    # decide_refused
    ("rollback refused: every way raised", lambda: d.decide_refused(
        [refused("static", "plain", "AttributeError: a"), refused("static", "record", "AttributeError: b"), r("dense")], "static"), True),
    ("rollback refused: one ran", lambda: d.decide_refused(
        [refused("static", "plain"), r("static", "record_keep")], "static"), False),
    ("rollback refused: one ran silently wrong", lambda: d.decide_refused(
        [refused("static", "plain"), r("static", "record", "silently wrong", 0.2)], "static"), False),
    ("rollback refused: none measured", lambda: d.decide_refused([r("dense")], "static"), False),
    # decide_continuation
    ("rollback continuation: within the noise", lambda: d.decide_continuation(CONT + [cont(diff=T)], FLOOR), True),
    ("rollback continuation: exact", lambda: d.decide_continuation([cont(diff=0.0)], FLOOR), True),
    ("rollback continuation: just past the noise", lambda: d.decide_continuation(CONT + [cont(diff=ABOVE)], FLOOR), False),
    ("rollback continuation: refed", lambda: d.decide_continuation(CONT + [cont(fed=20)], FLOOR), False),
    ("rollback continuation: raised", lambda: d.decide_continuation(
        CONT + [cont(fed=None, diff=None, error="TypeError: cache")], FLOOR), False),
    ("rollback continuation: an error with numbers that match", lambda: d.decide_continuation(CONT + [cont(error="warn")], FLOOR), False),
    ("rollback continuation: no diff", lambda: d.decide_continuation(CONT + [cont(diff=None)], FLOOR), False),
    ("rollback continuation: two off, both named", lambda: d.decide_continuation(
        CONT[:1] + [cont(1, fed=20), cont(8, "forward()", diff=0.04)], FLOOR), False),
    # decide_rebuild
    ("rollback rebuild: bitwise", lambda: rebuild(ORIGINAL, rebuilt("hand"), rebuilt("ctor"), names=("hand", "ctor")), True),
    ("rollback rebuild: reported length", lambda: rebuild(ORIGINAL, rebuilt(length=4)), False),
    ("rollback rebuild: fed more", lambda: rebuild(ORIGINAL, rebuilt(fed=20)), False),
    ("rollback rebuild: not bitwise", lambda: rebuild(ORIGINAL, rebuilt(max_abs_diff=1e-9)), False),
    ("rollback rebuild: the 5.25 hand rebuild", lambda: rebuild(
        ORIGINAL, rebuilt("ctor"), rebuilt(length=4, fed=20, max_abs_diff=0.042), names=("ctor", "hand")), False),
    ("rollback rebuild: raised", lambda: rebuild(ORIGINAL, {"rebuild": "hand", "error": "AttributeError: x"}), False),
    ("rollback rebuild: raised with the original's numbers", lambda: rebuild(ORIGINAL, rebuilt(error="E")), False),
    ("rollback rebuild: not measured", lambda: rebuild(ORIGINAL), False),
    ("rollback rebuild: two off, both named", lambda: rebuild(
        ORIGINAL, rebuilt(length=4), rebuilt("ctor", fed=20, error="E"), names=("hand", "ctor")), False),
    ("rollback rebuild: no original", lambda: rebuild(rebuilt(length=None, fed=None, max_abs_diff=0.0)), False),
    ("rollback rebuild: only an unnamed rebuild off", lambda: rebuild(ORIGINAL, rebuilt(), rebuilt("other", length=4)), True),
    # decide_assisted_never_wrong
    ("rollback assisted: every way equal", lambda: d.decide_assisted_never_wrong(EQUAL), True),
    ("rollback assisted: refused is not wrong", lambda: d.decide_assisted_never_wrong(HYBRID_REFUSED), True),
    ("rollback assisted: one way differs", lambda: d.decide_assisted_never_wrong(EQUAL[:-1] + [a("hybrid", "own assistant", "differs")]), False),
    ("rollback assisted: greedy differs from no cache", lambda: d.decide_assisted_never_wrong([a("dense", "greedy", "differs")]), False),
    ("rollback assisted: greedy refused", lambda: d.decide_assisted_never_wrong(EQUAL[1:3] + [a("dense", "greedy", "refused")]), False),
    ("rollback assisted: no runs", lambda: d.decide_assisted_never_wrong([]), False),
    # decide_assisted_refused
    ("rollback assisted refused: hybrid refuses both", lambda: d.decide_assisted_refused(HYBRID_REFUSED), True),
    ("rollback assisted refused: 5.25 runs both", lambda: d.decide_assisted_refused(EQUAL), False),
    ("rollback assisted refused: one ran", lambda: d.decide_assisted_refused(HYBRID_REFUSED[:-1] + [a("hybrid", "own assistant", "differs")]), False),
    ("rollback assisted refused: another family", lambda: d.decide_assisted_refused(
        EQUAL[:1] + [a("dense", "prompt lookup", "refused"), a("dense", "own assistant", "refused")] + EQUAL[3:], "dense"), True),
    ("rollback assisted refused: greedy refused is not an assisted way", lambda: d.decide_assisted_refused(
        [a("hybrid", "greedy", "refused")]), False),
    ("rollback assisted refused: the first way's error is shown", lambda: d.decide_assisted_refused(
        [a("hybrid", "prompt lookup", "refused"), {**a("hybrid", "own assistant", "refused"), "error": "TypeError: other"}]), True),
    # decide_static_case
    ("rollback static: raises", lambda: d.decide_static_case([CONFIG, USER], "user StaticCache", "raises"), True),
    ("rollback static: silently wrong", lambda: d.decide_static_case(
        [{**USER, "outcome": "silently wrong", "error": None}], "user StaticCache", "raises"), False),
    ("rollback static: matches as expected", lambda: d.decide_static_case([USER, CONFIG], "cache_implementation", "matches"), True),
    ("rollback static: a row without a case", lambda: d.decide_static_case([{"outcome": "raises"}], "XX", "raises"), False),
    ("rollback static: a row without a case is not the case 'None'", lambda: d.decide_static_case(
        [{"outcome": "raises"}], "None", "raises"), False),
    ("rollback static: no such case", lambda: d.decide_static_case([USER], "nothing", "raises"), False),
    # decide_max_cache_len_ignored
    ("rollback max_cache_len: ignored", lambda: d.decide_max_cache_len_ignored([USER, CONFIG]), True),
    ("rollback max_cache_len: honoured", lambda: d.decide_max_cache_len_ignored([{**CONFIG, "capacity": 64}]), False),
    ("rollback max_cache_len: wrong tokens", lambda: d.decide_max_cache_len_ignored([{**CONFIG, "outcome": "silently wrong"}]), False),
    ("rollback max_cache_len: capacity not read", lambda: d.decide_max_cache_len_ignored([{**CONFIG, "capacity": None}]), False),
    ("rollback max_cache_len: request not read", lambda: d.decide_max_cache_len_ignored([{**CONFIG, "requested": None}]), False),
    ("rollback max_cache_len: no case", lambda: d.decide_max_cache_len_ignored([USER]), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_case(name, thunk, expected):
    out = thunk()
    assert out.holds is expected, (name, out.why)
    assert out.why and isinstance(out.evidence, dict) and isinstance(out.deciding, dict)


def test_empty_continuation_table_is_an_error():
    """No continuation rows at all: the worst diff is None and the reason cannot be formatted (never a pass)."""
    with pytest.raises(TypeError):
        d.decide_continuation([], FLOOR)
