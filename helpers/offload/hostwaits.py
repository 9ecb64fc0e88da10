"""generate()'s per-step host wait, recorded by wrapping transformers' own stop check (never assumed).

From 5.17.0 `generate()` decides whether to stop with `StopCheck.__call__`, which reads
`bool(unfinished_sequences.max() == 0)` on the host: a host wait on the device every step
(`DeferredStopCheck`, which does not wait, is enabled only on MPS). Earlier releases compute
`this_peer_finished = unfinished_sequences.max() == 0` (a tensor) and `_has_unfinished_sequences`
turns it into a Python bool: the same wait. Both are wrapped here for the duration of one call; a
wait is entered under the label of the forward call it precedes ("decode k").
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


def _waiter(waits: list[str], calls: Callable[[], int], on_wait: Callable[[str], None] | None) -> Callable[[], None]:
    def wait() -> None:
        label = f"decode {calls()}"
        waits.append(label)
        if on_wait:
            on_wait(label)
    return wait


def _wrap_stop_check(wait: Callable[[], None], undo: list[tuple[Any, str, Any]]) -> bool:
    """Wrap `StopCheck.__call__` (the blocking check; `DeferredStopCheck` overrides it) where it exists."""
    from transformers.generation import utils

    cls = getattr(utils, "StopCheck", None)
    if cls is None:
        return False
    inner = cls.__call__

    def __call__(self: Any, unfinished: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        if type(self).__call__ is __call__:  # the blocking check itself, not a subclass's override
            wait()
        return inner(self, unfinished, *args, **kwargs)

    undo.append((cls, "__call__", inner))
    cls.__call__ = __call__
    return True


def _wrap_has_unfinished(wait: Callable[[], None], undo: list[tuple[Any, str, Any]]) -> None:
    """Before StopCheck: `_has_unfinished_sequences` reads the device flag `this_peer_finished` on the host."""
    from transformers.generation.utils import GenerationMixin

    inner = GenerationMixin._has_unfinished_sequences

    def _has_unfinished_sequences(self: Any, this_peer_finished: Any, *args: Any, **kwargs: Any) -> bool:
        if isinstance(this_peer_finished, torch.Tensor):
            wait()
        return inner(self, this_peer_finished, *args, **kwargs)

    undo.append((GenerationMixin, "_has_unfinished_sequences", inner))
    GenerationMixin._has_unfinished_sequences = _has_unfinished_sequences


@contextmanager
def record_host_waits(calls: Callable[[], int], on_wait: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """Yield a list that fills with one label per host-side read of the device stop flag.

    `calls()` returns how many forward calls have run so far: a wait after call n precedes "decode n";
    `on_wait(label)` runs at the wait (the stream record enters it as a host synchronize there).
    """
    waits: list[str] = []
    undo: list[tuple[Any, str, Any]] = []
    try:
        wait = _waiter(waits, calls, on_wait)
        if not _wrap_stop_check(wait, undo):
            _wrap_has_unfinished(wait, undo)
        yield waits
    finally:
        for obj, name, previous in reversed(undo):
            setattr(obj, name, previous)

