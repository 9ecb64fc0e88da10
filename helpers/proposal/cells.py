"""One cell of notebook 08: a resume call run plain and guarded, and what each did.

Plain: `generate()` as the call's notebook made it, judged against that cell's reference (the full forward, or for a
compressed cache its explicit-position forward) with the group's noise floor: `worked`, `silently_wrong` or
`raised`. Guarded, on generate()'s own inputs (no processed length): `guarded_generate` with the same arguments,
`raised` (ResumeInputError, with the check that raised and its message) or `passed` (then its logits must equal the
plain call's bit for bit). With the caller's processed length: `check_resume_inputs(..., processed_length=...)`, the
extra catches it adds, counted apart.

Every refusal's advice, run (`advice_rows`, notebook 08's `measurements.advice`): the refusal's `fix` (the guard's, or
the group's own where the message names a rebuild or a route) applied to the same call by `cell.rerun(fix)`, compared
with the reference within the cell's floor; one that names nothing to run or does not restore is a defect. Untracked
caches' rows carry the shape rules' advice, a guess from lengths: shown beside, decided apart.
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kvresume import compat
from ..compare import NoiseFloor, max_abs_diff
from ..continuation import Outcome, generate_first_step, greedy_config
from kvresume.guard import ResumeInputError, check_resume_inputs, guarded_generate
from kvresume.ledger import ledger_of, without_ledger
from kvresume.reuse import apply_fix, resume

PLAIN = ("worked", "silently_wrong", "raised")
GUARDED = ("passed", "raised")


@dataclass
class Cell:
    """A cell's plain and guarded outcomes, with the numbers and messages they were read from."""

    group: str
    cell: str
    plain: str
    guard: str  # on generate()'s own inputs
    max_abs_diff: float | None = None
    threshold: float | None = None
    plain_error: str = ""
    guard_message: str = ""
    guarded_equals_plain: bool | None = None  # a passing guard's generate() gave the plain call's logits bit for bit
    undecided: str = ""  # why the plain outcome could not be judged (no reference ran); such a cell is not counted
    guard_check: str = ""  # the check that raised
    with_length: str = ""  # the guard given the caller's processed length: passed / raised ('' where none is known)
    with_length_check: str = ""
    shape: str = ""  # the valid call shape the cell belongs to ('' for the kit's own cells)
    untracked: str = ""  # the guard on the same call with the cache's ledger removed (today's guard): passed / raised
    untracked_check: str = ""
    tracked: bool = False  # the cache had a ledger
    fix: dict[str, Any] | None = None  # the refusal's fix (kvresume.reuse.apply_fix), where it names one
    resume_diff: float | None = None  # kvresume.resume on the whole sequence vs the reference ('' where not run)
    resume_status: str = ""  # worked / silently_wrong / raised ('' where not run)
    resume_error: str = ""  # what resume raised
    resume_scope: str = ""  # why resume does not apply to this call ('' where it does)
    rerun: Any = None  # (fix) -> (status, max |diff|): the call again with the fix applied (notebook 08's advice)

    def row(self) -> dict[str, Any]:
        """The cell as a results row (the guard's check and the resume fields under their table names)."""
        out = {ROW_NAMES.get(k, k): v for k, v in vars(self).items() if k not in ("fix", "rerun")}
        return out | {"plain_error": self.plain_error[:120], "guard_message": self.guard_message[:160]}


ROW_NAMES = {"guard_check": "check", "with_length": "with_processed_length", "with_length_check": "check_with_length",
             "resume_status": "resume"}


def plain_status(outcome: Outcome, reference: torch.Tensor | None, floor: NoiseFloor) -> tuple[str, float | None]:
    """worked / silently_wrong / raised, and the max |diff| from the reference it was decided from."""
    if not outcome.ok:
        return "raised", None
    if reference is None:
        return "worked", None
    value = max_abs_diff(reference, outcome.logits)
    return ("worked" if floor.matches(value) else "silently_wrong"), value


def _guard(model: torch.nn.Module, inputs: torch.Tensor | None, cache: Any, kwargs: dict[str, Any]) -> tuple[str, str]:
    """(passed / raised, the check) of check_resume_inputs on the call (`cache`: the cache keyword's value as given)."""
    try:
        check_resume_inputs(model, inputs, **{compat.generate_cache_kwarg(model): cache}, **kwargs)
    except ResumeInputError as exc:
        return "raised", exc.check
    except Exception:  # noqa: BLE001 - generate()'s own error, raised unchanged: the guard added no refusal
        pass
    return "passed", ""


def _first_logits(out: Any) -> torch.Tensor:
    """A generate() output's first-step logits."""
    return compat.generate_logits(out)[0]


