"""The table's cells for one family, measured: the control's checks against the noise floor of this run.

Every continuation starts from a deep copy of the prefix cache, with the model-side position state the
prefix prefill left (Qwen3-VL's rope_deltas) put back first; failures are data (`helpers.continuation`). A cell is
an outcome against the measured noise floor, with what reached the first model call.
"""
from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from kvresume import compat
from ..compare import NoiseFloor, max_abs_diff, noise_floor
from ..continuation import (GENERATION_VARIANTS, Outcome, attention_kernel, forward_step, generate_first_step,
                            generation_kwargs)
from kvresume import layers
from .setup import Family, reference
from .rebuilds import attention_only_rebuild, control_rebuild, family_rebuild

CHECKS = ("control_rebuild·generate", "control_rebuild·other_kernel", "control_rebuild·forward", "config_rebuild·generate",
          "config_rebuild·forward",
          "family_rebuild·generate", "family_rebuild·forward", "neither", "position_only", "mask_only", "both",
          "fresh_instance", "eager_vs_sdpa", "flash_attention_2")
REBUILD_STAGE = "at the rebuild, before any model call"
SAME = "original cache, same arguments"


@dataclass
class Cell:
    """status (STATUSES), the max |logit diff| it was decided from, and the evidence."""

    family: str
    check: str
    status: str
    value: float | None = None
    compared_with: str = ""
    detail: str = ""
    first_call: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        c = self.first_call or {}
        return {"family": self.family, "check": self.check, "status": self.status, "max_abs_diff": self.value,
                "compared_with": self.compared_with, "input_ids_shape": c.get("input_ids_shape"),
                "attention_mask_shape": c.get("attention_mask_shape"), "position_ids_shape": c.get("position_ids_shape"),
                "past_length": c.get("past_length"), "detail": self.detail}


def zero_input(outcome: Outcome) -> bool:
    """The first model call received no input token (the 02 mechanism: the suffix was sliced away)."""
    shape = (outcome.first_call or {}).get("input_ids_shape")
    return bool(shape) and shape[-1] == 0


