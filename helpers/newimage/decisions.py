"""Notebook 09's verdicts, each computed from this run's measurements (rows of helpers.newimage.shapes and the
repair), against the noise floor measured in the same run and dtype."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor


def _ran(row: dict[str, Any] | None) -> bool:
    return bool(row) and row.get("max_abs_diff") is not None


def image_b_positions(rows: list[list[int]] | None, span: tuple[int, int]) -> list[list[int]] | None:
    """The [t, h, w] rows over image B's tokens (span inside turn 2), None where no rows were captured."""
    if not rows or len(rows) != 3 or len(rows[0]) < span[1]:
        return None
    return [r[span[0]:span[1]] for r in rows]


def decide_silently_wrong(natural: dict[str, Any], floor: NoiseFloor) -> Decision:
    """The natural call (turn-2 ids + image B + full mask) runs without an error and its logits differ from the
    one-forward reference beyond the noise."""
    value = natural.get("max_abs_diff") if _ran(natural) else None
    holds = _ran(natural) and floor.differs(value)
    why = (f"did not run: {natural.get('error') or natural.get('outcome')}" if not _ran(natural) else
           f"ran, max |diff| {value:.4g} {'>' if holds else '<='} noise threshold {floor.threshold:.3g}, cosine "
           f"{natural.get('cosine'):.4f}, top-5 overlap {natural.get('top5_overlap')}/5")
    return Decision(holds, why, {"natural": natural, **floor.evidence(value)},
                    {"max_abs_diff": value, "cosine": natural.get("cosine")}, {})


def decide_positions_explain(natural: dict[str, Any], reference_rows: list[list[int]], span: tuple[int, int],
                             turn1_state: list, reference_state: list) -> Decision:
    """Why: over image B's tokens the first call's three position rows are one text row (t == h == w, consecutive)
    and differ from the reference's, and rope_deltas after the call is still turn 1's, not the reference's."""
    got = image_b_positions(natural.get("position_rows"), span)
    want = image_b_positions(reference_rows, span)
    after = natural.get("rope_deltas_after_call")
    one_row = got is not None and got[0] == got[1] == got[2] and got[0] == list(range(got[0][0], got[0][0] + len(got[0])))
    differs = got is not None and want is not None and got != want
    stale = after == turn1_state and after != reference_state
    holds = one_row and differs and stale
    first = lambda rows: None if rows is None else [r[0] for r in rows]  # noqa: E731 - (t, h, w) of B's first token
    last = lambda rows: None if rows is None else [r[-1] for r in rows]  # noqa: E731
    why = (f"image B's tokens at t/h/w {first(got)}..{last(got)} (one text row: {one_row}) instead of "
           f"{first(want)}..{last(want)}; rope_deltas after the call {after} (turn 1: {turn1_state}, reference: "
           f"{reference_state})")
    return Decision(holds, why, {"resumed_rows_image_b": got, "reference_rows_image_b": want, "one_text_row": one_row,
                                 "rows_differ": differs, "rope_deltas_after_call": after, "turn1_rope_deltas": turn1_state,
                                 "reference_rope_deltas": reference_state, "rows_received": natural.get("position_rows_received")},
                    {"image_b_last_token_thw": last(got), "reference_last_token_thw": last(want),
                     "rope_deltas_after": after, "reference_rope_deltas": reference_state}, {})


def decide_restores(row: dict[str, Any], floor: NoiseFloor, what: str) -> Decision:
    """A repaired resume, or the text-only control turn (`what`), matches the one-forward reference within the noise, with the same top-1."""
    value = row.get("max_abs_diff") if _ran(row) else None
    holds = _ran(row) and floor.matches(value) and bool(row.get("top1_equal"))
    why = (f"{what} did not run: {row.get('error')}" if not _ran(row) else
           f"{what}: max |diff| {value:.3g} {'<=' if floor.matches(value) else '>'} noise threshold {floor.threshold:.3g}, "
           f"top-1 {'equal' if row.get('top1_equal') else 'changed'}")
    return Decision(holds, why, {"row": row, **floor.evidence(value)}, {"max_abs_diff": value}, {})


def decide_carried_forward(stale: dict[str, Any], carried: dict[str, Any], floor: NoiseFloor) -> Decision:
    """The token after turn 2 differs from its reference with rope_deltas left at turn 1's value and matches it once
    the state is carried forward to its value after turn 2."""
    ok = _ran(stale) and _ran(carried)
    holds = ok and floor.differs(stale["max_abs_diff"]) and floor.matches(carried["max_abs_diff"])
    why = ("a continuation did not run" if not ok else
           f"state left at turn 1's: max |diff| {stale['max_abs_diff']:.4g}; carried forward: "
           f"{carried['max_abs_diff']:.3g} (noise threshold {floor.threshold:.3g})")
    return Decision(holds, why, {"stale": stale, "carried": carried, **floor.evidence(carried.get("max_abs_diff"))},
                    {"max_abs_diff_stale": stale.get("max_abs_diff"), "max_abs_diff_carried": carried.get("max_abs_diff")}, {})


def decide_both_images_raise(rows: list[dict[str, Any]], image_token_id: int, features_both: int) -> Decision:
    """Every call passing both images' pixels raises inside its first model call, whose ids hold only turn 2's image
    tokens while the pixels encode both images (image A is encoded again although its tokens are cached)."""
    both = [r for r in rows if r["key"].startswith("b_") and r["outcome"] != "not on this release"]
    tokens = [None if r.get("input_ids") is None else sum(1 for t in r["input_ids"] if t == image_token_id) for r in both]
    raised = bool(both) and all(r["outcome"].startswith("raises") for r in both)
    fewer = bool(tokens) and all(n is not None and n < features_both for n in tokens)
    holds = raised and fewer
    why = (f"{'; '.join(r['key'] + ': ' + r['outcome'] for r in both) or 'no such call ran'}; image tokens in the first "
           f"call's ids {tokens}, features of both images' pixels {features_both}")
    return Decision(holds, why, {"calls": [{k: r.get(k) for k in ("key", "outcome", "error", "input_ids_shape")} for r in both],
                                 "image_tokens_in_first_call": tokens, "features_both_images": features_both},
                    {"outcomes": [r["outcome"] for r in both], "image_tokens_in_first_call": tokens,
                     "features_both_images": features_both}, {})


def decide_guard_separates(rows: list[dict[str, Any]], flagged: dict[str, str | None]) -> Decision:
    """The new-vision-token check refuses every call that is silently wrong and passes every call that matches."""
    silent = [r["key"] for r in rows if r["outcome"] == "silently wrong"]
    good = [r["key"] for r in rows if r["outcome"] == "matches"]
    missed = [k for k in silent if not flagged.get(k)]
    false_alarms = [k for k in good if flagged.get(k)]
    holds = bool(silent) and bool(good) and not missed and not false_alarms
    why = (f"refused {len(silent) - len(missed)}/{len(silent)} silently wrong calls, passed "
           f"{len(good) - len(false_alarms)}/{len(good)} matching ones"
           + (f"; missed {missed}" if missed else "") + (f"; false alarms {false_alarms}" if false_alarms else ""))
    return Decision(holds, why, {"silently_wrong": silent, "matching": good, "missed": missed,
                                 "false_alarms": false_alarms, "messages": flagged},
                    {"missed": len(missed), "false_alarms": len(false_alarms)}, {})
