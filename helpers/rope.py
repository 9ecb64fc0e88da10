"""Finding 3: Qwen3-VL's multimodal position state lives on the model, not in the cache.

Every continuation here uses the same K/V (a deep copy of the prefix cache), the same one-token
suffix and the same full attention mask; only the model-side state (`rope_deltas`, through
`helpers.compat`) changes. Note: when that state is None and the cache is non-empty, Qwen3-VL's
`generate()` falls back to text positions and *writes zeros* into the model, so every helper here
puts the previous value back afterwards.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from kvresume import compat, state as resume
from .compare import Decision, NoiseFloor, logit_metrics
from .continuation import Outcome, generate_first_step
from .inputs import Prompt

METRICS = ("max_abs_diff", "cosine", "top1", "top1_equal", "top5_overlap", "bitwise_equal")


def has_state(model: torch.nn.Module) -> bool:
    """Whether this model keeps a model-side multimodal position state at all."""
    return compat.rope_state_owner(model) is not None


def as_list(value: torch.Tensor | None) -> list | None:
    """The state as a plain list (None stays None)."""
    return None if value is None else value.detach().cpu().flatten().tolist()


def continue_with_state(model: torch.nn.Module, prompt: Prompt, cache: Any, value: torch.Tensor | None) -> Outcome:
    """generate() one step from a copy of `cache` with the full mask, the model-side state set to `value` (the
    previous state is put back afterwards)."""
    before = compat.get_rope_state(model)
    compat.set_rope_state(model, value)
    try:
        return generate_first_step(model, prompt.last_token, copy.deepcopy(cache), attention_mask=prompt.attention_mask)
    finally:
        compat.set_rope_state(model, before)


def state_variants(saved: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """The source's rows: the correct saved state, None, 0, and saved + 1."""
    return {"saved": saved.clone(), "None": None, "0": torch.zeros_like(saved), "saved + 1": saved + 1}


def _row(name: str, value: torch.Tensor | None, out: Outcome, reference: torch.Tensor) -> dict[str, Any]:
    row: dict[str, Any] = {"state": name, "value": as_list(value), "ran": out.ok, "error": out.error or ""}
    if out.ok:
        metrics = logit_metrics(reference, out.logits)
        row.update({k: metrics[k] for k in METRICS})
    return row


def perturbation_table(model: torch.nn.Module, prompt: Prompt, cache: Any, saved: torch.Tensor) -> tuple[pd.DataFrame, torch.Tensor]:
    """One row per state variant against the reference continuation (saved state); returns (table, reference logits)."""
    reference = continue_with_state(model, prompt, cache, saved)
    if not reference.ok:
        raise RuntimeError(f"the reference continuation failed: {reference.error_type}: {reference.error}")
    rows = [_row(name, value, continue_with_state(model, prompt, cache, value), reference.logits)
            for name, value in state_variants(saved).items()]
    return pd.DataFrame(rows).set_index("state"), reference.logits


def offset_sweep(model: torch.nn.Module, prompt: Prompt, cache: Any, saved: torch.Tensor, reference: torch.Tensor,
                 offsets: Sequence[int]) -> pd.DataFrame:
    """Continuations with the state set to saved + offset, for each offset, against the reference."""
    return pd.DataFrame([{"offset": int(offset), **_row(f"saved {offset:+d}", saved + offset, continue_with_state(
        model, prompt, cache, saved + offset), reference)} for offset in offsets])


def cache_mentions_state(cache: Any, saved: torch.Tensor) -> dict[str, Any]:
    """Search the cache object (and its layers) for anything named like, or equal to, the position state."""
    found = []
    objects = [("cache", cache)] + [(f"layers[{i}]", layer) for i, layer in enumerate(compat.cache_layers(cache))]
    for where, obj in objects:
        found += [f"{where}.{name}" for name, value in vars(obj).items() if "rope" in name.lower()
                  or "delta" in name.lower() or isinstance(value, torch.Tensor) and value.shape == saved.shape
                  and torch.equal(value.to(saved.dtype), saved)]
    return {"attributes_checked": sum(len(vars(o)) for _, o in objects), "matches": found}


