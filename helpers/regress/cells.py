"""One cell of the table: an outcome against the measured noise floor, with what reached the first model call."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..compare import NoiseFloor, max_abs_diff
from ..continuation import Outcome


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
