"""The resume-contract control's decision tree as code: control 0 and the repairs in, a leaf and its path out.

The data (`Controls`, `ResumeState`, `Repair`) live in `helpers.triage.facts`, the walk in
`helpers.triage.walk`; this module re-exports both, says what each leaf means and what to do next (`MEANING`,
`NEXT`), renders the tree with the taken path and the repairs tried (for pasting into a bug thread), and holds the
`decide_*` functions of the notebook's claims.
"Matches"/"differs" always means against the `NoiseFloor` measured in the same run and dtype
(`helpers.compare.noise_floor`).
"""
from __future__ import annotations

from typing import Any

from ..compare import NoiseFloor
from .facts import (ArgSet, Controls, LayerState, Repair, ResumeState, SlotLayer, consistent,  # noqa: F401 - re-exported
                    identical, metadata_differs, model_state_differs, slot_kind, slot_layers, slot_verdict)
from .walk import NODES, QUESTIONS, REPAIR_LEAF, choose_branch  # noqa: F401 - re-exported

# What each leaf of the tree means.
MEANING = {
    "no_defect": "the rebuild has no defect: it behaves like the original under every argument set",
    "resume_contract": "the mask/input contract of resuming generate() (notebook 02), not the rebuild",
    "model_side_state": "state outside the K/V tensors (Qwen3-VL's multimodal positions: notebook 03)",
    "cache_metadata": "config/cache-layer metadata: the K/V are stored, but the layers do not report them "
                      "(layer classes, is_initialized, reported lengths)",
    "prefix_short": "the cache is an exact prefix of the original, N slots short (a crop, not a compression): the "
                    "missing tokens were never re-fed",
    "extra_slots": "the cache holds every original slot, then slots no original slot holds (another request's, e.g. a "
                   "prompt cache reused without copy.deepcopy)",
    "compression_positions": "logical positions after compression: generate() continues at the retained length",
    "compression_positions_and_loss": "two defects: generate() continues at the retained length, and the compression "
                                      "itself loses information",
    "compression_information_loss": "information removed by the compression itself (generate() already continues at the "
                                    "processed length)",
    "compression_unresolved": "the rebuild stores fewer slots than processed tokens, and continuing at the processed "
                              "length raised: no single mask fits its per-layer lengths",
    "reconstruction_copy": "the reconstruction/copy path changed the K/V values",
    "unexplained": "a hidden state or a generation branch that tells the objects apart",
}
LEAVES = tuple(MEANING)  # every leaf the walk can name, in the tree's order

# One line per leaf: what the reporter does next (the repair the kit ran and measured, where there is one; its
# measured number is printed under the tree).
NEXT = {
    "no_defect": "nothing to change in the rebuild; resume generate() with the full attention mask (cached prefix + "
                 "suffix), as for the original",
    "resume_contract": "pass generate() the full attention mask (cached prefix + suffix, padding included): the kit did, "
                       "and it restores the full forward",
    "model_side_state": "carry the model-side state with the cache (Qwen3-VL: save rope_deltas after the prefill and set "
                        "it on the instance that resumes, notebook 03): the kit did, and it restores the full forward",
    "cache_metadata": "register the K/V through transformers' own path (update() on DynamicCache(config=model.config."
                      "get_text_config())) instead of assigning layer.keys/.values: the kit did, and it restores the full "
                      "forward",
    "prefix_short": "pass generate() the whole ids (cached prefix + the missing tokens + suffix) with their full mask, so "
                    "it re-feeds what the cache lacks: the kit did, and it restores the full forward",
    "extra_slots": "crop the cache to the processed length (cache.crop(n)), or copy.deepcopy the prompt cache before "
                   "each reuse: the kit cropped it, and it restores the full forward",
    "compression_positions": "continue at the processed length: return a resume state {'past_key_values': cache, "
                             "'processed_length': n} from the rebuild, or pass position_ids = processed length "
                             "(+ rope_deltas for Qwen3-VL) with a mask sized to the stored slots: the kit did, and it "
                             "restores the full forward",
    "compression_positions_and_loss": "first continue at the processed length (return {'past_key_values': cache, "
                                      "'processed_length': n}, or pass position_ids = processed length + rope_deltas "
                                      "with a mask sized to the stored slots): the kit did, and it removes the position "
                                      "defect; what remains is the compression's own loss: change what is kept",
    "compression_information_loss": "positions are already right (continuing at the processed length changes nothing); "
                                    "what remains is the compression's own loss, shown against the identity rebuild's: "
                                    "change what is kept",
    "compression_unresolved": "give every attention layer the same number of stored slots (or one mask per layer): no "
                              "single mask fits different per-layer lengths under eager attention or a multi-token "
                              "suffix; the stage that raised is shown; then run the tree again",
    "reconstruction_copy": "no generic repair: fix the copy/convert path at the first differing layer and slot shown "
                           "(keys or values; for keys, a rotation only means RoPE applied at other positions)",
    "unexplained": "report it with this tree: no cell of control 0 differs in a way a repair fixes, so a hidden state or "
                   "a generate() branch tells the two objects apart",
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_fmt(v) for v in value[:8]) + ", ...]"
    return str(value)


