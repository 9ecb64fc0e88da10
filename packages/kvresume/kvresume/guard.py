"""The resume guard: the control's "validation in generate()", as checks before an unchanged `generate()`.

The guard decides on what generate() itself receives: its arguments, the model's own state, and what it feeds its
first model call (read by a forward pre-hook, so the slicing checked is the installed release's own). The checks are
the ordered list `checks.CHECKS`; each raises `ResumeInputError` saying what to pass instead. `processed_length` (how
many tokens the caller processed before the suffix, which generate() is never told) is optional: the checks that
need it run only where it is given. `guarded_generate` keeps generate()'s signature (positional `inputs` first);
`check_resume_inputs` runs generate() up to its first model call and stops there, before any layer writes the cache.
Nothing of transformers is patched.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import GenerationConfig

from . import compat
from .call import ResumeCall, first_call_hook, from_forward, from_generate, is_encoder_decoder
from .tracking import as_rows, rotary_hook
from .checks import CHECKS, Check, ResumeInputError
from .row_checks import note_expansion

Processed = int | torch.Tensor | list[int] | None


def first_error(call: ResumeCall, checks: Sequence[Check] = CHECKS,
                positions: bool | None = None) -> ResumeInputError | None:
    """The first check's refusal (its `check` name and `fix` set), or None; `positions`: only the checks that read the
    fed positions (True), only the others (False), all (None)."""
    for check in checks:
        if not check.applies(call) or (positions is not None and check.needs_positions != positions):
            continue
        try:
            check.run(call)
        except ResumeInputError as exc:
            exc.check = exc.check or check.name
            return exc
    return None


def first_catch(call: ResumeCall, checks: Sequence[Check] = CHECKS) -> tuple[str, str] | None:
    """(check name, message) of the first check that refuses the call, or None."""
    error = first_error(call, checks)
    return None if error is None else (error.check, str(error))


def run_checks(call: ResumeCall | None, checks: Sequence[Check] = CHECKS, positions: bool | None = None) -> None:
    """Raise the first check's ResumeInputError (nothing to check where no filled cache is given)."""
    if call is None or call.lengths[1] == 0:
        return
    error = first_error(call, checks, positions)
    if error is not None:
        raise error


class _Stop(Exception):
    """Raised by the dry run's hook to leave generate() before its first model call computes anything."""


def cache_positions(call: ResumeCall, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """Where the model has no rotary embedding: the positions given, else the cache positions of what is fed."""
    given = kwargs.get("decoder_position_ids" if is_encoder_decoder(call.model) else "position_ids")
    if isinstance(given, torch.Tensor):
        return as_rows(given, call.given_rows, call.f)
    return (call.lengths[0] + torch.arange(call.f)).view(1, 1, -1).expand(1, call.given_rows, call.f)  # pragma: no mutate - expands alike


@contextmanager
def checked_first_call(model: torch.nn.Module, call: ResumeCall, then: Callable[[], None] | None = None) -> Iterator[None]:
    """The checks at generate()'s first model call: those on its arguments at the model's pre-hook, those on the fed
    positions at the text rotary embedding's first call (at once where the model has none); `then()` after both."""
    has_rotary: list[bool] = []
    kwargs_seen: dict[str, Any] = {}

    def on_positions(positions: torch.Tensor | None) -> None:
        call.fed_positions = (as_rows(positions, call.given_rows, call.f) if positions is not None and call.f
                              else cache_positions(call, kwargs_seen))
        run_checks(call, positions=True)
        if then is not None:
            then()

    def on_call(kwargs: dict[str, Any]) -> None:
        kwargs_seen.update(kwargs)
        call.feed(model, kwargs)
        run_checks(call, positions=False)
        if not has_rotary[0]:
            on_positions(None)

    with rotary_hook(model, on_positions) as rotary, first_call_hook(model, on_call):
        has_rotary.append(rotary)
        yield


def _dry_run(model: torch.nn.Module, inputs: torch.Tensor | None, kwargs: dict[str, Any], call: ResumeCall) -> None:
    """generate() up to its first model call, the checks run there; generate()'s own error, where it raised before the
    model, re-raised unchanged. The cache is not copied: the run stops at the text rotary embedding's first call (the
    model's pre-hook where it has none), before any layer writes (tests/test_chat_dryrun.py checks it bitwise); the
    model's rope_deltas are put back."""

    def stop() -> None:
        raise _Stop

    config = kwargs.get("generation_config")  # a length limit cannot stop it first (one new token, in the config
    args = ({"max_new_tokens": 1, **kwargs} if config is None  # where one is given: beside it, 5.17 warns)
            else {**kwargs, "generation_config": GenerationConfig.from_dict({**config.to_dict(), "max_new_tokens": 1})})
    args = {k: v for k, v in args.items() if k != "streamer"}  # the dry run's prompt is not the caller's to stream
    state = compat.get_rope_state(model)
    try:
        with torch.no_grad(), checked_first_call(model, call, stop), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generate()'s advice on this dry run's length is not the caller's
            compat.plain_generate(model)(inputs, **args)
    except _Stop:
        pass
    finally:
        compat.put_rope_state(model, state)


def check_resume_inputs(model: torch.nn.Module, inputs: torch.Tensor | None = None, *,
                        processed_length: Processed = None, **kwargs: Any) -> None:
    """Raise ResumeInputError (what to pass instead) for generate() arguments that resume a cache wrongly; an error
    generate() itself raises first is raised unchanged."""
    call = from_generate(model, inputs, kwargs, processed_length)
    if call is None or call.lengths[1] == 0:
        return
    note_expansion(call, model, kwargs)
    _dry_run(model, inputs, kwargs, call)


def check_forward_call(model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """The checks on one forward call's own arguments (what generate() feeds at any step, e.g. assisted decoding's);
    the position checks where the call is given its positions."""
    call = from_forward(model, kwargs)
    run_checks(call, positions=False)
    given = kwargs.get("decoder_position_ids" if is_encoder_decoder(model) else "position_ids")
    if call is not None and isinstance(given, torch.Tensor) and call.f:
        call.fed_positions = as_rows(given, call.given_rows, call.f)
        run_checks(call, positions=True)


def guarded_generate(model: torch.nn.Module, inputs: torch.Tensor | None = None, *args: Any,
                     processed_length: Processed = None, **kwargs: Any) -> Any:
    """`model.generate(inputs, *args, **kwargs)` unchanged, its first model call checked before it computes."""
    call = from_generate(model, inputs, kwargs, processed_length)
    if call is None or call.lengths[1] == 0:
        return compat.plain_generate(model)(inputs, *args, **kwargs)
    note_expansion(call, model, kwargs)
    state = compat.get_rope_state(model)
    try:
        with checked_first_call(model, call):
            return compat.plain_generate(model)(inputs, *args, **kwargs)
    except ResumeInputError:
        compat.put_rope_state(model, state)  # refused inside the first call: the model's position state as it was
        raise
