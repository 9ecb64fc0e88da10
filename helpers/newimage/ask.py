"""A new image after a cached turn (notebook 09 answers it): its SOURCE and Ask writer, for the report only."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines, claim_of, first_change, joined, num

SOURCE = Source("new-image", "A new image after a cached turn (Qwen3-VL multi-turn resume: `QwenLM/Qwen3-VL#1685`, `QwenLM/Qwen3-VL#1412`)",
                {}, "the threads' own checkpoints, images and code (their text could not be read from this machine, so every "
                "claim is the kit's own, kind beyond; the tiny random-weight default stands in; pass `-p model_id ...` online).",
                "examples/repro/qwen3_vl_new_image_turn.py",
                "expected vs got max |logit diff| of the natural turn-2 call against one forward over both turns, turn 2's positions and the repair's",
                "Qwen3-VL new image",
                "the threads' statements (text not readable here)")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """A new image after a cached turn: the natural call's error per release; the positions repair's number."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        nat, pos = claim_of(claims, "newimage.natural_call_silently_wrong"), claim_of(claims, "newimage.positions_explain_it")
        d = nat.get("deciding") or {}
        if nat.get("verdict") == "holds":
            rows = " on one text position row" if (pos.get("verdict") == "holds") else ""
            symptom[rel] = f"runs and is silently wrong (max |logit diff| {num(d.get('max_abs_diff'))}, image B{rows})"
        elif nat:
            symptom[rel] = f"{nat.get('verdict')}: {str(nat.get('reason', ''))[:100]}"
        fix, carry = claim_of(claims, "newimage.repair_generate_restores"), claim_of(claims, "newimage.rope_deltas_carried_forward")
        if fix.get("verdict") == "holds":
            repair[rel] = num((fix.get("deciding") or {}).get("max_abs_diff")) + (
                f", stale `rope_deltas` {num((carry.get('deciding') or {}).get('max_abs_diff_stale'))}"
                if carry.get("verdict") == "holds" else "")
    text = ("the natural turn-2 `generate()` (new image, turn 1's cache, full mask) " + joined(symptom)) if symptom else ""
    ask = ("compute turn 2's positions with `get_rope_index` over the full ids and both grids and carry `rope_deltas` "
           f"forward: the kit's repair restores the one-forward logits to {joined(repair)}; upstream: derive them so in "
           "`generate()`, or raise") if repair else ""
    bisect = first_change(out, "09", "newimage.natural_call_silently_wrong", list(by_release), len(set(symptom.values())) > 1)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))
