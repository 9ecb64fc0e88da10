"""The device probe that gates the offload-event arm: does the prefetch stream's `wait_event` really wait?

On a GPU, `torch.Stream.wait_event(torch.cuda.Event)` waits on nothing (helpers.offload.streams, CUDA_EVENT), so
the arm's event form is tried on the very stream the installed release makes (`cache.prefetch_stream`) before the arm
runs: a long `torch.cuda._sleep` on the default stream, an event recorded after it, the wait on the prefetch stream,
an event recorded on the prefetch stream after the wait, then, after a short host pause, `query()`: still pending
means the prefetch stream is held behind the sleep. The no-op form is probed the same way, as a control.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from . import tracking

PROBE_MS = 100.0  # the default stream's sleep: far longer than the host pause
HOST_PAUSE_S = 0.005  # long enough for an unblocked stream to reach its event


def held_behind_sleep(waiter: Any, make_event: Callable[..., Any], cycles: int) -> dict[str, bool]:
    """Sleep on the default stream, record `make_event()` after it, `waiter.wait_event` it, then query."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles))
    event = make_event()
    event.record(torch.cuda.current_stream())
    waiter.wait_event(event)
    after_wait = waiter.record_event()  # the stream's own event kind: a torch.cuda.Event on a torch.Stream is an
    # unchecked cast on torch 2.7-2.10
    time.sleep(HOST_PAUSE_S)
    held, busy = not after_wait.query(), not event.query()
    torch.cuda.synchronize()
    return {"held": held, "default_still_busy": busy}


def stream_kind(stream: Any) -> str:
    """torch.Stream or torch.cuda.Stream (the stand-ins say which they stand in for)."""
    return getattr(stream, "api", None) or ("torch.cuda.Stream" if isinstance(stream, torch.cuda.Stream) else "torch.Stream")


def event_wait_probe(waiter: Any, cycles_per_ms: float, ms: float = PROBE_MS) -> dict[str, Any]:
    """Both event forms waited by `waiter` (the installed release's prefetch stream): whether each held it."""
    cycles = int(ms * cycles_per_ms)
    arm = held_behind_sleep(waiter, tracking.device_event, cycles)  # the form the arm uses, looked up at call time
    noop = held_behind_sleep(waiter, tracking.cuda_event, cycles)
    conclusive = arm["default_still_busy"] and noop["default_still_busy"]
    return {"prefetch_stream": stream_kind(waiter), "sleep_ms": ms, "sleep_cycles": cycles, "conclusive": conclusive,
            "arm_form": "torch.Event(device='cuda') waited by prefetch_stream.wait_event",
            "arm_form_waits": conclusive and arm["held"],
            "no_op_form": "torch.cuda.Event() waited by prefetch_stream.wait_event",
            "no_op_form_waits": conclusive and noop["held"], "raw": {"arm": arm, "no_op": noop}}


def gate_reason(probe: dict[str, Any]) -> str:
    """Why the offload-event arm does not run ('' when it does)."""
    if probe["arm_form_waits"]:
        return ""
    if not probe["conclusive"]:
        return f"device probe inconclusive: the default stream's {probe['sleep_ms']} ms sleep had ended before the query"
    return f"device probe: {probe['arm_form']} did not hold the {probe['prefetch_stream']} behind a {probe['sleep_ms']} ms sleep"
