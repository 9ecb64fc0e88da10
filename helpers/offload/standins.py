"""The recording stand-ins for the CUDA stream API (helpers.offload.streams models what they record).

`recording_streams()` replaces, for the duration, torch.Stream, torch.cuda.Stream, torch.cuda.stream, default_stream,
current_stream, synchronize, torch.Event, torch.cuda.Event and _sleep by stand-ins that enter every call into a
`streams.StreamLog`; both stream kinds and both event kinds are kept apart, so the one combination that waits on
nothing on a GPU (`torch.Stream.wait_event(torch.cuda.Event)`) orders nothing here either. `torch.cuda._sleep(c)`
lasts c / STAND_IN_CYCLES_PER_MS ms on the stand-ins' timeline.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Callable, Iterator
from unittest import mock

import torch

from .streams import CUDA_EVENT, CUDA_STREAM, TORCH_EVENT, TORCH_STREAM, RecEvent, StreamLog

STREAM_API = ("torch.Stream", "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.default_stream",
              "torch.cuda.current_stream", "torch.cuda.synchronize", "torch.Event", "torch.cuda.Event", "torch.cuda._sleep")
STAND_IN_CYCLES_PER_MS = 1_000_000.0  # the stand-ins' clock: torch.cuda._sleep(c) lasts c / this ms


def _stand_ins(log: StreamLog) -> dict[str, Callable[..., Any]]:
    def sleep(cycles: int) -> None:
        log.enqueue(log.current(), "sleep", duration_ms=int(cycles) / STAND_IN_CYCLES_PER_MS, detail=f"{int(cycles)} cycles")

    return {
        "torch.Stream": lambda *a, **k: log.new_stream("torch.Stream()", api=TORCH_STREAM),
        "torch.cuda.Stream": lambda *a, **k: log.new_stream("torch.cuda.Stream()", api=CUDA_STREAM),
        "torch.cuda.stream": lambda stream=None: stream if stream is not None else nullcontext(),  # a RecStream enters
        "torch.cuda.default_stream": lambda device=None: log.default_stream(),
        "torch.cuda.current_stream": lambda device=None: log.current(),
        "torch.cuda.synchronize": lambda device=None: log.synchronize(None, "torch.cuda.synchronize()"),
        "torch.Event": lambda *a, **k: RecEvent(log, api=TORCH_EVENT),
        "torch.cuda.Event": lambda *a, **k: RecEvent(log, api=CUDA_EVENT),
        "torch.cuda._sleep": sleep,
    }


def _resolve(qualname: str) -> tuple[Any, str]:
    owner = torch.cuda if qualname.startswith("torch.cuda.") else torch
    return owner, qualname.rsplit(".", 1)[-1]


@contextmanager
def recording_streams(log: StreamLog | None = None) -> Iterator[StreamLog]:
    """Replace the CUDA stream API by recording stand-ins, restored on exit (also after an error)."""
    log = log or StreamLog()
    with ExitStack() as stack:
        for qualname, fn in _stand_ins(log).items():
            def counted(*args: Any, _fn: Callable[..., Any] = fn, _q: str = qualname, **kwargs: Any) -> Any:
                log.calls[_q] = log.calls.get(_q, 0) + 1
                return _fn(*args, **kwargs)

            counted.kvkit_stand_in = True  # type: ignore[attr-defined]
            stack.enter_context(mock.patch.object(*_resolve(qualname), counted, create=True))
        yield log


def stand_ins_active() -> list[str]:
    """The stand-ins currently installed (none may be left after the context manager)."""
    return [q for q in STREAM_API if getattr(getattr(*_resolve(q), None), "kvkit_stand_in", False)]
