"""Notebook 10's verdicts, computed from the probes' rows and a noise floor measured in the same run."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor

RAN = ("restored", "silently wrong")  # a crop that ran and was continued from


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), {})


def _restored(row: dict[str, Any], floor: NoiseFloor) -> bool:
    return row.get("outcome") in RAN and floor.matches(row.get("next_logits_diff")) and row.get("kv_held_diff") in (0.0, None)


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("family", "mode", "outcome", "length", "kv_held_diff", "conv_diff", "recurrent_diff", "next_logits_diff", "error")
    return {k: row.get(k) for k in keys if row.get(k) is not None}


def decide_dense_crop(rows: list[dict[str, Any]], floor: NoiseFloor) -> Decision:
    """dense, no recording: crop(-k) ran, the held K/V equal the fresh cache's and the next logits match."""
    row = _row(rows, family="dense", mode="plain")
    holds = _restored(row, floor)
    why = ("crop(-k) gave back the fresh cache's K/V and next-token logits" if holds else
           f"dense crop(-k): {row.get('outcome')} ({row.get('error') or row.get('next_logits_diff')})")
    return Decision(holds, why, {**_brief(row), **floor.evidence(row.get("next_logits_diff"))},
                    {"next_logits_diff": row.get("next_logits_diff"), "threshold": floor.threshold}, {})


def decide_plain_never_silent(rows: list[dict[str, Any]], floors: dict[str, NoiseFloor]) -> Decision:
    """No recording: every family's crop(-k) restores or refuses; none runs and differs beyond its floor."""
    plain = [r for r in rows if r.get("mode") == "plain"]
    wrong = [r["family"] for r in plain if r.get("outcome") in RAN and floors[r["family"]].differs(r.get("next_logits_diff"))]
    outcomes = {r["family"]: r.get("outcome") for r in plain}
    why = (f"without recording: {outcomes}" if not wrong else f"silently wrong without recording: {wrong}")
    return Decision(bool(plain) and not wrong, why, {"rows": [_brief(r) for r in plain]},
                    {"silently_wrong": wrong, "outcomes": outcomes}, {})


def decide_recurrent_not_rolled_back(rows: list[dict[str, Any]], floor: NoiseFloor) -> Decision:
    """The hybrid with recording on as the release offers it (#49036's mechanism): a crop(-k) that ran left the conv
    state equal to the fresh cache's, the recurrent state not, and the next logits beyond the noise; no mode restored."""
    recorded = [r for r in rows if r.get("family") == "hybrid" and r.get("mode") != "plain"]
    restored = [r["mode"] for r in recorded if _restored(r, floor) and not r.get("recurrent_diff") and not r.get("conv_diff")]
    stale = [r for r in recorded if r.get("outcome") in RAN and r.get("conv_diff") == 0.0
             and (r.get("recurrent_diff") or 0.0) > 0.0 and floor.differs(r.get("next_logits_diff"))]
    if restored:
        why = f"crop(-k) with {restored[0]} restored conv and recurrent states and the next logits"
    elif stale:
        r = stale[0]
        why = (f"{r['mode']}: conv state rolled back, recurrent state not (max |diff| {r.get('recurrent_diff'):.3g}); "
               f"next logits off by {r.get('next_logits_diff'):.3g}")
    else:
        why = "no recording mode ran and differed: " + "; ".join(f"{r['mode']}: {r.get('outcome')} {r.get('error') or ''}"
                                                                 for r in recorded)
    return Decision(bool(stale) and not restored, why, {"rows": [_brief(r) for r in recorded], **floor.evidence()},
                    {"stale_recurrent_diff": stale[0].get("recurrent_diff") if stale else None, "restored_modes": restored}, {})


def decide_recording_runs(rows: list[dict[str, Any]]) -> Decision:
    """activate_past_recording() with no argument: the hybrid's k-token forward runs (no exception while recording)."""
    row = _row(rows, family="hybrid", mode="record")
    holds = bool(row) and row.get("outcome") not in ("raised while recording", "not offered")
    why = f"the k-token forward after activate_past_recording(): {row.get('outcome')}" + (f" ({row.get('error')})" if not holds else "")
    return Decision(holds, why, _brief(row), {"outcome": row.get("outcome")}, {})


def decide_family_recorded(rows: list[dict[str, Any]], family: str, floor: NoiseFloor) -> Decision:
    """Recording on in some way the release offers: that family's crop(-k) gives back the fresh cache."""
    mine = [r for r in rows if r.get("family") == family and r.get("mode") != "plain"]
    ok = [r["mode"] for r in mine if _restored(r, floor)]
    why = (f"{family}: crop(-k) with {ok[0]} restored the held K/V and next logits" if ok else
           f"{family}: " + "; ".join(f"{r['mode']}: {r.get('outcome')} {r.get('error') or r.get('next_logits_diff') or ''}"
                                     for r in mine))
    return Decision(bool(ok), why, {"rows": [_brief(r) for r in mine], **floor.evidence()}, {"restored_modes": ok}, {})


def decide_refused(rows: list[dict[str, Any]], family: str) -> Decision:
    """Every way of rolling that family back raises (at crop, or recording is not offered): none runs."""
    mine = [r for r in rows if r.get("family") == family]
    ran = [r["mode"] for r in mine if r.get("outcome") in RAN]
    why = (f"{family}: every crop(-k) raised: {mine[0].get('error') if mine else ''}" if mine and not ran else
           f"{family}: crop(-k) ran with {ran}")
    return Decision(bool(mine) and not ran, why, {"rows": [_brief(r) for r in mine]}, {"ran_modes": ran}, {})


