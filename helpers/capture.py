"""Capture what reaches the first real model call, with forward hooks (as the source did).

Besides the first call's input shapes (a pre-hook on the model), a `Trace` records whether that call
finished (a post-hook), so a failure can be placed at the stage that raised, and the position ids the
text rotary embedding actually received during the first call (a pre-hook on it): the mechanism checks
of notebook 02 are decided from these, never from the error text.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from kvresume.compat import cache_from_kwargs, rotary_embedding

# Where an exception was raised, relative to the first model call.
BEFORE_MODEL_CALL = "before the first model call"
IN_FIRST_CALL = "inside the first model call"
AFTER_FIRST_CALL = "after the first model call returned"


def shape_of(value: Any) -> list[int] | None:
    """A tensor's shape as a list; None for anything else."""
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def describe_call(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Shapes of input_ids, attention_mask, position_ids and the cache length of one forward call."""
    cache = cache_from_kwargs(kwargs)
    return {
        "input_ids_shape": shape_of(kwargs.get("input_ids")),
        "attention_mask_shape": shape_of(kwargs.get("attention_mask")),
        "position_ids_shape": shape_of(kwargs.get("position_ids")),
        "past_length": int(cache.get_seq_length()) if cache is not None else None,
    }


@dataclass
class Trace:
    """The first model call (shapes), whether it finished, and the rotary position shapes seen inside it."""

    first: dict[str, Any] = field(default_factory=dict)
    started: int = 0
    finished: int = 0
    rotary_position_shapes: list[list[int]] = field(default_factory=list)

    def stage(self) -> str:
        """Where an exception raised now sits relative to the first model call."""
        if self.started == 0:
            return BEFORE_MODEL_CALL
        return IN_FIRST_CALL if self.finished == 0 else AFTER_FIRST_CALL


def raised_at(exc: BaseException) -> str:
    """'module.function' of the innermost frame that raised (for the evidence, not for decisions)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    module = last.filename.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{last.name}"


@contextmanager
def trace(model: torch.nn.Module) -> Iterator[Trace]:
    """Yields a Trace filled in by hooks on the model (first call) and on its text rotary embedding."""
    record = Trace()

    def pre(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        if record.started == 0:
            record.first = describe_call(kwargs)
        record.started += 1

    def post(_module: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], _out: Any) -> None:
        record.finished += 1

    def rotary(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if record.started == 1 and record.finished == 0:
            positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            record.rotary_position_shapes.append(shape_of(positions))

    with hooked(model, pre, post, rotary):
        yield record


@contextmanager
def hooked(model: torch.nn.Module, pre: Callable, post: Callable, rotary: Callable) -> Iterator[None]:
    """Pre and post hooks on the model and a pre hook on its text rotary embedding, removed on exit."""
    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.register_forward_hook(post, with_kwargs=True)]
    rope = rotary_embedding(model)
    if rope is not None:
        handles.append(rope.register_forward_pre_hook(rotary, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

