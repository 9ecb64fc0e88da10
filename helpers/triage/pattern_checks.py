"""What a resume pattern needs beyond the one-token controls, measured on the original and every rebuilt cache.

`prompt_reuse`: one prefix cache, two suffixes; each continued from a deep copy must match its own full
forward, and the same object continued twice (no deepcopy) shows what the first continuation left in it.
`continue_generate`: the second call as the threads make it (the whole `sequences` the first `generate()`
returned, with their mask, and its cache), beside the kit's suffix-only call. Every row is a measurement
against the full forward of the sequence it continues, judged against the run's noise floor.
"""
from __future__ import annotations

import copy
from typing import Any

import pandas as pd
import torch

from kvresume import compat
from ..continuation import prefill
from .controls import FULL, Step, diff, full_kwargs, generate_step
from .run import Baseline, Triaged


def _caches(base: Baseline, results: dict[str, Triaged]) -> dict[str, tuple[Any, Step]]:
    """The original cache and every rebuilt one, each with its generate() step under the full mask (suffix A)."""
    return {"original": (base.prefix_cache, base.original[FULL]),
            **{name: (t.rebuilt.cache, t.steps[FULL]) for name, t in results.items()}}


def _row(base: Baseline, cache: str, call: str, step: Step, reference: torch.Tensor) -> dict[str, Any]:
    d = diff(step, Step(True, reference))
    return {"cache": cache, "call": call, "result": "worked" if step.ok else f"failed ({step.error_type})",
            "input_ids_shape": step.call.get("input_ids_shape"), "past_length": step.call.get("past_length"),
            "rotary_position": step.call.get("rotary_position"), "vs_own_full_forward": d,
            "matches_own_full_forward": d is not None and base.floor.matches(d), "error": step.error[:120]}


def reuse_rows(base: Baseline, results: dict[str, Triaged]) -> list[dict[str, Any]]:
    """prompt_reuse: suffix A and suffix B from deep copies, then A and B on one object without a copy."""
    second, model, extra = base.case.second, base.model, base.generate_kwargs
    compat.put_rope_state(model, base.saved_state)
    reference_b, _ = prefill(model, second, end=None)
    rows = []
    for name, (cache, first) in _caches(base, results).items():
        compat.put_rope_state(model, base.saved_state)
        b = generate_step(model, second, cache, extra, **full_kwargs(second, cache))
        shared = copy.deepcopy(cache)
        compat.put_rope_state(model, base.saved_state)
        generate_step(model, base.prompt, shared, extra, copy_cache=False, **full_kwargs(base.prompt, shared))
        compat.put_rope_state(model, base.saved_state)
        reused = generate_step(model, second, shared, extra, copy_cache=False, **full_kwargs(second, shared))
        rows += [_row(base, name, "suffix A, deep copy", first, base.reference),
                 _row(base, name, "suffix B, deep copy", b, reference_b),
                 _row(base, name, "suffix B after A on the same object (no deepcopy)", reused, reference_b)]
    compat.put_rope_state(model, base.saved_state)
    return rows


def continue_rows(base: Baseline, results: dict[str, Triaged]) -> list[dict[str, Any]]:
    """continue_generate: generate(sequences, their full mask, the returned cache) vs the kit's suffix-only call."""
    model, prompt, rows = base.model, base.prompt, []
    for name, (cache, first) in _caches(base, results).items():
        compat.put_rope_state(model, base.saved_state)
        threads = generate_step(model, prompt, cache, base.generate_kwargs, input_ids=prompt.input_ids,
                                attention_mask=prompt.attention_mask)
        rows += [_row(base, name, "suffix only + full mask (the kit's working set)", first, base.reference),
                 _row(base, name, "all sequences + their mask (as the threads call it)", threads, base.reference)]
    compat.put_rope_state(model, base.saved_state)
    return rows


CHECKS = {"prompt_reuse": reuse_rows, "continue_generate": continue_rows}


def table(base: Baseline, results: dict[str, Triaged]) -> pd.DataFrame | None:
    """The pattern's own checks (None: the pattern has none beyond the controls)."""
    check = CHECKS.get(base.case.pattern)
    return None if check is None else pd.DataFrame(check(base, results)).set_index(["cache", "call"])


def working_sets(base: Baseline) -> pd.DataFrame:
    """Per argument set, on the original cache: how many suffix tokens were given and how many reached the first call."""
    given = int(base.prompt.last_token.shape[1])
    rows = [{"args": name, "suffix_tokens_given": given, "first_call_input_ids_shape": s.call.get("input_ids_shape"),
             "suffix_reached_model": (s.call.get("input_ids_shape") or [0, 0])[-1] == given,
             "result": "worked" if s.ok else f"failed ({s.error_type})"} for name, s in base.original.items()]
    return pd.DataFrame(rows).set_index("args")