def _first_line(rebuild: str, verdict: dict[str, Any]) -> str:
    branch = verdict["branch"]
    if branch == "no_defect":
        worst = verdict["path"][0]["numbers"].get("worst_max_abs_diff") if verdict["path"] else None
        return (f"rebuild {rebuild!r}: no defect -- it behaves like the original under every argument set "
                f"(worst max |diff| {_fmt(worst)})")
    return f"rebuild {rebuild!r}  ->  {branch}: {MEANING[branch]}"


def repair_lines(verdict: dict[str, Any], threshold: float | None) -> list[str]:
    """One line per repair tried: its max |logit diff| against the full forward, and whether that restores."""
    if not verdict.get("repairs"):
        return ["repairs tried: none applied"]
    out = [f"repairs tried (max |logit diff| vs the full forward; restores = within the noise threshold {_fmt(threshold)}):"]
    for r in verdict["repairs"]:
        said = "restores" if r["restores"] else "does not restore"
        out.append(f"  - {r['name']}: " + (f"raised {r['error']}" if r.get("error") else f"{_fmt(r['max_abs_diff'])} -> {said}"))
    return out


def note_lines(verdict: dict[str, Any]) -> list[str]:
    """The notes under a leaf: the resume contract beside a correct rebuild, what remains, where the copy differs."""
    out, n = [], verdict.get("notes", {})
    if verdict.get("note") == "resume_contract":
        step = verdict["path"][-1]["numbers"]
        out.append(f"note (the resume contract, not the rebuild): {step.get('fail_for_both')} fail for both caches; "
                   f"the full mask works for both: {NEXT['resume_contract']}")
    restoring = verdict["path"][-1]["numbers"].get("restoring_repairs_without_a_table_cell") if verdict["path"] else None
    if restoring:
        out.append(f"note: {restoring} restore(s) the full forward although no cell of control 0 points at it: the table "
                   "misses a state; report both")
    if n.get("remaining"):
        r = n["remaining"]
        out.append(f"what remains after continuing at the processed length: {_fmt(r['after_continue_at_processed_length'])}, "
                   f"against the identity rebuild's {_fmt(r['identity_vs_full_forward'])} (noise threshold "
                   f"{_fmt(r['noise_threshold'])}; {_fmt(r['times_identity'])} times the identity's): no repair removes it")
    if n.get("slots"):
        out.append(f"slots by content: layers {n['slots']['layers']} differ from the original's; layer "
                   f"{n['slots']['layers'][0]}: {n['slots']['first']}")
    if n.get("localized"):
        loc = n["localized"]
        keys = (f"; the keys differ by {loc['keys_differ_by']} (per rotary pair: norm gap {_fmt(loc['pair_norm_max_gap'])} "
                f"vs tolerance {_fmt(loc['pair_norm_tolerance'])}, angle gap {_fmt(loc['pair_angle_max_gap'])} rad)"
                if "keys_differ_by" in loc else "")
        out.append(f"localized: first difference at layer {loc['layer']}, slot {loc['slot']}, in the {loc['differs_in']} "
                   f"(max |diff| keys {_fmt(loc['keys_max_abs_diff'])}, values {_fmt(loc['values_max_abs_diff'])}){keys}")
    if n.get("topk"):
        t = n["topk"]
        out.append(f"top-k against the full forward: " + (f"raised {t.get('error')}" if t.get("ran") is False else
                   f"top-1 {'kept' if t['top1_kept'] else 'changed'}, top-5 {'kept' if t['top5_kept'] else 'changed'} "
                   f"({t['top5_overlap']}/5 shared); max |diff| {_fmt(t['max_abs_diff'])} = {_fmt(t['times_threshold'])} "
                   f"times the noise threshold {_fmt(t['noise_threshold'])}"))
    if n.get("per_layer"):
        p = n["per_layer"]
        out.append(f"per-layer lengths {p['stored_slots']}: {p['why']}; {p['this_run']}")
    return out


def render(rebuild: str, verdict: dict[str, Any]) -> str:
    """The tree as text, the taken path marked [x] (checked and no: [ ]), each decision with its numbers; the
    repairs tried under it with their numbers; the leaf's notes."""
    taken = {d["node"]: d for d in verdict["path"]}
    last = verdict["path"][-1] if verdict["path"] else {"numbers": {}}
    threshold = next((d["numbers"]["noise_threshold"] for d in verdict["path"] if "noise_threshold" in d["numbers"]), None)
    lines = [_first_line(rebuild, verdict),
             f"decided by: {'; '.join(f'{k}={_fmt(v)}' for k, v in last['numbers'].items()) or 'the first decision'}",
             f"next: {NEXT[verdict['branch']]}",
             "1. compare original and rebuilt caches under identical arguments"]
    for node, depth, question, leaf in NODES:
        d = taken.get(node)
        mark = "[x]" if d and d["answer"] else "[ ]" if d else "   "
        indent = "    " * depth
        lines.append(f"{indent}+-- {mark} {question}" + (f"  -> {leaf}" if leaf else ""))
        if d and d["numbers"]:
            lines.append(f"{indent}|       " + "; ".join(f"{k}={_fmt(v)}" for k, v in d["numbers"].items()))
    return "\n".join(lines + repair_lines(verdict, threshold) + note_lines(verdict))


