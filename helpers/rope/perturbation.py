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

from ..compare import logit_metrics
from ..continuation import Outcome, as_list, generate_first_step
from ..inputs import Prompt


METRICS = ("max_abs_diff", "cosine", "top1", "top1_equal", "top5_overlap", "bitwise_equal")


def has_state(model: torch.nn.Module) -> bool:
    """Whether this model keeps a model-side multimodal position state at all."""
    return compat.rope_state_owner(model) is not None


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
