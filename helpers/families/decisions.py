"""Notebook 07's claims, each a function of measured cells (never of error text alone)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision
from .checks import Cell, Measured

MATCHING = ("bitwise", "matches")
SOURCE_SLIDING = {"control": "sliding layers may track cumulative processed length separately (cache_utils.py); "
                             "sliding/hybrid caches are on its regression list, not run"}


def _value(cell: Cell) -> Any:
    return cell.value if cell.value is not None else cell.status


def _aware_bitwise(m: Measured) -> bool:
    return (m.extra.get("family_rebuild_state_equal") is True
            and all(m.cells[c].status == "bitwise" for c in ("family_rebuild·generate", "family_rebuild·forward")))


def decide_sliding_hidden(m: Measured) -> Decision:
    """The control's rebuild reports a shorter processed length, and generate() with the full mask still matches."""
    rebuilt, processed = m.extra.get("control_rebuild_seq_length"), m.extra["processed_length"]
    cell = m.cells["control_rebuild·generate"]
    shorter = rebuilt is not None and rebuilt < processed
    holds = shorter and cell.status in MATCHING and _aware_bitwise(m)
    deciding = {"control_rebuild_get_seq_length": rebuilt, "processed_length": processed,
                "generate_full_mask_vs_original": _value(cell), "noise_threshold": m.floor.threshold}
    why = (f"the control's rebuild reports get_seq_length() {rebuilt} for {processed} processed tokens; generate() with the "
           f"full {m.family.full_mask.shape[-1]}-column mask: {cell.status} (max |diff| {cell.value}) vs the original; "
           f"family-aware rebuild bitwise: {_aware_bitwise(m)}")
    evidence = {**deciding, "original_widths": m.extra["original_widths"], "control_rebuild_lengths": m.extra.get("control_rebuild_lengths"),
                "first_call": cell.first_call, "family_rebuild_lengths": m.extra["family_rebuild_lengths"], **m.floor.evidence(cell.value)}
    return Decision(holds, why, evidence, deciding, SOURCE_SLIDING)


def decide_sliding_forward(m: Measured) -> Decision:
    """A direct forward positioned from the rebuilt cache differs beyond the floor; the family-aware rebuild is bitwise."""
    cell = m.cells["control_rebuild·forward"]
    holds = cell.status == "differs" and cell.value is not None and _aware_bitwise(m)
    deciding = {"forward_from_cache_vs_original": _value(cell), "noise_threshold": m.floor.threshold,
                "family_rebuild_bitwise": _aware_bitwise(m)}
    why = (f"direct forward (full mask, position from the cache) from the control's rebuild: {cell.status} "
           f"(max |diff| {cell.value}, threshold {m.floor.threshold:.3g}); position came from get_seq_length() "
           f"{m.extra.get('control_rebuild_seq_length')} instead of {m.extra['processed_length']}")
    evidence = {**deciding, "first_call": cell.first_call, **m.floor.evidence(cell.value)}
    return Decision(holds, why, evidence, deciding, SOURCE_SLIDING)


def decide_sliding_backends(m: Measured) -> Decision:
    """generate() (full mask) from the control's sliding rebuild: sdpa matches the original, eager raises inside the
    first model call (the mask built for the sliding layer meets a plain layer of the stored width)."""
    by_kernel = {m.extra["kernel"]: m.cells["control_rebuild·generate"], m.extra["other_kernel"]: m.cells["control_rebuild·other_kernel"]}
    sdpa, eager = by_kernel.get("sdpa"), by_kernel.get("eager")
    inside = eager is not None and eager.status == "error" and "inside the first model call" in eager.detail
    holds = sdpa is not None and sdpa.status in MATCHING and inside
    deciding = {"sdpa": _value(sdpa) if sdpa else "not run", "eager": eager.status if eager else "not run",
                "noise_threshold": m.floor.threshold}
    why = (f"control's sliding rebuild, generate() with the full mask: sdpa {sdpa.status if sdpa else 'not run'}"
           f"{f' ({sdpa.value})' if sdpa and sdpa.value is not None else ''}; eager {eager.status if eager else 'not run'}"
           f"{': ' + eager.detail if eager and eager.detail else ''}")
    evidence = {**deciding, "eager_first_call": eager.first_call if eager else {}, "eager_detail": eager.detail if eager else ""}
    return Decision(holds, why, evidence, deciding, {"transformers #35168": "layer-dependent cache lengths behaved differently "
                                                                            "between FlashAttention 2 and SDPA/eager"})