def row_diffs(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """Per batch row: max |a - b| (a, b: [batch, vocab])."""
    return (a.detach().float() - b.detach().float().reshape(a.shape)).abs().reshape(a.shape[0], -1).amax(-1).tolist()


def _error(outcome: Outcome) -> str:
    return f"{outcome.error_type} ({outcome.stage}): {(outcome.error or '')[:100]}"


def against_tensor(family: str, check: str, outcome: Outcome, target: torch.Tensor, floor: NoiseFloor,
                   compared_with: str) -> Cell:
    """A continuation against a fixed tensor (the full-forward reference)."""
    if not outcome.ok:
        status = "zero_input" if zero_input(outcome) else "error"
        return Cell(family, check, status, None, compared_with, _error(outcome), outcome.first_call)
    value = max_abs_diff(target, outcome.logits)
    bitwise = torch.equal(target.float().reshape(-1), outcome.logits.float().reshape(-1))
    status = "bitwise" if bitwise else "matches" if floor.matches(value) else "differs"
    return Cell(family, check, status, value, compared_with, "", outcome.first_call)


def against_outcome(family: str, check: str, outcome: Outcome, base: Outcome, floor: NoiseFloor,
                    compared_with: str) -> Cell:
    """A continuation against another one under identical arguments (the control's comparison)."""
    if base.ok:
        return against_tensor(family, check, outcome, base.logits, floor, compared_with)
    if not outcome.ok:
        same = outcome.error_type == base.error_type
        status = ("zero_input" if zero_input(outcome) and zero_input(base) else "both_error") if same else "error"
        return Cell(family, check, status, None, compared_with, "both failed: " + _error(outcome), outcome.first_call)
    return Cell(family, check, "differs", None, compared_with, "only the comparison failed: " + _error(base), outcome.first_call)


def raised(family: str, check: str, exc: BaseException, stage: str) -> Cell:
    """A rebuild that raised before any model call."""
    text = str(exc).strip().splitlines()
    return Cell(family, check, "error", None, "", f"{type(exc).__name__} ({stage}): {(text[0] if text else '')[:100]}")


@dataclass
class Measured:
    """One family's cells, its floor, and the lengths and states the claims need."""

    family: Family
    floor: NoiseFloor
    cells: dict[str, Cell]
    extra: dict[str, Any] = field(default_factory=dict)


def flash_status(device: str, dtype: str = "float16") -> tuple[bool, str]:
    """(FlashAttention-2 can run here, why not): CUDA, the flash_attn package, a half-precision dtype."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return False, ("FlashAttention-2 needs CUDA; this run is on CPU (run with -p device cuda -p dtype float16 where "
                       "flash_attn is installed)")
    if importlib.util.find_spec("flash_attn") is None:
        return False, "the flash_attn package is not installed"
    if str(dtype).replace("torch.", "") not in ("float16", "bfloat16", "fp16", "bf16", "half"):
        return False, f"FlashAttention-2 runs in float16 or bfloat16, this run is {dtype} (-p dtype float16)"
    return True, ""


class Runner:
    """Continuations of one family from copies of its prefix cache."""

    def __init__(self, family: Family) -> None:
        self.family = family
        model = family.model
        with torch.no_grad():
            out = model(**family.prefill_kwargs(), use_cache=True)
        self.cache = compat.output_cache(out)
        state = compat.get_rope_state(model)
        self.state = None if state is None else state.clone()
        self.positions = family.current_positions()

    def _restore(self, model: torch.nn.Module) -> None:
        if self.state is not None and compat.rope_state_owner(model) is not None:
            compat.set_rope_state(model, self.state.clone())

    def generate(self, cache: Any, model: torch.nn.Module | None = None, restore: bool = True, **kwargs: Any) -> Outcome:
        """generate() one greedy step from a copy of `cache` with the suffix token."""
        model = model or self.family.model
        if restore:
            self._restore(model)
        return generate_first_step(model, self.family.suffix, copy.deepcopy(cache), **kwargs)

    def forward(self, cache: Any, **kwargs: Any) -> Outcome:
        """A direct forward from a copy of `cache`: the suffix, the full mask, the position from the cache."""
        self._restore(self.family.model)
        return forward_step(self.family.model, self.family.suffix, copy.deepcopy(cache),
                            attention_mask=self.family.full_mask, **kwargs)

    def arg_kwargs(self, name: str) -> dict[str, Any]:
        """The control's four argument sets (mask = the full mask, positions = the suffix's explicit ids)."""
        return generation_kwargs(name, self.family.prompt, self.positions)

    def with_backend(self, implementation: str, cache: Any) -> Outcome:
        """generate(full mask) with another attention implementation; the model's own is put back."""
        with attention_kernel(self.family.model, implementation):
            return self.generate(cache, attention_mask=self.family.full_mask)


@torch.no_grad()
def other_attention_reference(family: Family) -> torch.Tensor:
    """The reference with the other attention kernel (sdpa <-> eager): this dtype's rounding noise on this model."""
    with attention_kernel(family.model):
        return reference(family)


