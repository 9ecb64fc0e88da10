"""Run the tree's controls for one rebuild on a loaded model and turn them into `triage.Controls`.

`prepare()` measures what every rebuild is compared with, once: the full-forward reference, the
prefix cache, the original cache under the seed's four argument sets, the explicit-position step and
the noise floor. `run()` applies one rebuild (to a deep copy; the model-side state is put back
first) and runs controls 1-4 on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvresume import compat
from . import patterns, rebuilds, repairs, slots, state
from ..compare import NoiseFloor, noise_floor
from ..continuation import attention_kernel, prefill
from ..inputs import Prompt
from kvresume import layers
from .facts import ArgSet, Controls, slot_verdict
from .walk import choose_branch
from .controls import (ARG_SETS, FULL, Step, arg_set_steps, diff, explicit_step, full_kwargs, generate_step,
                       logical_positions)


@dataclass
class Baseline:
    """What every rebuild is compared with, measured once on the same instance."""

    model: torch.nn.Module
    prompt: patterns.Resume
    reference: torch.Tensor  # last-position logits of one forward over the whole prompt
    prefix_cache: Any  # prompt[:-1]
    saved_state: torch.Tensor | None  # model-side position state after the prefix prefill (None: model keeps none)
    positions: torch.Tensor  # explicit positions of prompt[-1]
    original: dict[str, Step]
    original_explicit: Step
    floor: NoiseFloor
    fresh: torch.nn.Module | None = None
    generate_kwargs: dict[str, Any] = field(default_factory=dict)  # the reporter's, passed to every generate()
    case: Any = None  # the pattern's patterns.Case


@dataclass
class Triaged:
    """One rebuild's controls, their tables, and the verdict."""

    name: str
    rebuilt: rebuilds.Rebuilt
    controls: Controls
    steps: dict[str, Step]
    fresh: dict[str, Step] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)


def prepare(bundle: Any, case: Prompt | patterns.Case, generate_kwargs: dict[str, Any] | None = None) -> Baseline:
    """Reference, prefix cache, original-cache steps and the noise floor (same run, same dtype).

    `case`: a pattern's resume and prefix cache (`patterns.build`); a plain prompt is the one_token pattern on a
    dynamic cache. `generate_kwargs`: passed to every generate() the controls make."""
    model, extra = bundle.model, dict(generate_kwargs or {})
    if not isinstance(case, patterns.Case):
        case = patterns.build(bundle, case, "one_token", "dynamic", extra)
    prompt, prefix = case.resume, case.prefix_cache
    saved = compat.get_rope_state(model)  # as the prefix prefill (or the first generate) left it
    saved = None if saved is None else saved.clone()
    reference, _ = prefill(model, prompt, end=None)
    compat.put_rope_state(model, saved)
    positions = logical_positions(model, prompt, prompt.processed)
    original = arg_set_steps(model, prompt, prefix, positions, extra)
    explicit = explicit_step(model, prompt, prefix, positions)
    agreeing = [s.logits for s in (original[FULL], explicit) if s.ok]
    floor = noise_floor(reference, agreeing, bundle.dtype,
                        what="full forward vs original cache: generate(full mask) and explicit-position forward")
    fresh = bundle.fresh_instance() if saved is not None else None
    return Baseline(model, prompt, reference, prefix, saved, positions, original, explicit, floor, fresh, extra, case)


def rope_offset(base: Baseline) -> int | None:
    """Qwen3-VL's rope_deltas after the prefix prefill (the offset inside its M-RoPE positions); None: no such state."""
    state = base.saved_state
    return None if state is None or not base.prompt.is_multimodal else int(state.reshape(-1)[0])


