"""Notebook 04's claims, each decided from the measured rows (its finding names this module)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor
from .splits import SOURCE_COSINE


SOURCE_DOUBLE = {"max_abs_diff": 7.65625}  # Qwen3-VL-2B, fp16, T4 ("max absolute logit difference: 7.65625")
COSINE_FACTOR = 2.0  # "like the source's": 1 - cosine within this factor of the source's 1 - 0.8698 = 0.1302


def _worked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("result") == "worked" and r.get("max_abs_diff") is not None]


def _smallest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return min(rows, key=lambda r: r["max_abs_diff"]) if rows else {}


def _brief(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("cache", "call", "args", "result", "error_type", "max_abs_diff", "cosine", "top1", "top1_equal")
    return [{k: r.get(k) for k in keys} for r in rows]


def decide_valid_split_matches(valid: dict[str, Any], floor: NoiseFloor) -> Decision:
    """The valid split ran, its logits are within the noise of the full forward, and its top-1 is the same."""
    value = valid.get("max_abs_diff") if valid.get("result") == "worked" else None
    holds = value is not None and floor.matches(value) and bool(valid.get("top1_equal"))
    why = ("the valid split did not run" if value is None else
           f"max |diff| {value:.3g} {'<=' if floor.matches(value) else '>'} margin x floor {floor.threshold:.3g}, "
           f"top-1 {'equal' if valid.get('top1_equal') else 'changed'}")
    return Decision(holds, why, {"valid_split": _brief([valid])[0], **floor.evidence(value)},
                    {"max_abs_diff": value, "top1_equal": valid.get("top1_equal")}, {})


def decide_double_processing_diverges(double: list[dict[str, Any]], floor: NoiseFloor) -> Decision:
    """Every double-processing call that ran differs beyond the noise, for the original and the rebuilt cache."""
    ran = _worked(double)
    caches_ran = {r["cache"] for r in ran}
    closest = _smallest(ran)
    holds = bool(ran) and caches_ran == {"original", "rebuilt_update"} and all(floor.differs(r["max_abs_diff"]) for r in ran)
    why = ("no double-processing call ran" if not ran else
           f"calls ran for caches {sorted(caches_ran)}" if caches_ran != {"original", "rebuilt_update"} else
           f"closest run ({closest['cache']}: {closest['call']} {closest['args']}) max |diff| {closest['max_abs_diff']:.4g} "
           f"{'>' if floor.differs(closest['max_abs_diff']) else '<='} margin x floor {floor.threshold:.3g}")
    plain = plain_refeed(ran)
    changed = sum(not r.get("top1_equal") for r in ran)
    return Decision(holds, why, {"runs": _brief(ran), "failed_runs": _brief([r for r in double if r not in ran]),
                                 "top1_changed_in": changed, "plain_refeed": _brief([plain])[0] if plain else None,
                                 **floor.evidence(closest.get("max_abs_diff"))},
                    {"max_abs_diff": plain.get("max_abs_diff"), "top5_overlap": plain.get("top5_overlap")}, SOURCE_DOUBLE,
                    [refeed_note(plain, closest, changed, len(ran))])


def _token(value: Any) -> Any:
    """A token id as an int (pandas records hold floats)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def decide_top1_changed(double: list[dict[str, Any]]) -> Decision:
    """The source's "top-1 token: changed": the plain re-feed's top-1 differs from the full forward's."""
    plain = plain_refeed(_worked(double))
    changed = bool(plain) and not plain.get("top1_equal")
    margin, shift = plain.get("top1_margin_reference"), plain.get("max_abs_diff")
    if not plain:
        why = "no plain re-feed ran: the source's top-1 cannot be compared"
    elif changed:
        why = f"the plain re-feed's top-1 is token {_token(plain.get('top1'))}, the full forward's {_token(plain.get('top1_reference'))}"
    else:
        why = (f"top-1 unchanged (token {_token(plain.get('top1'))}): this model's re-feed shift (max |diff| {shift:.3g}) does not "
               f"overturn its top-1 lead of {margin:.3g} over top-2; the tiny random-weight model cannot show the source's "
               "change, which the real 2B checkpoint would decide (`-p model_id ...` online)")
    return Decision(changed, why, {"plain_refeed": _brief([plain])[0] if plain else None, "top1_margin_reference": margin},
                    {"top1_changed": None if not plain else changed, "top1_margin": margin}, {"top1_changed": True})


