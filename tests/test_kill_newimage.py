"""Kill tests for notebook 09's decisions (make mutants: helpers/newimage/decisions.py), on hand-made rows: each
condition of each decision changed alone flips the verdict. CASES feeds tests/test_decisions.py's registry."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from helpers.compare import NoiseFloor
from helpers.newimage import decisions

Case = tuple[str, Callable[[], Any], bool]
FLOOR = NoiseFloor(measured=4e-7, resolution=6e-8, margin=4.0, dtype="float32", scale=1.0)  # threshold 1.6e-6
SPAN = (9, 34)
ONE_ROW = [list(range(40, 89))] * 3  # the natural call: one text row, broadcast
REFERENCE = [[40 + i if i < 9 else 49 for i in range(49)], [40 + i if i < 9 else 49 + (i - 9) // 5 for i in range(49)],
             [40 + i if i < 9 else 49 + (i - 9) % 5 for i in range(49)]]
IDS = [5] * 9 + [7] * 25 + [5] * 15


def row(key: str = "a_turn2_ids", outcome: str = "silently wrong", diff: float | None = 0.2355, **extra: Any) -> dict[str, Any]:
    return {"key": key, "shape": key, "outcome": outcome, "max_abs_diff": diff, "cosine": 0.95,
            "top1_equal": diff is not None and diff < 1e-6, "top5_overlap": 4, **extra}


def natural(**change: Any) -> dict[str, Any]:
    return row(position_rows=ONE_ROW, rope_deltas_after_call=[-42], position_rows_received=1) | change


def explain(nat: dict[str, Any] | None = None, reference: list[list[int]] = REFERENCE, turn1: list = [-42],
            after: list = [-62]) -> Any:
    return decisions.decide_positions_explain(nat or natural(), reference, SPAN, turn1, after)


RAISED = [row("b_full_ids_both_images", "raises ValueError", None, input_ids=IDS),
          row("b_full_ids_both_images_full_types", "raises ValueError", None, input_ids=IDS)]
SHAPES = [row("a_turn2_ids"), row("c_full_ids_image_b"), row("control_text_turn", "matches", 4e-7),
          row("d_x", "not on this release", None)]
FLAGGED = {"a_turn2_ids": "refused", "c_full_ids_image_b": "refused", "control_text_turn": None}

CASES: list[Case] = [
    ("newimage silent: ran and differs", lambda: decisions.decide_silently_wrong(row(), FLOOR), True),
    ("newimage silent: within the noise", lambda: decisions.decide_silently_wrong(row(diff=1.6e-6), FLOOR), False),
    ("newimage silent: just past the noise", lambda: decisions.decide_silently_wrong(row(diff=1.7e-6), FLOOR), True),
    ("newimage silent: raised", lambda: decisions.decide_silently_wrong(row(outcome="raises X", diff=None, error="X"), FLOOR), False),
    ("newimage positions: one stale text row", lambda: explain(), True),
    ("newimage positions: rope_deltas updated", lambda: explain(natural(rope_deltas_after_call=[-62])), False),
    ("newimage positions: state equal to the reference's", lambda: explain(turn1=[-42], after=[-42]), False),
    ("newimage positions: rows as the reference's", lambda: explain(natural(position_rows=REFERENCE)), False),
    ("newimage positions: three rows that differ from each other", lambda: explain(
        natural(position_rows=[ONE_ROW[0], [0] * 49, ONE_ROW[0]])), False),
    ("newimage positions: t a text row, h and w another", lambda: explain(
        natural(position_rows=[ONE_ROW[0], REFERENCE[1], REFERENCE[1]])), False),
    ("newimage positions: one row, not consecutive", lambda: explain(natural(position_rows=[[40] * 49] * 3)), False),
    ("newimage positions: no rows captured", lambda: explain(natural(position_rows=None)), False),
    ("newimage positions: reference rows too short", lambda: explain(reference=[r[:20] for r in REFERENCE]), False),
    ("newimage restores: within the noise, same top-1", lambda: decisions.decide_restores(row(diff=3e-7), FLOOR, "x"), True),
    ("newimage restores: at the threshold", lambda: decisions.decide_restores(row(diff=1.6e-6, top1_equal=True), FLOOR, "x"), True),
    ("newimage restores: past the threshold", lambda: decisions.decide_restores(row(diff=1.7e-6, top1_equal=True), FLOOR, "x"), False),
    ("newimage restores: top-1 changed", lambda: decisions.decide_restores(row(diff=3e-7, top1_equal=False), FLOOR, "x"), False),
    ("newimage restores: did not run", lambda: decisions.decide_restores(row(diff=None, error="boom"), FLOOR, "x"), False),
    ("newimage carried: stale off, carried on", lambda: decisions.decide_carried_forward(row(diff=0.316), row(diff=4.8e-7), FLOOR), True),
    ("newimage carried: stale within the noise", lambda: decisions.decide_carried_forward(row(diff=4.8e-7), row(diff=4.8e-7), FLOOR), False),
    ("newimage carried: carried still off", lambda: decisions.decide_carried_forward(row(diff=0.316), row(diff=0.316), FLOOR), False),
    ("newimage carried: carried did not run", lambda: decisions.decide_carried_forward(row(diff=0.316), row(diff=None), FLOOR), False),
    ("newimage both images: every b call raises with fewer tokens", lambda: decisions.decide_both_images_raise(RAISED, 7, 74), True),
    ("newimage both images: one b call ran", lambda: decisions.decide_both_images_raise(
        RAISED[:1] + [row("b_full_ids_both_images_full_types", input_ids=IDS)], 7, 74), False),
    ("newimage both images: as many features as tokens", lambda: decisions.decide_both_images_raise(RAISED, 7, 25), False),
    ("newimage both images: raised before any first call", lambda: decisions.decide_both_images_raise(
        [row("b_x", "raises StopIteration", None)], 7, 74), False),
    ("newimage both images: none ran here", lambda: decisions.decide_both_images_raise(
        [row("b_x", "not on this release", None)], 7, 74), False),
    ("newimage guard: refuses the silent, passes the matching", lambda: decisions.decide_guard_separates(SHAPES, FLAGGED), True),
    ("newimage guard: a miss", lambda: decisions.decide_guard_separates(SHAPES, {**FLAGGED, "c_full_ids_image_b": None}), False),
    ("newimage guard: a false alarm", lambda: decisions.decide_guard_separates(SHAPES, {**FLAGGED, "control_text_turn": "x"}), False),
    ("newimage guard: nothing matched to pass", lambda: decisions.decide_guard_separates(SHAPES[:2], FLAGGED), False),
    ("newimage guard: nothing silent to refuse", lambda: decisions.decide_guard_separates(SHAPES[2:], FLAGGED), False),
]


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_case(name, thunk, expected):
    d = thunk()
    assert d.holds is expected, (name, d.why)
    assert d.why and isinstance(d.evidence, dict) and isinstance(d.deciding, dict)


def test_uncached_is_what_generate_feeds():
    """helpers.newimage.guardcheck._uncached: the suffix itself where the mask covers cached + suffix, else what follows
    the cache (a whole sequence), else the ids as given."""
    import torch

    from kvresume import vision as guardcheck

    ids = torch.arange(8)[None]
    assert torch.equal(guardcheck._uncached(ids, torch.ones(1, 13), 5), ids)  # mask 5 + 8: the suffix as given
    assert torch.equal(guardcheck._uncached(ids, None, 5), ids[:, 5:])  # no mask: what follows the cache
    assert torch.equal(guardcheck._uncached(ids, torch.ones(1, 8), 5), ids[:, 5:])  # a mask over the ids only
    assert torch.equal(guardcheck._uncached(ids[:, :3], torch.ones(1, 3), 5), ids[:, :3])  # shorter than the cache
    assert torch.equal(guardcheck._uncached(ids[:, :5], None, 5), ids[:, :5])  # exactly the cache's length: as given
    assert torch.equal(guardcheck._uncached(ids, torch.ones(13, 8), 5), ids[:, 5:])  # its columns are read, not its rows
    assert torch.equal(guardcheck._uncached(ids, torch.ones(1, 1, 8, 13), 5), ids)  # a 4-D mask: its last axis