def _fresh_steps(base: Baseline, cache: Any) -> dict[str, Step]:
    """Control 4: the rebuilt cache on a fresh instance, without and with the saved model-side state."""
    if base.fresh is None:
        return {}
    mask = full_kwargs(base.prompt, cache)
    compat.put_rope_state(base.fresh, None)
    bare = generate_step(base.fresh, base.prompt, cache, base.generate_kwargs, **mask)
    compat.put_rope_state(base.fresh, base.saved_state)
    restored = generate_step(base.fresh, base.prompt, cache, base.generate_kwargs, **mask)
    compat.put_rope_state(base.fresh, None)
    return {"fresh instance, no state": bare, "fresh instance, state restored": restored}


def arg_sets(base: Baseline, steps: dict[str, Step]) -> list[ArgSet]:
    """Original vs rebuilt per argument set, as plain numbers."""
    return [ArgSet(n, base.original[n].ok, steps[n].ok, base.original[n].error_type, steps[n].error_type,
                   diff(base.original[n], steps[n])) for n in ARG_SETS]


@dataclass
class Applied:
    """A rebuild already applied to the prefix cache, and the model-side state it left behind."""

    name: str
    rebuilt: rebuilds.Rebuilt
    state_after: torch.Tensor | None
    state_changed: bool


def apply_all(base: Baseline, specs: dict[str, rebuilds.RebuildFn]) -> dict[str, Applied]:
    """Apply every rebuild before any control runs (a raise is one RebuildError line); the state is put back after each."""
    out = {}
    for name, fn in specs.items():
        compat.put_rope_state(base.model, base.saved_state)
        rebuilt = rebuilds.apply(fn, name, base.prefix_cache, base.model, base.prompt)
        after = compat.get_rope_state(base.model) if base.saved_state is not None else None
        changed = base.saved_state is not None and (after is None or not torch.equal(after, base.saved_state))
        out[name] = Applied(name, rebuilt, None if after is None else after.clone(), bool(changed))
        compat.put_rope_state(base.model, base.saved_state)
    return out


def run(base: Baseline, applied: Applied, identity: Triaged | None = None, resume_on: str = "same_instance") -> Triaged:
    """Controls 1-4 on one applied rebuild; the verdict is `triage.choose_branch` of the result."""
    model, prompt, name, rebuilt = base.model, base.prompt, applied.name, applied.rebuilt
    compat.put_rope_state(model, applied.state_after)  # the instance as the rebuild left it
    steps = arg_set_steps(model, prompt, rebuilt.cache, base.positions, base.generate_kwargs)
    compat.put_rope_state(model, base.saved_state)
    processed = prompt.processed
    logical = rebuilt.processed_length if rebuilt.processed_length is not None else processed
    explicit = explicit_step(model, prompt, rebuilt.cache, logical_positions(model, prompt, logical))
    resumed = resume_step(base, rebuilt, steps, logical)
    fresh = _fresh_steps(base, rebuilt.cache)
    compat.put_rope_state(model, base.saved_state)
    matched = slots.compare(base.prefix_cache, rebuilt.cache)
    kind = slot_verdict(matched)
    fixes = repairs.run_all(base, rebuilt.cache, {"full": steps[FULL], "resumed": resumed}, applied.state_after, fresh,
                            resume_on, kind)
    extra = {"generate_args": RESUME_ARGS if rebuilt.resume else FULL,
             "generate_position": resumed.call.get("rotary_position"),
             "logical_position": explicit.call.get("rotary_position"),
             "explicit_vs_generate": diff(explicit, resumed),
             "explicit_vs_full_forward": diff(explicit, Step(True, base.reference))}
    controls = Controls(
        rebuild=name, floor=base.floor, arg_sets=arg_sets(base, steps), processed_length=processed,
        rebuilt_lengths=layers.lengths(rebuilt.cache), slots=matched,
        state_changed=applied.state_changed,
        fresh_bare_diff=diff(fresh.get("fresh instance, no state"), steps[FULL]) if fresh else None,
        resume_on=resume_on, extra=extra, repairs=fixes,
        original_state=state.measure(base.prefix_cache, processed, prompt.length - processed, base.original[FULL].call,
                                     base.original_explicit.call, slots=slots.described(base.prefix_cache, base.prefix_cache),
                                     model_state=base.saved_state),
        rebuilt_state=state.measure(rebuilt.cache, processed, prompt.length - processed, resumed.call, explicit.call,
                                    rebuilt.processed_length if rebuilt.resume else None,
                                    [slots.describe(i, s) for i, s in enumerate(matched)], applied.state_after),
        localized=repairs.localize(base.prefix_cache, rebuilt.cache),
        topk=repairs.topk_kept(base.reference, steps[FULL], base.floor))
    controls.identity_remaining = (identity.controls if identity is not None else controls).extra["explicit_vs_full_forward"]
    out = Triaged(name, rebuilt, controls, steps, fresh)
    out.verdict = choose_branch(controls)
    return out