def decide_continuation(rows: list[dict[str, Any]], floor: NoiseFloor) -> Decision:
    """Every suffix, by forward() and generate(): ran, fed exactly the suffix, last logits within the noise."""
    bad = [r for r in rows if r.get("error") or r.get("fed") != r["suffix"] or not floor.matches(r.get("max_abs_diff"))]
    worst = max((r.get("max_abs_diff") or 0.0 for r in rows), default=None)
    why = (f"{len(rows)} continuations within the noise (worst {worst:.3g})" if not bad else
           "; ".join(f"suffix {r['suffix']} {r['call']}: fed {r.get('fed')}, diff {r.get('max_abs_diff')} {r.get('error') or ''}" for r in bad))
    return Decision(bool(rows) and not bad, why, {"rows": rows, **floor.evidence(worst)}, {"worst": worst, "threshold": floor.threshold}, {})


def _rebuild_ok(row: dict[str, Any], original: dict[str, Any]) -> bool:
    return not row.get("error") and row.get("length") == original.get("length") and row.get("fed") == original.get("fed") \
        and row.get("max_abs_diff") == 0.0


def decide_rebuild(rows: list[dict[str, Any]], names: tuple[str, ...]) -> Decision:
    """Each named rebuild reports the original's length, generate() feeds what it feeds from the original, the
    first step is bitwise the original's; where not, the length it reported and the tokens fed."""
    original = _row(rows, rebuild="original")
    chosen = [_row(rows, rebuild=n) for n in names]
    bad = [r for r in chosen if not _rebuild_ok(r, original)]
    why = (f"{', '.join(names)}: length {original.get('length')}, {original.get('fed')} token fed, bitwise" if not bad else
           "; ".join(f"{r.get('rebuild')}: length {r.get('length')} (original {original.get('length')}), generate() fed "
                     f"{r.get('fed')} (original {original.get('fed')}), off by {r.get('max_abs_diff')}"
                     f"{' ' + r['error'] if r.get('error') else ''}" for r in bad))
    return Decision(bool(original) and all(chosen) and not bad, why, {"rows": [original, *chosen]},
                    {"lengths": {r.get("rebuild"): r.get("length") for r in chosen}, "original_length": original.get("length")}, {})


def decide_assisted_never_wrong(rows: list[dict[str, Any]]) -> Decision:
    """Every family's greedy equals its no-cache run, and no assisted way that ran gave other tokens."""
    wrong = [f"{r['family']} · {r['way']}" for r in rows if r.get("outcome") == "differs"]
    refused = [f"{r['family']} · {r['way']}" for r in rows if r.get("outcome") == "refused"]
    greedy_ok = all(r.get("outcome") == "equal" for r in rows if r.get("way") == "greedy")
    holds = bool(rows) and greedy_ok and not wrong
    why = (f"{sum(r.get('outcome') == 'equal' for r in rows)} runs equal to no-cache greedy; refused: {refused or 'none'}"
           if holds else f"other tokens than no-cache greedy: {wrong or 'greedy itself'}")
    slim = [{k: v for k, v in r.items() if k not in ("tokens", "no_cache_tokens")} for r in rows]
    return Decision(holds, why, {"rows": slim}, {"differs": wrong, "refused": refused}, {})


def decide_assisted_refused(rows: list[dict[str, Any]], family: str = "hybrid") -> Decision:
    """Both assisted ways (prompt lookup, own assistant) raise on that family."""
    mine = [r for r in rows if r.get("family") == family and r.get("way") != "greedy"]
    ran = [r["way"] for r in mine if r.get("outcome") != "refused"]
    why = (f"{family}: refused ({mine[0].get('error')})" if mine and not ran else f"{family}: ran with {ran}")
    return Decision(bool(mine) and not ran, why, {"rows": [{k: r.get(k) for k in ("way", "outcome", "error")} for r in mine]},
                    {"ran": ran}, {})


def _case(rows: list[dict[str, Any]], starts: str) -> dict[str, Any]:
    return next((r for r in rows if str(r.get("case", "")).startswith(starts)), {})


def decide_static_case(rows: list[dict[str, Any]], starts: str, outcome: str) -> Decision:
    """The static-reuse case whose description starts with `starts` came out as `outcome` (raises / matches)."""
    row = _case(rows, starts)
    holds = row.get("outcome") == outcome
    why = f"{row.get('case')}: {row.get('outcome')}" + (f" ({row.get('error')})" if row.get("error") else "")
    return Decision(holds, why, row, {"outcome": row.get("outcome"), "expected": outcome}, {})


def decide_max_cache_len_ignored(rows: list[dict[str, Any]]) -> Decision:
    """cache_config max_cache_len: the static cache generate() allocates has the call's size, not the one requested,
    and the tokens are right."""
    row = _case(rows, "cache_implementation='static', cache_config")
    cap, requested = row.get("capacity"), row.get("requested")
    holds = row.get("outcome") == "matches" and cap is not None and requested is not None and cap != requested
    why = f"requested max_cache_len {requested}, allocated {cap} (the call needs {row.get('needed')}); {row.get('outcome')}"
    return Decision(holds, why, row, {"capacity": cap, "requested": requested}, {})