def instance_branch(fresh: torch.nn.Module, state: resume.ResumeState, prompt: Prompt, cache: Any,
                    reference: torch.Tensor, directory: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A fresh instance continued (a) from the bare cache, (b) after restoring the saved resume state from a file."""
    before = compat.get_rope_state(fresh)
    bare = generate_first_step(fresh, prompt.last_token, copy.deepcopy(cache), attention_mask=prompt.attention_mask)
    after_bare = compat.get_rope_state(fresh)
    loaded = resume.round_trip(state, directory, device=next(fresh.parameters()).device)
    restored_cache = resume.restore(fresh, loaded)
    kwargs = loaded.generate_kwargs()
    restored = generate_first_step(fresh, kwargs.pop("input_ids"), restored_cache, **kwargs)
    rows = [_row("fresh instance, K/V + full mask only", before, bare, reference),
            _row("fresh instance, resume state restored", compat.get_rope_state(fresh), restored, reference)]
    info = {"fresh_state_before": as_list(before), "fresh_state_after_bare_generate": as_list(after_bare),
            "restored_state": as_list(loaded.model_metadata.get(resume.ROPE_KEY)),
            "resume_file": str(Path(directory)), "processed_length": loaded.processed_length,
            "mask_length": int(loaded.attention_mask.shape[1])}
    return pd.DataFrame(rows).set_index("state"), info


def offset_widget(model: torch.nn.Module, prompt: Prompt, cache: Any, saved: torch.Tensor, reference: torch.Tensor,
                  lo: int = -8, hi: int = 8) -> Any:
    """An ipywidgets slider over the offset that re-runs one continuation (None if ipywidgets is missing)."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return None

    def show(offset: int = 0) -> pd.DataFrame:
        return offset_sweep(model, prompt, cache, saved, reference, [offset]).drop(columns="offset").set_index("state")

    return widgets.interactive(show, offset=widgets.IntSlider(value=0, min=lo, max=hi, step=1, description="offset"))


def none_vs_zero(model: torch.nn.Module, prompt: Prompt, cache: Any, saved: torch.Tensor) -> dict[str, Any]:
    """Logit metrics of the state-0 continuation against the state-None one (directly, not via the reference)."""
    none = continue_with_state(model, prompt, cache, None)
    zero = continue_with_state(model, prompt, cache, torch.zeros_like(saved))
    if not (none.ok and zero.ok):
        return {"ran": False, "none_error": none.error, "zero_error": zero.error}
    return {"ran": True, **logit_metrics(none.logits, zero.logits)}


# --- decisions --------------------------------------------------------------------------------------

SOURCE_STATE = {"rope_deltas": [-42]}
SOURCE_NONE = {"max_abs_diff_none": 17.1328, "cosine_none": 0.30597}
SOURCE_PLUS_1 = {"max_abs_diff_plus_1": 1.21875, "cosine_plus_1": 0.99833}
SOURCE_TOP5_OVERLAP_NONE = 0  # "The top-5 overlap with the correct state was also zero."
BY_CONSTRUCTION = ("the value is fixed by construction, not measured agreement: rope_deltas follows from the image grid "
                   "and the prompt layout alone (a 224x224 image -> 7x7 merged patches take 7 positions for 49 tokens: "
                   "7 - 49 = -42), whatever the weights; the finding is that it is non-zero and outside the cache.")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def _ran(row: Any) -> bool:
    return bool(row is not None and row.get("ran") and row.get("max_abs_diff") is not None)


def decide_state_outside_kv(saved: list | None, cache_matches: list[str]) -> Decision:
    """The prefix prefill leaves a non-zero model-side state, and nothing in the cache is named like it or equals it."""
    nonzero = saved is not None and any(v != 0 for v in saved)
    holds = nonzero and not cache_matches
    why = (f"state {saved} on the model; the cache holds nothing like it" if holds else
           f"state {saved} is zero or missing" if not nonzero else f"the cache holds it: {cache_matches}")
    return Decision(holds, why, {"saved_state": saved, "cache_matches": cache_matches},
                    {"rope_deltas": saved}, SOURCE_STATE, [BY_CONSTRUCTION])


def decide_none_equals_zero(none_vs_zero: dict[str, Any], floor: NoiseFloor) -> Decision:
    """State None and state 0 give bitwise the same first-step logits (the source: identical)."""
    ran = bool(none_vs_zero.get("ran"))
    value = none_vs_zero.get("max_abs_diff") if ran else None
    holds = ran and bool(none_vs_zero.get("bitwise_equal"))
    why = ("bitwise identical" if holds else f"did not run: {none_vs_zero}" if not ran else
           f"not identical: max |diff| {value:.3g} ({'within' if floor.matches(value) else 'beyond'} the noise threshold {floor.threshold:.3g})")
    return Decision(holds, why, {"zero_vs_none": none_vs_zero, **floor.evidence(value)},
                    {"max_abs_diff_none_vs_zero": value}, {"max_abs_diff_none_vs_zero": 0.0})


def decide_missing_state_diverges_more(none: dict[str, Any], plus_1: dict[str, Any], floor: NoiseFloor) -> Decision:
    """None moves the logits beyond the noise, and further than saved + 1 by more than the noise (and lower cosine)."""
    both = _ran(none) and _ran(plus_1)
    holds = (both and floor.differs(none["max_abs_diff"]) and none["max_abs_diff"] - plus_1["max_abs_diff"] > floor.threshold
             and none["cosine"] < plus_1["cosine"])
    why = ("one of the two continuations did not run" if not both else
           f"None: max |diff| {none['max_abs_diff']:.4g} (cosine {none['cosine']:.5f}); +1: {plus_1['max_abs_diff']:.4g} "
           f"(cosine {plus_1['cosine']:.5f}); noise threshold {floor.threshold:.3g}")
    deciding = {"max_abs_diff_none": none.get("max_abs_diff"), "cosine_none": none.get("cosine"),
                "max_abs_diff_plus_1": plus_1.get("max_abs_diff"), "cosine_plus_1": plus_1.get("cosine")}
    mine = ratio(none.get("max_abs_diff"), plus_1.get("max_abs_diff"))
    theirs = ratio(SOURCE_NONE["max_abs_diff_none"], SOURCE_PLUS_1["max_abs_diff_plus_1"])
    scale_free = (f"scale-free: None/+1 ratio of max |diff| {mine:.3g} here, {theirs:.3g} in the source; top-5 overlap of "
                  f"None with the saved state {none.get('top5_overlap')}/5 here, {SOURCE_TOP5_OVERLAP_NONE}/5 in the source; "
                  f"top-1 under None {'unchanged' if none.get('top1_equal') else 'changed'} here, changed in the source "
                  "(left -> The).") if mine is not None else "scale-free comparison not available: a run did not complete."
    return Decision(holds, why, {"none": dict(none), "saved_plus_1": dict(plus_1), **floor.evidence(none.get("max_abs_diff")),
                                 "ratio_none_to_plus_1": mine},
                    deciding, {**SOURCE_NONE, **SOURCE_PLUS_1}, [scale_free])


def decide_fresh_instance_diverges(bare: dict[str, Any], floor: NoiseFloor) -> Decision:
    """The fresh instance given only the cache and the full mask differs from the same-instance continuation beyond the noise."""
    value = bare.get("max_abs_diff") if _ran(bare) else None
    holds = _ran(bare) and floor.differs(value)
    why = (f"did not run: {bare.get('error')}" if not _ran(bare) else
           f"max |diff| {value:.4g} {'>' if holds else '<='} margin x floor {floor.threshold:.3g}")
    return Decision(holds, why, {"fresh_no_state": dict(bare), **floor.evidence(value)},
                    {"max_abs_diff_fresh": value, "cosine_fresh": bare.get("cosine")}, {})


def decide_restored_state_matches(restored: dict[str, Any], floor: NoiseFloor) -> Decision:
    """After restoring the saved resume state, the fresh instance matches within the noise, with the same top-1."""
    value = restored.get("max_abs_diff") if _ran(restored) else None
    holds = _ran(restored) and floor.matches(value) and bool(restored.get("top1_equal"))
    why = (f"did not run: {restored.get('error')}" if not _ran(restored) else
           f"max |diff| {value:.4g} {'<=' if floor.matches(value) else '>'} margin x floor {floor.threshold:.3g}, "
           f"top-1 {'equal' if restored.get('top1_equal') else 'changed'}")
    return Decision(holds, why, {"restored": dict(restored), **floor.evidence(value)},
                    {"max_abs_diff_restored": value, "top1_equal": restored.get("top1_equal")}, {})
