"""Notebook 01's claims, each decided from the measured rows (its finding names this module)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision, NoiseFloor


METADATA = ("n_layers", "layer_classes", "seq_length", "kv_shapes", "kv_dtype")
SOURCE_METADATA = {"rebuilt_matching_original": "3/3", "seq_length": 81}  # 28 DynamicLayer layers each
SOURCE_LOGITS = {"bitwise_equal": "15/15", "max_abs_diff": 0.0}


def _rebuilt(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("available") and r["variant"] != "original"]


def decide_cache_metadata_match(rows: list[dict[str, Any]]) -> Decision:
    """Every available rebuilt variant has the original's layer count, classes, length, K/V shapes and dtype."""
    original = next((r for r in rows if r["variant"] == "original" and r.get("available")), None)
    rebuilt = _rebuilt(rows)
    same = [r["variant"] for r in rebuilt if original and all(r[k] == original[k] for k in METADATA)]
    holds = original is not None and len(rebuilt) > 0 and len(same) == len(rebuilt)
    differing = {r["variant"]: {k: r[k] for k in METADATA if original and r[k] != original[k]} for r in rebuilt if r["variant"] not in same}
    why = (f"all {len(rebuilt)} rebuilt variants report the original's metadata" if holds else
           "no rebuilt variant to compare" if not rebuilt or original is None else f"metadata differs: {differing}")
    return Decision(holds, why, {"variants_compared": [r["variant"] for r in rebuilt], "differing": differing,
                                 "unavailable": [r["variant"] for r in rows if not r.get("available")],
                                 "original": {k: original[k] for k in METADATA} if original else None},
                    {"rebuilt_matching_original": f"{len(same)}/{len(rebuilt)}",
                     "seq_length": original["seq_length"] if original else None}, SOURCE_METADATA,
                    [f"{original['n_layers'] if original else '?'} layers of {original['layer_classes'] if original else '?'} "
                     "here against the source's 28 DynamicLayer layers: the layer count is the model's, the match is per layer."])


def decide_kv_bitwise_equal(rows: list[dict[str, Any]]) -> Decision:
    """Every rebuilt variant's K/V is bitwise equal to the original's and lives in its own storage."""
    rebuilt = _rebuilt(rows)
    equal = [r["variant"] for r in rebuilt if r["kv_bitwise_equal"]]
    aliased = [r["variant"] for r in rebuilt if r["shares_storage"]]
    holds = len(rebuilt) > 0 and len(equal) == len(rebuilt) and not aliased
    why = (f"{len(equal)}/{len(rebuilt)} rebuilt caches bitwise equal, none sharing the original's storage" if holds else
           "no rebuilt variant to compare" if not rebuilt else
           f"bitwise equal: {equal}; sharing storage with the original (equality by construction): {aliased}")
    return Decision(holds, why, {"kv_bitwise_equal": {r["variant"]: r["kv_bitwise_equal"] for r in rebuilt},
                                 "shares_storage": {r["variant"]: r["shares_storage"] for r in rebuilt}},
                    {"bitwise_equal": f"{len(equal)}/{len(rebuilt)}", "sharing_storage": len(aliased)},
                    {"bitwise_equal": "3/3"})


def decide_first_step_logits_equal(comparisons: list[dict[str, Any]], floor: NoiseFloor, aliased: list[str]) -> Decision:
    """Under identical arguments every rebuilt cache's first-step logits are bitwise the original's.

    The source reports exact identity, so the test is bitwise; the noise floor is in the evidence to show
    how far below it the measured difference sits. `aliased`: rebuilt variants sharing the original's storage.
    """
    ran = [c for c in comparisons if c.get("ran")]
    equal = sum(bool(c["bitwise_equal"]) for c in ran)
    worst = max((float(c["max_abs_diff"]) for c in ran), default=None)
    holds = len(ran) > 0 and equal == len(ran) and not aliased
    why = (f"{equal}/{len(ran)} comparisons bitwise equal (max |diff| {worst})" if holds else
           "no comparison ran" if not ran else
           f"only {equal}/{len(ran)} comparisons bitwise equal (max |diff| {worst}; {floor.threshold:.3g} is the "
           f"noise threshold)" + (f"; caches sharing storage: {aliased}" if aliased else ""))
    return Decision(holds, why, {"comparisons": len(ran), "bitwise_equal": equal, "shares_storage": aliased,
                                 "generation_variants_that_ran": sorted({c["generation"] for c in ran}),
                                 **floor.evidence(worst)},
                    {"bitwise_equal": f"{equal}/{len(ran)}", "max_abs_diff": worst}, SOURCE_LOGITS,
                    [count_note(ran)])


def count_note(ran: list[dict[str, Any]]) -> str:
    """What this run's count counts, beside what the source's 15 counts."""
    caches = sorted({c["cache_variant"] for c in ran})
    gens = sorted({c["generation"] for c in ran})
    return (f"this run's {len(ran)} = {len(caches)} rebuilt caches ({', '.join(caches)}) x {len(gens)} argument sets that "
            f"run ({', '.join(gens)}; neither and position_only fail for every cache, see 02); the source's 15 are its "
            "'valid original-versus-rebuilt first-step comparisons', a breakdown it does not give.")