RESUME_ARGS = "mask_only + position_ids at processed_length (the rebuild returned a resume state)"


def resume_step(base: Baseline, rebuilt: rebuilds.Rebuilt, steps: dict[str, Step], logical: int) -> Step:
    """generate() as the kit resumes this rebuild: the full mask alone (a cache), or with positions at the processed
    length (a resume state: {'past_key_values': ..., 'processed_length': n})."""
    if not rebuilt.resume:
        return steps[FULL]
    positions = logical_positions(base.model, base.prompt, logical)
    return generate_step(base.model, base.prompt, rebuilt.cache, base.generate_kwargs, position_ids=positions,
                         **full_kwargs(base.prompt, rebuilt.cache))


def triage_all(base: Baseline, applied: dict[str, Applied], resume_on: str = "same_instance") -> dict[str, Triaged]:
    """The identity control first (control 5), then every other rebuild against it."""
    ident = run(base, applied["identity"], None, resume_on)
    others = {name: run(base, a, ident, resume_on) for name, a in applied.items() if name != "identity"}
    return {"identity": ident, **others}


def load_specs(rebuild: str, sink: int, window: int) -> dict[str, rebuilds.RebuildFn]:
    """The identity control plus the selected rebuild(s), by label; RebuildError (one line) if one cannot be loaded."""
    specs = {"identity": rebuilds.load("identity")}
    for spec in rebuilds.BUILTINS if rebuild == "all" else [rebuild]:
        specs[rebuilds.label(spec)] = rebuilds.load(spec, sink, window)
    return specs


def stop(res: Any, err: Exception) -> None:
    """Record a rebuild that cannot be loaded or raised (every claim: error, with that line) and end the run."""
    res.add("rebuild_error", str(err))
    for claim_id in res.claims:
        res.fail(claim_id, err)
    raise SystemExit(str(err))



def backend_outcomes(base: Baseline, t: Triaged, backends: tuple[str, ...] = ("sdpa", "eager")) -> dict[str, dict[str, Any]]:
    """generate(full mask) from one rebuilt cache under each attention backend, vs the original under the same backend.

    Per backend: ok, error type and stage (the innermost transformers frame), max |diff| vs the original. The
    model's own backend is put back."""
    model, out = base.model, {}
    for backend in backends:
        with attention_kernel(model, backend):
            compat.put_rope_state(model, base.saved_state)
            original = generate_step(model, base.prompt, base.prefix_cache, base.generate_kwargs,
                                     **full_kwargs(base.prompt, base.prefix_cache))
            compat.put_rope_state(model, base.saved_state)
            rebuilt = generate_step(model, base.prompt, t.rebuilt.cache, base.generate_kwargs,
                                    **full_kwargs(base.prompt, t.rebuilt.cache))
        compat.put_rope_state(model, base.saved_state)
        out[backend] = {"ok": rebuilt.ok, "error_type": rebuilt.error_type, "stage": rebuilt.stage, "error": rebuilt.error[:200],
                        "error_layer": rebuilt.call.get("error_layer"), "original_ok": original.ok,
                        "max_abs_diff_vs_original": diff(original, rebuilt)}
    return out
