"""Finding 1: identity-rebuilt caches against the original, on metadata, bits and first-step logits."""
from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from .caches import Variant, describe, fresh_copy, kv_bitwise_equal
from .compare import logit_metrics
from .continuation import GENERATION_VARIANTS, current_position_ids, generate_first_step, generation_kwargs
from .inputs import Prompt


def metadata_table(variants: dict[str, Variant], reference: Any) -> pd.DataFrame:
    """Per variant: how it was built, layer count/classes, reported length, K/V shapes, bitwise equality."""
    rows = []
    for v in variants.values():
        if v.cache is None:
            rows.append({"variant": v.name, "how": v.how, "available": False, "note": v.unavailable})
            continue
        info = describe(v.cache)
        rows.append({"variant": v.name, "how": v.how, "available": True, "n_layers": info["n_layers"],
                     "layer_classes": ", ".join(info["layer_classes"]), "seq_length": info["seq_length"],
                     "kv_shapes": "; ".join(info["kv_shapes"]), "kv_dtype": ", ".join(info["kv_dtype"]),
                     "kv_bitwise_equal": kv_bitwise_equal(v.cache, reference), "note": ""})
    return pd.DataFrame(rows).set_index("variant")


def first_step_logits(model: torch.nn.Module, prompt: Prompt, variants: dict[str, Variant]) -> dict[tuple[str, str], Any]:
    """(generation variant, cache variant) -> Outcome of generate() from that cache with those arguments."""
    positions = current_position_ids(model, prompt)
    outcomes = {}
    for gen in GENERATION_VARIANTS:
        for v in variants.values():
            if v.cache is not None:
                outcomes[(gen, v.name)] = generate_first_step(model, prompt.last_token, fresh_copy(v),
                                                              **generation_kwargs(gen, prompt, positions))
    return outcomes


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