def decide_cosine_like_source(double: list[dict[str, Any]]) -> Decision:
    """The source's "cosine similarity: 0.8698": the plain re-feed's 1 - cosine is within COSINE_FACTOR of the source's."""
    plain = plain_refeed(_worked(double))
    cos = plain.get("cosine")
    want = 1.0 - SOURCE_COSINE
    low, high = want / COSINE_FACTOR, want * COSINE_FACTOR
    holds = cos is not None and low <= 1.0 - cos <= high
    why = ("no plain re-feed ran" if cos is None else
           f"1 - cosine {1.0 - cos:.3g} {'within' if holds else 'outside'} [{low:.3g}, {high:.3g}] (the source's "
           f"{want:.4g} within a factor {COSINE_FACTOR:g})" + ("" if holds else
                                                               f"; this model's logits move {'less' if 1.0 - cos < low else 'more'} "
                                                               "than the source's 2B checkpoint's under the same re-feed"))
    return Decision(holds, why, {"plain_refeed": _brief([plain])[0] if plain else None, "band_one_minus_cosine": [low, high]},
                    {"cosine": cos}, {"cosine": SOURCE_COSINE})


def plain_refeed(ran: list[dict[str, Any]]) -> dict[str, Any]:
    """The source's quantity: prompt[-1] re-fed with no explicit positions (generate() with the L+1 mask, else forward()
    with no mask), original cache; {} when none ran."""
    first = {(r.get("call"), r.get("args")): r for r in reversed(ran) if r.get("cache") == "original"}
    return first.get(("generate", "full mask (L+1)")) or first.get(("forward", "no mask")) or {}


def refeed_note(plain: dict[str, Any], closest: dict[str, Any], changed: int, n: int) -> str:
    """What 'this run' shows beside the source's 7.66, and whether the source's top-1 change shows here."""
    if not plain:
        return "no plain re-feed ran, so nothing here is the source's quantity."
    where = f"{plain['call']}() with {plain['args']}"
    top1 = (f"top-1 changed in {changed} of {n} double-processing runs; the source's top-1 change and cosine are decided "
            "as boundary.double_processing_top1_changed and boundary.double_processing_cosine")
    return (f"this run's value is the plain re-feed ({where}, the source's quantity); the deciding minimum over all "
            f"{n} runs is {closest.get('max_abs_diff'):.3g} ({closest.get('call')}() with {closest.get('args')}); {top1}.")


def decide_rebuilt_same_as_original(per_call: list[dict[str, Any]], kv_bitwise_equal: bool, shares_storage: bool) -> Decision:
    """Per double-processing call the rebuilt cache does what the original does (status, bits), from its own storage."""
    same = [r for r in per_call if r["same_status"] and r.get("logits_bitwise_equal") in (True, None)]
    holds = bool(per_call) and len(same) == len(per_call) and kv_bitwise_equal and not shares_storage
    why = (f"{len(same)}/{len(per_call)} calls identical; K/V bitwise equal: {kv_bitwise_equal}; "
           f"shares the original's storage: {shares_storage}")
    return Decision(holds, why, {"per_call": per_call, "kv_bitwise_equal": kv_bitwise_equal, "shares_storage": shares_storage},
                    {"calls_identical": f"{len(same)}/{len(per_call)}", "shares_storage": shares_storage}, {})


def decide_mask_and_positions_do_not_restore(restoring: list[dict[str, Any]], floor: NoiseFloor) -> Decision:
    """The runs with the full (L+1) mask and explicit positions still differ beyond the noise."""
    ran = _worked(restoring)
    closest = _smallest(ran)
    holds = bool(ran) and all(floor.differs(r["max_abs_diff"]) for r in ran)
    why = ("no run with mask and positions ran" if not ran else
           f"closest ({closest['cache']}: {closest['call']}) max |diff| {closest['max_abs_diff']:.4g} "
           f"{'>' if holds else '<='} margin x floor {floor.threshold:.3g}")
    unchanged = bool(ran) and all(r.get("top1_equal") for r in ran)
    return Decision(holds, why, {"runs": _brief(ran), **floor.evidence(closest.get("max_abs_diff"))},
                    {"max_abs_diff": closest.get("max_abs_diff"), "cosine": closest.get("cosine"),
                     "top1_changed": None if not ran else not closest.get("top1_equal")}, {},
                    ["top-1 unchanged under mask + positions here: the tiny model's shift stays below a top-1 change; "
                     "'does not restore' is judged against the noise floor."] if unchanged else [])