def measure(family: Family, flash: tuple[bool, str]) -> Measured:
    """Every check of CHECKS on one family."""
    name, ref = family.name, reference(family)
    run = Runner(family)
    full = {"attention_mask": family.full_mask}
    orig_gen, orig_fwd = run.generate(run.cache, **full), run.forward(run.cache)
    current = getattr(family.model.config, "_attn_implementation", None) or "sdpa"
    other = "sdpa" if current == "eager" else "eager"  # the other kernel of the two
    eager = run.with_backend(other, run.cache)
    if family.padded:  # every padded continuation is under test: the floor comes from the unpadded rows alone
        agreeing, what = [other_attention_reference(family)], "each unpadded row's full forward, sdpa vs eager"
    else:
        agreeing = [s.logits for s in (orig_gen, eager) if s.ok]
        what = "full forward vs generate(full mask) from the original cache, sdpa and eager"
    floor = noise_floor(ref, agreeing, family.bundle.dtype, what=what)
    cells: dict[str, Cell] = {}

    def vs(check: str, outcome: Outcome, base: Outcome = orig_gen, what: str = SAME) -> None:
        cells[check] = against_outcome(name, check, outcome, base, floor, what)

    extra: dict[str, Any] = {"processed_length": family.processed_length, "original_lengths": layers.lengths(run.cache),
                             "original_widths": layers.widths(run.cache), "original_seq_length": int(run.cache.get_seq_length()),
                             "layer_classes": [type(l).__name__ for l in compat.cache_layers(run.cache)],
                             "kernel": current, "other_kernel": other}
    try:
        ctrl = control_rebuild(run.cache)
        extra["control_rebuild_seq_length"] = int(ctrl.get_seq_length())
        extra["control_rebuild_lengths"] = layers.lengths(ctrl)
        vs("control_rebuild·generate", run.generate(ctrl, **full))
        vs("control_rebuild·other_kernel", run.with_backend(other, ctrl), eager, f"{SAME}, {other}")
        vs("control_rebuild·forward", run.forward(ctrl), orig_fwd)
    except Exception as exc:  # noqa: BLE001 - the rebuild itself failing is the measurement
        extra["control_rebuild_error"] = f"{type(exc).__name__}: {exc}"
        for check in ("control_rebuild·generate", "control_rebuild·other_kernel", "control_rebuild·forward"):
            cells[check] = raised(name, check, exc, REBUILD_STAGE)
    aware = family_rebuild(run.cache, family.model.config)
    config_rebuilt = attention_only_rebuild(run.cache, family.model.config)
    for label, rebuilt in (("config_rebuild", config_rebuilt), ("family_rebuild", aware)):
        extra[f"{label}_lengths"] = layers.lengths(rebuilt)
        vs(f"{label}·generate", run.generate(rebuilt, **full))
        vs(f"{label}·forward", run.forward(rebuilt), orig_fwd)
    extra["family_rebuild_state_equal"] = layers.cache_state_equal(run.cache, aware)
    for variant in GENERATION_VARIANTS:
        cells[variant] = against_tensor(name, variant, run.generate(run.cache, **run.arg_kwargs(variant)), ref, floor,
                                        "full forward over the prompt")
    vs("fresh_instance", run.generate(run.cache, model=family.bundle.fresh_instance(), restore=False, **full),
       what="same instance, same cache and arguments")
    vs("eager_vs_sdpa", eager, what=f"generate(full mask) with {current}")
    if flash[0]:
        vs("flash_attention_2", run.with_backend("flash_attention_2", run.cache), what=f"generate(full mask) with {current}")
    else:
        cells["flash_attention_2"] = Cell(name, "flash_attention_2", "skipped", None, "", flash[1])
    if family.padded:
        extra["padded"] = padded_masks(run, ref, floor)
    return Measured(family, floor, cells, extra)


def resume_masks(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The masks a left-padded batch can be resumed with: suffix only, all ones at full length, the padded one."""
    return {"suffix_only": torch.ones_like(mask[:, -1:]), "all_ones": torch.ones_like(mask), "padded": mask}


def padded_masks(run: Runner, ref: torch.Tensor, floor: NoiseFloor) -> dict[str, dict[str, Any]]:
    """generate() from the padded cache under each resume mask, per row against the unpadded reference."""
    out = {}
    for label, mask in resume_masks(run.family.full_mask).items():
        step = run.generate(run.cache, attention_mask=mask)
        diffs = row_diffs(ref, step.logits) if step.ok else None
        out[label] = {"ok": step.ok, "row_max_abs_diff": diffs, "first_call": step.first_call,
                      "error": step.error_summary(), "mask_shape": list(mask.shape),
                      "matches": bool(diffs) and all(floor.matches(d) for d in diffs),
                      "differs": bool(diffs) and any(floor.differs(d) for d in diffs)}
    return out