def decide_hybrid(m: Measured) -> Decision:
    """The control's rebuild cannot read linear layers (no K/V); the attention-only variant errors or differs."""
    error = m.extra.get("control_rebuild_error") or ""
    linear = [i for i, (cls, w) in enumerate(zip(m.extra["layer_classes"], m.extra["original_widths"])) if w is None]
    variant = m.cells["config_rebuild·generate"]
    cannot = error.startswith("AttributeError") and bool(linear)
    holds = cannot and variant.status in ("error", "zero_input", "differs") and _aware_bitwise(m)
    deciding = {"control_rebuild": error or "no error", "attention_only_resume": variant.status,
                "attention_only_vs_original": variant.value, "noise_threshold": m.floor.threshold,
                "family_rebuild_bitwise": _aware_bitwise(m)}
    why = (f"control's rebuild: {error or 'no error'} at the rebuild (layers without K/V: {linear}); the attention-only "
           f"rebuild resumes without the linear state: {variant.status} ({variant.detail or variant.value}); "
           f"family-aware rebuild bitwise: {_aware_bitwise(m)}")
    evidence = {**deciding, "linear_layers": linear, "layer_classes": m.extra["layer_classes"],
                "attention_only_first_call": variant.first_call, **m.floor.evidence(variant.value)}
    return Decision(holds, why, evidence, deciding, {"control": "sliding/hybrid caches are on its regression list, not run"})


def decide_padded(m: Measured) -> Decision:
    """Suffix-only and all-ones masks error or differ per row; the full padded mask matches within the floor."""
    p = m.extra["padded"]
    broken = {k: (not p[k]["ok"]) or p[k]["differs"] for k in ("suffix_only", "all_ones")}
    holds = all(broken.values()) and p["padded"]["ok"] and p["padded"]["matches"]
    deciding = {f"{k}_row_max_abs_diff": (p[k]["row_max_abs_diff"] if p[k]["ok"] else "error") for k in p}
    deciding["noise_threshold"] = m.floor.threshold
    why = "; ".join(f"{k} mask {p[k]['mask_shape']}: " + (f"per-row max |diff| {p[k]['row_max_abs_diff']}" if p[k]["ok"]
                                                       else f"error {p[k]['error'][:80]}, first call {p[k]['first_call'].get('input_ids_shape')}")
                    for k in p)
    evidence = {"masks": p, "row_lengths": [int(r.numel()) for r in m.family.rows], **m.floor.evidence()}
    return Decision(holds, why, evidence, deciding, {"transformers #40833": "left-padded cached batches attended to padding "
                                                                            "because the cache mask was incomplete"})


def _mask_contract(m: Measured) -> tuple[bool, dict[str, Any]]:
    shapes = {v: m.cells[v].first_call.get("input_ids_shape") for v in ("neither", "position_only", "mask_only")}
    dropped = all(m.cells[v].status == "zero_input" for v in ("neither", "position_only"))
    kept = bool(shapes["mask_only"]) and shapes["mask_only"][-1] == 1 and m.cells["mask_only"].status in MATCHING
    return dropped and kept, shapes


def decide_mask_contract(measured: dict[str, Measured]) -> Decision:
    """Per family: neither/position_only -> the first call gets zero input tokens; mask_only gets the suffix and matches."""
    per = {name: _mask_contract(m) for name, m in measured.items()}
    holds = bool(per) and all(ok for ok, _ in per.values())
    not_holding = [name for name, (ok, _) in per.items() if not ok]
    deciding = {name: f"neither {s['neither']} / position_only {s['position_only']} / mask_only {s['mask_only']}"
                for name, (_, s) in per.items()}
    why = ("in every family the first model call got zero input tokens without the full mask and the suffix with it"
           if holds else f"does not hold in: {not_holding}")
    return Decision(holds, why, {"first_call_input_ids_shape": {n: s for n, (_, s) in per.items()}, "not_holding": not_holding},
                    deciding, {"control": "without the full mask the first model call got input_ids [1, 0] (Qwen3-VL-2B, 5.14.1)"})


def decide_flash(measured: dict[str, Measured]) -> tuple[Decision | None, str]:
    """FlashAttention-2 vs sdpa per family; (None, reason) where it could not run."""
    cells = {name: m.cells["flash_attention_2"] for name, m in measured.items()}
    if all(c.status == "skipped" for c in cells.values()):
        return None, next(iter(cells.values())).detail if cells else "no family ran"
    holds = all(c.status in MATCHING for c in cells.values())
    deciding = {name: _value(c) for name, c in cells.items()}
    return Decision(holds, f"generate(full mask) flash_attention_2 vs sdpa per family: {deciding}",
                    {name: c.row() for name, c in cells.items()}, deciding,
                    {"control": "eager, SDPA and FlashAttention where applicable (regression list)"}), ""
