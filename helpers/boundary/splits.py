"""Finding 4: the token boundary. cache(prompt[:-1]) + prompt[-1] is a valid split;
cache(prompt) + prompt[-1] processes prompt[-1] twice.

Everything is compared with the last-position logits of one forward pass over the whole prompt.
For the double-processing runs the cache already holds L = len(prompt) tokens, so

* "full mask" means L + 1 ones: the L cached tokens plus the re-fed one (what the cache contract asks);
* "explicit positions" means the position prompt[-1] had in that full forward pass (L - 1, with
  the M-RoPE offset on Qwen3-VL): the most favourable choice, since the position generate() infers
  from the mask is L, one past it. Even so the re-fed token also attends to its own cached copy.

The source's forum snippet calls `generate(input_ids=last_token, past_key_values=cache)` with no mask;
as notebook 02 shows, that drops the suffix before the first model call, so the source's diverging
numbers must come from a call that ran: here both generate() with the full mask (± positions) and a
direct forward() (± mask and positions) are shown.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from kvresume import compat

from .. import caches
from ..compare import last_logits, logit_metrics
from ..continuation import Outcome, current_position_ids, forward_step, generate_first_step, prefill
from ..inputs import Prompt


SOURCE_COSINE = 0.8698  # "cosine similarity: 0.8698"
# A statement a tiny random-weight model decides by chance (the re-feed's top-1 change, its cosine) is measured over
# this many prompts and reported as a rate; only the real checkpoint decides it.
RATE_PROMPTS = 40
BY_CHANCE = ("boundary.double_processing_top1_changed", "boundary.double_processing_cosine")


@dataclass
class Run:
    """One continuation: which boundary, which cache, which call and arguments, and what it gave."""

    boundary: str
    cache: str
    call: str
    args: str
    outcome: Outcome


def _double_calls(model: torch.nn.Module, prompt: Prompt, cache: Any, positions: torch.Tensor) -> dict[tuple[str, str], Outcome]:
    mask = F.pad(prompt.attention_mask, (0, 1), value=1)  # L cached + 1 re-fed
    token = prompt.last_token
    return {
        ("generate", "no mask"): generate_first_step(model, token, copy.deepcopy(cache)),
        ("generate", "full mask (L+1)"): generate_first_step(model, token, copy.deepcopy(cache), attention_mask=mask),
        ("generate", "full mask (L+1) + positions (L-1)"): generate_first_step(model, token, copy.deepcopy(cache),
                                                                               attention_mask=mask, position_ids=positions),
        ("forward", "no mask"): forward_step(model, token, copy.deepcopy(cache)),
        ("forward", "full mask (L+1) + positions (L-1)"): forward_step(model, token, copy.deepcopy(cache),
                                                                       attention_mask=mask, position_ids=positions),
    }


def run_all(model: torch.nn.Module, prompt: Prompt) -> tuple[torch.Tensor, list[Run], dict[str, Any]]:
    """Reference logits, every boundary run, and facts about the caches and the position state."""
    reference, full_cache = prefill(model, prompt, end=None)
    state_full = compat.get_rope_state(model)
    _, prefix_cache = prefill(model, prompt)
    state_prefix = compat.get_rope_state(model)
    positions = current_position_ids(model, prompt)  # position of prompt[-1] in the full forward pass
    runs = [Run("valid split", "original", "generate", "full mask (L)",
                generate_first_step(model, prompt.last_token, copy.deepcopy(prefix_cache), attention_mask=prompt.attention_mask))]
    rebuilt = compat.cache_from_pairs(compat.kv_pairs(full_cache), compat.text_config(model.config))
    for name, cache in (("original", full_cache), ("rebuilt_update", rebuilt)):
        for (call, args), out in _double_calls(model, prompt, cache, positions).items():
            runs.append(Run("double processing", name, call, args, out))
    info = {"prompt_length": prompt.length, "prefix_cache_length": int(prefix_cache.get_seq_length()),
            "full_cache_length": int(full_cache.get_seq_length()),
            "rebuilt_kv_bitwise_equal": caches.kv_bitwise_equal(rebuilt, full_cache),
            "rebuilt_shares_storage": caches.shares_storage(rebuilt, full_cache),
            "explicit_positions": positions.flatten().tolist(),
            "rope_state_after_full_prefill": None if state_full is None else state_full.flatten().tolist(),
            "rope_state_after_prefix_prefill": None if state_prefix is None else state_prefix.flatten().tolist()}
    return reference, runs, info


def table(reference: torch.Tensor, runs: list[Run]) -> pd.DataFrame:
    """One row per run: boundary, cache, call, args, worked/failed and the metrics against the full forward."""
    rows = []
    for r in runs:
        row: dict[str, Any] = {"boundary": r.boundary, "cache": r.cache, "call": r.call, "args": r.args,
                               "result": "worked" if r.outcome.ok else "failed", "error_type": r.outcome.error_type or "",
                               "input_ids_shape": r.outcome.first_call.get("input_ids_shape")}
        if r.outcome.ok:
            m = logit_metrics(reference, r.outcome.logits)
            row.update({k: m[k] for k in ("max_abs_diff", "cosine", "top1_reference", "top1", "top1_equal", "top5_overlap")})
            row["top1_margin_reference"] = top1_margin(reference)
        rows.append(row)
    return pd.DataFrame(rows)


def refeed_rate(model: torch.nn.Module, prompts: list[Prompt]) -> dict[str, Any]:
    """The plain re-feed (generate() with the L+1 mask, original cache) on each prompt: how often its top-1 differs
    from the full forward's, and the spread of its cosine."""
    changed, cosines = 0, []
    for prompt in prompts:
        reference, cache = prefill(model, prompt, end=None)
        mask = F.pad(prompt.attention_mask, (0, 1), value=1)
        out = generate_first_step(model, prompt.last_token, cache, attention_mask=mask)
        if not out.ok:
            continue
        m = logit_metrics(reference, out.logits)
        changed += not m["top1_equal"]
        cosines.append(float(m["cosine"]))
    n = len(cosines)
    return {"prompts": len(prompts), "ran": n, "top1_changed": changed, "top1_changed_rate": changed / n if n else None,
            "cosine_min": min(cosines, default=None), "cosine_median": sorted(cosines)[n // 2] if n else None,
            "cosine_max": max(cosines, default=None)}


def by_chance(claim_id: str, rate: dict[str, Any]) -> str:
    """Why a tiny random-weight model leaves the claim undecided, with the rate it measured over the prompts."""
    n = rate.get("ran") or 0
    if claim_id == "boundary.double_processing_top1_changed":
        got = f"top-1 changed on {rate.get('top1_changed')} of {n} prompts ({100 * (rate.get('top1_changed_rate') or 0):.0f}%)"
    else:
        got = (f"cosine {rate.get('cosine_min'):.3f}-{rate.get('cosine_max'):.3f} (median {rate.get('cosine_median'):.3f}) "
               f"over {n} prompts against the source's {SOURCE_COSINE}") if n else "no re-feed ran"
    return (f"{got}: a tiny random-weight model decides it by chance, the real 2B checkpoint decides it. Online: "
            "`-p model_id Qwen/Qwen3-VL-2B-Instruct`.")


def top1_margin(reference: torch.Tensor) -> float:
    """How far the reference's top-1 logit is above its top-2 (last position): the shift a top-1 change needs."""
    top2 = last_logits(reference).reshape(-1, reference.shape[-1]).topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


SHORT_ARGS = {"no mask": "", "full mask (L+1)": " +mask", "full mask (L+1) + positions (L-1)": " +mask+pos"}


def label(row: Any) -> str:
    """A short plot label for one table row, e.g. 'rebuilt: generate +mask+pos'."""
    if row.boundary == "valid split":
        return "valid split"
    cache = "orig" if row.cache == "original" else "rebuilt"
    return f"{cache}: {row.call}{SHORT_ARGS.get(row.args, ' ' + row.args)}"


def rebuilt_vs_original(runs: list[Run]) -> pd.DataFrame:
    """Per double-processing call: did the rebuilt cache do exactly what the original did (status and bits)?"""
    by_key = {(r.cache, r.call, r.args): r.outcome for r in runs if r.boundary == "double processing"}
    rows = []
    for (cache, call, args), orig in by_key.items():
        if cache != "original":
            continue
        other = by_key[("rebuilt_update", call, args)]
        same_status = orig.ok == other.ok and orig.error_type == other.error_type
        bitwise = bool(orig.ok and other.ok and torch.equal(orig.logits, other.logits))
        rows.append({"call": call, "args": args, "original": "worked" if orig.ok else "failed",
                     "rebuilt_update": "worked" if other.ok else "failed", "same_status": same_status,
                     "logits_bitwise_equal": bitwise if orig.ok and other.ok else None})
    return pd.DataFrame(rows)
