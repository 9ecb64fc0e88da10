"""One cell of notebook 08: a resume call of the kit run plain and guarded, and what each did.

Plain: `generate()` as the kit's notebook called it, judged against that cell's reference (the full forward, or for a
compressed cache its explicit-position forward) with the group's noise floor: `worked`, `silently_wrong` or
`raised`. Guarded: `guarded_generate` with the same arguments and the caller's processed length: `raised`
(ResumeInputError, with its message) or `passed` (and then its logits must equal the plain call's bit for bit).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .. import compat
from ..compare import NoiseFloor
from ..continuation import Outcome, generate_first_step, greedy_config
from ..regress.cells import max_diff
from .guard import ResumeInputError, check_resume_inputs

PLAIN = ("worked", "silently_wrong", "raised")
GUARDED = ("passed", "raised")


@dataclass
class Cell:
    """A cell's plain and guarded outcomes, with the numbers and messages they were read from."""

    group: str
    cell: str
    plain: str
    guard: str
    max_abs_diff: float | None = None
    threshold: float | None = None
    plain_error: str = ""
    guard_message: str = ""
    guarded_equals_plain: bool | None = None  # a passing guard's generate() gave the plain call's logits bit for bit
    undecided: str = ""  # why the plain outcome could not be judged (no reference ran); such a cell is not counted

    def row(self) -> dict[str, Any]:
        return {"group": self.group, "cell": self.cell, "plain": self.plain, "guard": self.guard,
                "max_abs_diff": self.max_abs_diff, "threshold": self.threshold, "plain_error": self.plain_error[:120],
                "guard_message": self.guard_message[:160], "guarded_equals_plain": self.guarded_equals_plain,
                "undecided": self.undecided}


def plain_status(outcome: Outcome, reference: torch.Tensor | None, floor: NoiseFloor) -> tuple[str, float | None]:
    """worked / silently_wrong / raised, and the max |diff| from the reference it was decided from."""
    if not outcome.ok:
        return "raised", None
    if reference is None:
        return "worked", None
    value = max_diff(reference, outcome.logits)
    return ("worked" if floor.matches(value) else "silently_wrong"), value


def guard_message(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, kwargs: dict[str, Any],
                  processed_length: Any) -> str:
    """The guard's ResumeInputError message for these arguments ('' when it passes)."""
    try:
        check_resume_inputs(cache, input_ids, kwargs.get("attention_mask"), kwargs.get("position_ids"), processed_length,
                            rope_deltas=compat.get_rope_state(model))
    except ResumeInputError as exc:
        return str(exc)
    return ""


@torch.no_grad()
def guarded_step(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, processed_length: Any,
                 **kwargs: Any) -> tuple[str, Outcome | None]:
    """(guard message, outcome): `guarded_generate`'s one greedy step; no generate() when the guard raises."""
    from .guard import guarded_generate

    message = guard_message(model, input_ids, cache, kwargs, processed_length)
    if message:
        return message, None

    def call() -> Outcome:
        out = guarded_generate(model, processed_length, input_ids=input_ids, generation_config=greedy_config(model),
                               **{compat.generate_cache_kwarg(model): copy.deepcopy(cache)}, **kwargs)
        return Outcome(True, compat.generate_logits(out)[0].detach().clone())

    try:
        return "", call()
    except Exception as exc:  # noqa: BLE001 - generate() itself raised after the guard passed: recorded
        return "", Outcome(False, error_type=type(exc).__name__, error=str(exc).splitlines()[0] if str(exc) else "")


def run_cell(group: str, name: str, model: torch.nn.Module, input_ids: torch.Tensor, cache: Any,
             kwargs: dict[str, Any], reference: torch.Tensor | None, floor: NoiseFloor,
             processed_length: Any, plain: Outcome | None = None) -> Cell:
    """Plain generate() (or the kit's own recorded `plain` outcome) and the guarded call, judged."""
    if plain is None:
        plain = generate_first_step(model, input_ids, copy.deepcopy(cache), **kwargs)
    status, value = plain_status(plain, reference, floor)
    message, guarded = guarded_step(model, input_ids, cache, processed_length, **kwargs)
    same = None
    if guarded is not None:
        same = bool(guarded.ok == plain.ok and (not plain.ok or torch.equal(guarded.logits, plain.logits)))
    return Cell(group, name, status, "raised" if message else "passed", value, floor.threshold,
                plain.error_summary()[:200] if not plain.ok else "", message, same)


def confusion(cells: list[Cell]) -> dict[str, dict[str, int]]:
    """{plain outcome: {guard outcome: count}} over the decided cells."""
    table = {p: {g: 0 for g in GUARDED} for p in PLAIN}
    for c in cells:
        if not c.undecided:
            table[c.plain][c.guard] += 1
    return table


def counts(cells: list[Cell]) -> dict[str, int]:
    """misses (silently wrong, guard passed), false alarms (worked, guard raised), caught, clean passes, clearer errors."""
    decided = [c for c in cells if not c.undecided]
    return {"cells": len(decided), "undecided": len(cells) - len(decided),
            "silently_wrong": sum(c.plain == "silently_wrong" for c in decided),
            "caught": sum(c.plain == "silently_wrong" and c.guard == "raised" for c in decided),
            "misses": sum(c.plain == "silently_wrong" and c.guard == "passed" for c in decided),
            "worked": sum(c.plain == "worked" for c in decided),
            "false_alarms": sum(c.plain == "worked" and c.guard == "raised" for c in decided),
            "raised_plain": sum(c.plain == "raised" for c in decided),
            "raised_plain_guard_raised": sum(c.plain == "raised" and c.guard == "raised" for c in decided)}


VERDICT = {("worked", "passed"): "passed", ("worked", "raised"): "false alarm", ("silently_wrong", "passed"): "missed",
           ("silently_wrong", "raised"): "caught", ("raised", "passed"): "not caught", ("raised", "raised"): "clearer error"}


def confusion_grid(cells: list[Cell]) -> tuple[list[str], list[str], list[list[str]], list[list[str]]]:
    """(rows, cols, status, text) for plots.status_grid: plain outcome x guard outcome, each cell its count."""
    table = confusion(cells)
    status = [[VERDICT[(p, g)] for g in GUARDED] for p in PLAIN]
    text = [[f"{table[p][g]} cells" for g in GUARDED] for p in PLAIN]
    return [f"plain {p}" for p in PLAIN], [f"guard {g}" for g in GUARDED], status, text