# --- the notebook's claims on the built-ins ------------------------------------------------------

def decide_retained_length(c: Controls, generate_position: int | None, logical_position: int | None,
                           explicit_vs_generate: float | None) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """generate() gave the next token the retained length as its position, and the explicit-logical step differs."""
    retained = next((n for n in c.rebuilt_lengths if n is not None), None)  # the first attention layer's (what generate reads)
    shift = None if generate_position is None or logical_position is None else generate_position - logical_position
    expected_shift = None if retained is None else retained - c.processed_length
    holds = (shift is not None and retained != c.processed_length and shift == expected_shift
             and explicit_vs_generate is not None and c.floor.differs(explicit_vs_generate))
    deciding = {"generate_position": generate_position, "logical_position": logical_position,
                "retained_length": retained, "processed_length": c.processed_length,
                "explicit_vs_generate_max_abs_diff": explicit_vs_generate, "noise_threshold": c.floor.threshold}
    evidence = {**deciding, "position_shift": shift, "expected_shift_if_retained_length": expected_shift,
                **c.floor.evidence(explicit_vs_generate)}
    return holds, evidence, deciding


def per_layer_outcome(c: Controls, full: ArgSet) -> str:
    """'error', 'silent_difference' or 'no_difference' of generate() (full mask) from the per-layer cache."""
    if not full.rebuilt_ok:
        return "error"
    return "silent_difference" if c.floor.differs(full.max_abs_diff) else "no_difference"  # None: never differs


def decide_per_layer(c: Controls, full: ArgSet, mechanism: dict[str, Any]) -> tuple[bool, str, dict[str, Any], dict[str, Any]]:
    """holds, why, evidence, deciding: per-layer lengths reach generate() and it errors or silently differs."""
    distinct = len({n for n in c.rebuilt_lengths if n is not None}) > 1
    outcome = per_layer_outcome(c, full)
    holds = distinct and outcome in ("error", "silent_difference")
    stage = mechanism.get("stage") or "no error: every layer ran"
    mask = mechanism.get("attention_mask_shape")
    reached = (f"the first call got past length {mechanism.get('past_length_reported')} (layer 0's), position "
               f"{mechanism.get('generate_position')}, mask {mask if mask else 'none (generate passed no mask)'}; "
               f"attention masks per layer {mechanism.get('attention_masks')}")
    why = (f"generate() from per-layer lengths {c.rebuilt_lengths}: {outcome.replace('_', ' ')}"
           + (f" at {stage} (layer {mechanism.get('error_layer')}): {full.rebuilt_error}: {mechanism.get('error', '')}; {reached}" if outcome == "error" else
              f" (max |diff| vs original {_fmt(full.max_abs_diff)}, noise threshold {_fmt(c.floor.threshold)}); {reached}"))
    deciding = {"outcome": outcome, "rebuilt_lengths": c.rebuilt_lengths, "max_abs_diff_vs_original": full.max_abs_diff,
                "noise_threshold": c.floor.threshold}
    evidence = {**deciding, "stage": stage, **mechanism, **c.floor.evidence(full.max_abs_diff)}
    return holds, why, evidence, deciding


# Stated before the run (transformers #35168: layer-dependent lengths behave differently by backend):
PER_LAYER_PREDICTION = {"sdpa": "silent_difference", "eager": "error"}


def backend_outcome(o: dict[str, Any], floor: NoiseFloor) -> str:
    """'error' (raised inside attention), 'error_elsewhere', 'silent_difference' or 'no_difference' for one backend."""
    if not o["ok"]:
        return "error" if "attention" in (o.get("stage") or "") else "error_elsewhere"
    return "silent_difference" if floor.differs(o.get("max_abs_diff_vs_original")) else "no_difference"


def decide_per_layer_backends(outcomes: dict[str, dict[str, Any]], floor: NoiseFloor,
                              prediction: dict[str, str] = PER_LAYER_PREDICTION) -> tuple[bool, str, dict[str, Any], dict[str, Any]]:
    """holds, why, evidence, deciding: each backend's outcome is the one predicted before the run."""
    seen = {b: backend_outcome(o, floor) for b, o in outcomes.items()}
    holds = bool(seen) and all(seen.get(b) == want for b, want in prediction.items())
    why = "; ".join(f"{b}: predicted {prediction.get(b, '-')}, measured {seen[b]}"
                    + (f" ({outcomes[b]['error_type']} at {outcomes[b]['stage']})" if not outcomes[b]["ok"]
                       else f" (max |diff| {_fmt(outcomes[b]['max_abs_diff_vs_original'])})") for b in seen)
    deciding = {f"{b}_outcome": v for b, v in seen.items()} | {"noise_threshold": floor.threshold}
    return holds, why, {"prediction": prediction, "outcomes": outcomes, **deciding}, deciding