def _generate(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Plain `model.generate(...)` (the unguarded counterpart of guarded_generate)."""
    return model.generate(*args, **kwargs)


@torch.no_grad()
def _step(generate: Callable[..., Any], model: torch.nn.Module, inputs: Any, cache: Any, kwargs: dict[str, Any],
          read: Any = None) -> Outcome:
    """One greedy step of `generate(model, inputs, ...)` from a copy of `cache`, its first-step logits read by `read`,
    or the error it raised (first line); the guard's refusal (ResumeInputError) is raised on."""
    kwargs = {"generation_config": greedy_config(model), **kwargs}
    try:
        out = generate(model, inputs, **{compat.generate_cache_kwarg(model): copy.deepcopy(cache)}, **kwargs)
    except ResumeInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded: a call that raises is a measurement
        return Outcome(False, error_type=type(exc).__name__, error=str(exc).splitlines()[0] if str(exc) else "")
    return Outcome(True, (read or _first_logits)(out).detach().clone())


def judge(group: str, name: str, plain: Outcome, reference: torch.Tensor | None, floor: NoiseFloor,
          error: ResumeInputError | None, guarded: Outcome | None, length: tuple[str, str]) -> Cell:
    """A cell from the plain outcome, the guarded one and the guard given the processed length."""
    status, value = plain_status(plain, reference, floor)
    same = None
    if guarded is not None:
        same = bool(guarded.ok == plain.ok and (not plain.ok or torch.equal(guarded.logits, plain.logits)))
    cell = Cell(group, name, status, "raised" if error is not None else "passed", value, floor.threshold,
                plain.error_summary()[:200] if not plain.ok else "", str(error or ""), same,
                guard_check=getattr(error, "check", ""), with_length=length[0], with_length_check=length[1])
    cell.fix = dict(getattr(error, "fix", None) or {}) if error is not None else None
    return cell


def run_cell(group: str, name: str, model: torch.nn.Module, input_ids: torch.Tensor | None, cache: Any,
             kwargs: dict[str, Any], reference: torch.Tensor | None, floor: NoiseFloor,
             processed_length: Any, plain: Outcome | None = None, whole: Any = None,
             state: Any = "keep", reset: bool = False, resume_kwargs: dict[str, Any] | None = None,
             inputs: torch.Tensor | None = None, read: Any = None) -> Cell:
    """Plain generate() (or the kit's own recorded `plain` outcome), the guarded call, the guard with the length, and
    the follow-ups (`follow_up`; `inputs`: positional ids; `read`: the first-step logits of an output; `state`: the
    model-side position state each starts from, "keep": as it is; `reset`: put back before the plain, guarded and
    length calls too)."""
    def put() -> None:
        if reset:
            compat.put_rope_state(model, state)

    given = {**kwargs, **({"input_ids": input_ids} if input_ids is not None else {})}
    put()
    if plain is None:
        plain = generate_first_step(model, input_ids, copy.deepcopy(cache), **kwargs)
    put()
    try:
        error, guarded = None, _step(guarded_generate, model, inputs, cache, given, read)
    except ResumeInputError as exc:
        error, guarded = exc, None
    put()
    length = ("", "") if processed_length is None else _guard(
        model, inputs, copy.deepcopy(cache), {"processed_length": processed_length, **given})
    cell = judge(group, name, plain, reference, floor, error, guarded, length)
    return follow_up(cell, model, inputs, cache, given, reference, floor, whole, state, read, resume_kwargs)


def follow_up(cell: Cell, model: torch.nn.Module, inputs: torch.Tensor | None, cache: Any, given: dict[str, Any],
              reference: torch.Tensor | None, floor: NoiseFloor, whole: Any, state: Any, read: Any,
              resume_kwargs: dict[str, Any] | None) -> Cell:
    """The cell's untracked guard, its refusal's fix (rerun on demand: `cell.rerun(fix)`), and, for a silently wrong
    cell, `resume` on `whole` (the whole sequence) where given; `state`: the model-side position state put back before
    each call."""
    def put() -> None:
        if state != "keep":
            compat.put_rope_state(model, state)

    cell.tracked = ledger_of(cache) is not None
    put()
    cell.untracked, cell.untracked_check = _guard(model, inputs, without_ledger(cache), given) if cell.tracked else (
        cell.guard, cell.guard_check)

    def rerun(fix: dict[str, Any]) -> tuple[str, float | None]:
        if fix.get("resume"):  # the message names resume() on the whole sequence
            if whole is None:
                return "", None
            put()
            return plain_status(_resume_step(model, whole, cache, given, read, resume_kwargs), reference, floor)
        fixed_cache, fixed = apply_fix(fix, cache, given)
        put()
        return plain_status(_step(_generate, model, inputs, fixed_cache, fixed, read), reference, floor)

    cell.rerun = rerun
    if whole is not None and reference is not None and cell.plain == "silently_wrong":  # what resume is for
        put()
        got = _resume_step(model, whole, cache, given, read, resume_kwargs)
        cell.resume_error = "" if got.ok else f"{got.error_type}: {got.error}"[:200]
        cell.resume_status, cell.resume_diff = plain_status(got, reference, floor)
    put()
    return cell


def _resume_step(model: torch.nn.Module, whole: Any, cache: Any, kwargs: dict[str, Any], read: Any = None,
                 resume_kwargs: dict[str, Any] | None = None) -> Outcome:
    """`resume` on the whole sequence (ids, or a Prompt: its ids with the conversation's images) from a copy of the
    cache (the call's other generate() arguments kept)."""
    extra = dict(resume_kwargs if resume_kwargs is not None else {
        k: v for k, v in kwargs.items() if k not in ("attention_mask", "position_ids", "input_ids", "inputs_embeds")})
    if hasattr(whole, "mm_kwargs"):  # a Prompt: the conversation as a server passes it, its images included
        whole, extra = whole.input_ids, {**extra, **whole.mm_kwargs}
    config = extra.pop("generation_config", None) or greedy_config(model)
    try:
        with torch.no_grad():
            out = resume(model, whole, copy.deepcopy(cache), generation_config=config, **extra)
        return Outcome(True, (read or _first_logits)(out).detach().clone())
    except Exception as exc:  # noqa: BLE001 - recorded: resume refused or raised
        return Outcome(False, error_type=type(exc).__name__, error=str(exc)[:200])


def confusion(cells: list[Cell], guard: str = "guard") -> dict[str, dict[str, int]]:
    """{plain outcome: {guard outcome: count}} over the decided cells (`guard`: 'guard' or 'with_length')."""
    seen = Counter((c.plain, getattr(c, guard)) for c in cells if not c.undecided and getattr(c, guard))
    return {p: {g: seen[(p, g)] for g in GUARDED} for p in PLAIN}


def counts(cells: list[Cell], guard: str = "guard") -> dict[str, int]:  # guard: 'guard', 'with_length', 'untracked'
    """misses (silently wrong, guard passed), false alarms (worked, guard raised), caught, clean passes, clearer errors."""
    decided = [c for c in cells if not c.undecided and getattr(c, guard)]

    def n(plain: str, outcome: str | None = None) -> int:
        return sum(c.plain == plain and (outcome is None or getattr(c, guard) == outcome) for c in decided)

    return {"cells": len(decided), "undecided": sum(bool(c.undecided) for c in cells),
            "silently_wrong": n("silently_wrong"), "caught": n("silently_wrong", "raised"),
            "misses": n("silently_wrong", "passed"), "worked": n("worked"), "false_alarms": n("worked", "raised"),
            "raised_plain": n("raised"), "raised_plain_guard_raised": n("raised", "raised")}


VERDICT = {("worked", "passed"): "passed", ("worked", "raised"): "false alarm", ("silently_wrong", "passed"): "missed",
           ("silently_wrong", "raised"): "caught", ("raised", "passed"): "not caught", ("raised", "raised"): "clearer error"}


def confusion_grid(cells: list[Cell]) -> tuple[list[str], list[str], list[list[str]], list[list[str]]]:
    """(rows, cols, status, text) for plots.status_grid: plain outcome x guard outcome, each cell its count."""
    table = confusion(cells)
    status = [[VERDICT[(p, g)] for g in GUARDED] for p in PLAIN]
    text = [[f"{table[p][g]} cells" for g in GUARDED] for p in PLAIN]
    return [f"plain {p}" for p in PLAIN], [f"guard {g}" for g in GUARDED], status, text


WORDS = {"crop": "cache.crop to {} tokens", "cache": "a rebuilt cache", "call": "the call the message names",
         "resume": "resume() on the whole sequence"}


def describe(fix: dict[str, Any] | None) -> str:
    """The fix in words (what was applied)."""
    if not fix:
        return "no fix named"
    return "; ".join(WORDS[key].format(value) if key in WORDS else f"{key} {list(getattr(value, 'shape', []))}" + (
        f" from {value.reshape(-1, value.shape[-1])[:, 0].tolist()}" if key == "position_ids" else "")
        for key, value in fix.items())


def advice_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    """{cell, check, advice, applied, max_abs_diff, restores} for every cell the guard refused."""
    rows = []
    for c in cells:
        if c.guard != "raised" or c.undecided:
            continue
        status, value = c.rerun(c.fix) if c.fix and c.rerun is not None else ("", None)
        rows.append({"cell": f"{c.group}: {c.cell}", "tracked": c.tracked, "check": c.guard_check,
                     "advice": c.guard_message[:200],
                     "applied": describe(c.fix), "max_abs_diff": value, "threshold": c.threshold,
                     "restores": status == "worked"})
    return rows


def defects(rows: list[dict[str, Any]]) -> list[str]:
    """The refusals whose advice does not restore (or names nothing to run)."""
    return [r["cell"] for r in rows if not r["restores"]]
