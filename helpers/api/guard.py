"""The resume guard: the control's "validation in generate()", as checks before an unchanged `generate()`.

The guard decides on what generate() itself receives: its arguments, the model's own state, and what it feeds its
first model call (read by a forward pre-hook, so the slicing checked is the installed release's own). The checks are
the ordered list `checks.CHECKS`; each raises `ResumeInputError` saying what to pass instead. `processed_length` (how
many tokens the caller processed before the suffix, which generate() is never told) is optional: the checks that
need it run only where it is given. `guarded_generate` keeps generate()'s signature (positional `inputs` first);
`check_resume_inputs` runs generate() up to its first model call (on a copy of the cache) and stops there.
Nothing of transformers is patched.
"""
from __future__ import annotations  # upstream: drop

import copy
import warnings
from typing import Any, Sequence

import torch

from .. import compat  # upstream: drop
from .call import ResumeCall, first_call_hook, from_forward, from_generate  # upstream: drop
from .checks import CHECKS, Check, ResumeInputError  # upstream: drop

Processed = int | torch.Tensor | list[int] | None


def first_catch(call: ResumeCall, checks: Sequence[Check] = CHECKS) -> tuple[str, str] | None:
    """(check name, message) of the first check that refuses the call, or None."""
    for check in checks:
        if check.needs_processed_length and call.processed_length is None:
            continue
        try:
            check.run(call)
        except ResumeInputError as exc:
            return check.name, str(exc)
    return None


def run_checks(call: ResumeCall | None, checks: Sequence[Check] = CHECKS) -> None:
    """Raise the first check's ResumeInputError (nothing to check where no filled cache is given)."""
    if call is None or call.lengths[1] == 0:
        return
    caught = first_catch(call, checks)
    if caught is not None:
        error = ResumeInputError(caught[1])
        error.check = caught[0]
        raise error


class _Stop(Exception):
    """Raised by the dry run's hook to leave generate() before its first model call computes anything."""


def feed_by_generate(model: torch.nn.Module, inputs: torch.Tensor | None, kwargs: dict[str, Any], call: ResumeCall) -> None:
    """Record in `call` what generate() feeds its first model call for these arguments (on a copy of the cache; the
    model's rope_deltas put back); nothing where generate() raised before calling the model."""

    def stop(call_kwargs: dict[str, Any]) -> None:
        call.feed(model, call_kwargs)
        raise _Stop

    name = next(k for k in ("past_key_values", "cache") if kwargs.get(k) is not None)
    args = {"max_new_tokens": 1, **kwargs, name: copy.deepcopy(kwargs[name])}  # a length limit cannot stop it first
    owner = compat.rope_state_owner(model)
    state = compat.get_rope_state(model) if owner is not None else None
    try:
        with torch.no_grad(), first_call_hook(model, stop), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generate()'s advice on this dry run's length is not the caller's
            model.generate(inputs, **args)
    except _Stop:
        pass
    except Exception:  # noqa: BLE001 - generate() refused before the model: its own error stands, nothing was fed
        pass
    finally:
        if owner is not None:
            compat.set_rope_state(model, state)


def check_resume_inputs(model: torch.nn.Module, inputs: torch.Tensor | None = None, *,
                        processed_length: Processed = None, **kwargs: Any) -> None:
    """Raise ResumeInputError (what to pass instead) for generate() arguments that resume a cache wrongly."""
    call = from_generate(model, inputs, kwargs, processed_length)
    if call is None or call.lengths[1] == 0:
        return
    feed_by_generate(model, inputs, kwargs, call)
    run_checks(call)


def check_forward_call(model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """The checks on one forward call's own arguments (what generate() feeds at any step, e.g. assisted decoding's)."""
    run_checks(from_forward(model, kwargs))


def guarded_generate(model: torch.nn.Module, inputs: torch.Tensor | None = None, *args: Any,
                     processed_length: Processed = None, **kwargs: Any) -> Any:
    """`model.generate(inputs, *args, **kwargs)` unchanged, its first model call checked before it computes."""
    call = from_generate(model, inputs, kwargs, processed_length)
    if call is None or call.lengths[1] == 0:
        return model.generate(inputs, *args, **kwargs)

    def check(call_kwargs: dict[str, Any]) -> None:
        call.feed(model, call_kwargs)
        run_checks(call)

    with first_call_hook(model, check):
        return model.generate(inputs, *args, **kwargs)
