"""Finding 1: identity-rebuilt caches against the original, on metadata, bits and first-step logits."""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..caches import Variant, describe, fresh_copy, kv_bitwise_equal, shares_storage
from ..compare import logit_metrics
from ..continuation import GENERATION_VARIANTS, current_position_ids, generate_first_step, generation_kwargs
from ..inputs import Prompt


def metadata_table(variants: dict[str, Variant], reference: Any) -> pd.DataFrame:
    """Per variant: how it was built, layer count/classes, reported length, K/V shapes, bitwise equality,
    and whether its K/V storage overlaps the reference's (equality by aliasing would prove nothing)."""
    rows = []
    for v in variants.values():
        if v.cache is None:
            rows.append({"variant": v.name, "how": v.how, "available": False, "note": v.unavailable})
            continue
        rows.append({"variant": v.name, "how": v.how, "available": True, **describe(v.cache),
                     "kv_bitwise_equal": kv_bitwise_equal(v.cache, reference),
                     "shares_storage": shares_storage(v.cache, reference), "note": ""})
    return pd.DataFrame(rows).set_index("variant")


def first_step_logits(model: torch.nn.Module, prompt: Prompt, variants: dict[str, Variant]) -> dict[tuple[str, str], Any]:
    """(generation variant, cache variant) -> Outcome of generate() from that cache with those arguments."""
    positions = current_position_ids(model, prompt)
    return {(gen, v.name): generate_first_step(model, prompt.last_token, fresh_copy(v),
                                               **generation_kwargs(gen, prompt, positions))
            for gen in GENERATION_VARIANTS for v in variants.values() if v.cache is not None}


def logits_table(outcomes: dict[tuple[str, str], Any], reference: str = "original") -> pd.DataFrame:
    """Each rebuilt variant's first-step logits against the original's, per generation variant that ran."""
    rows = []
    for (gen, name), out in outcomes.items():
        ref = outcomes[(gen, reference)]
        if name == reference:
            continue
        row = {"generation": gen, "cache_variant": name, "ran": out.ok and ref.ok}
        if row["ran"]:
            row.update(logit_metrics(ref.logits, out.logits))
        rows.append(row)
    return pd.DataFrame(rows)


def _comparison_cell(r: Any) -> tuple[str, str]:
    if not r.ran:
        return "not run", "generate() failed\nfor every cache (02)"
    if bool(r.bitwise_equal):
        return "equal", "bitwise equal\nmax |diff| 0"
    return "differs", f"max |diff| {float(r.max_abs_diff):.3g}\ncosine {float(r.cosine):.6f}"


def comparison_grid(comparisons: pd.DataFrame) -> tuple[list[str], list[str], list[list[str]], list[list[str]]]:
    """(rebuilt variants, generation variants, status, text) for plots.status_grid: one cell per original-vs-rebuilt
    comparison, 'equal' (bitwise) / 'differs' (with its max |diff|) / 'not run' (generate failed for every cache)."""
    from ..plots import grid_cells  # matplotlib only when a figure is drawn

    return grid_cells(comparisons, "cache_variant", "generation", _comparison_cell)
