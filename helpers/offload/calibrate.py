"""The device lag of the GPU arms, calibrated, and the race it makes, timed on the device.

The lag: cycles per ms of `torch.cuda._sleep` (measured as PyTorch's own tests do), and a sleep chosen from the
measured host time to reach the wrap prefetch of a forward.

`torch.cuda._sleep(cycles)` spins the GPU for a number of clock cycles; its length in ms depends on the clock, so
the kit measures it (the median of several timed sleeps between two CUDA events) instead of assuming a clock rate.
The sleep per forward is then `factor` x the longest host time, from the start of a forward to the enqueue of its
last (wrap) prefetch, measured in an uncalibrated run with no sleep: long enough that the default stream is still
busy when the wrap prefetch is enqueued, which each arm checks and records (`default_busy_at_enqueue`).

The device probe that gates the offload-event arm: does the prefetch stream's `wait_event` really wait? On a GPU,
`torch.Stream.wait_event(torch.cuda.Event)` waits on nothing (helpers.offload.streams, CUDA_EVENT), so the arm's
event form is tried on the very stream the installed release makes (`cache.prefetch_stream`) before the arm runs: a
long `torch.cuda._sleep` on the default stream, an event recorded after it, the wait on the prefetch stream, an event
recorded on the prefetch stream after the wait, then, after a short host pause, `query()`: still pending means the
prefetch stream is held behind the sleep. The no-op form is probed the same way, as a control.

The race observed on the device, CUDA events around every copy of the offloading path and the blocks it reuses:
`time_copies(cache, device)` wraps, on the cache instance only, the cache's update methods (host write order) and
every layer's `offload` / `prefetch` / `update` (the originals always run), and records timing events that add no
ordering between streams: after each offload copy (on the stream it ran on, the default stream), before and after
each prefetch copy (on the prefetch stream), after each layer update (its read of the prefetched block). At each
prefetch it asks whether the default stream is still busy (`query()` is False) and notes the host time since the
forward began; after it, the `data_ptr()` of the prefetched K/V. `table()` (after a final synchronize) gives per
prefetch its start and its producing copy's end on one device clock (`elapsed_time` from an origin event), so
"this prefetch started before its producing copy finished" is a device measurement, and whether the copy wrote
a block whose earlier holder's read had not finished (write-after-read on a reused block).

Under helpers.offload.streams' recording stand-ins the same code runs on CPU; the times are then the stand-ins'
modelled timeline (a simulation), and data pointers are CPU addresses that say nothing about the CUDA allocator.
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import tracking
from .tracking import _kv, _layer_arg, instrument

PROBE_CYCLES = 1_000_000
SLEEP_FACTOR = 4.0
MIN_SLEEP_MS = 1.0
MAX_SLEEP_MS = 200.0  # a cap, so that a slow host (or a CPU simulation) cannot make the arms run for minutes; above
# the host time to the wrap of the report's 64-layer layout (about 70 ms assumed by `make gpu-plan`)
# Plausible cycles per ms of `_sleep`: a 100 MHz to 5 GHz clock. A reading outside it is refused, so that a wrong
# rate cannot turn a 200 ms sleep into hours (only the step timeout would stop it).
MIN_CYCLES_PER_MS, MAX_CYCLES_PER_MS = 1e5, 5e6
WARM_MS = 500.0  # busy time before the rate is measured, so that the clocks have left their idle state


def warm_clocks(ms: float = WARM_MS) -> dict[str, Any]:
    """Keep the device busy for about `ms` (one rough rate, then one long `_sleep`), so that the rate measured next
    is the clock the arms run at, not an idle one; returns the rough (cold) rate and the warm-up asked for."""
    cold = cycles_per_ms(repeats=1)
    torch.cuda._sleep(int(cold * ms))
    torch.cuda.synchronize()
    return {"warm_ms": ms, "cold_cycles_per_ms": cold}


def cycles_per_ms(repeats: int = 5, cycles: int = PROBE_CYCLES) -> float:
    """Median cycles per ms of `torch.cuda._sleep` on the current stream (events with timing, synchronized)."""
    rates = []
    for _ in range(repeats):
        start = _event(None)
        torch.cuda._sleep(cycles)
        end = _event(None)
        end.synchronize()
        rates.append(cycles / max(float(start.elapsed_time(end)), 1e-9))
    return checked_rate(float(statistics.median(rates)))


def checked_rate(rate: float) -> float:
    """`rate` (cycles per ms) where it is a plausible clock; else ValueError, saying what was read."""
    if not (math.isfinite(rate) and MIN_CYCLES_PER_MS <= rate <= MAX_CYCLES_PER_MS):
        raise ValueError(f"torch.cuda._sleep measured at {rate:.4g} cycles per ms, outside a {MIN_CYCLES_PER_MS:.0e}-"
                         f"{MAX_CYCLES_PER_MS:.0e} (100 MHz-5 GHz) clock: the sleep would not last what was asked")
    return rate


def clamp_cycles(cycles: int, rate: float, cap_ms: float = MAX_SLEEP_MS) -> int:
    """`cycles` (calibrated, overridden, or another run's) clamped to [0, cap_ms at the checked `rate`]."""
    return max(0, min(int(cycles), int(round(cap_ms * checked_rate(rate)))))  # rounded as sleep_plan rounds


def wrap_prefetches(timing: Any) -> Any:
    """The last prefetch of each forward (the wrap), from a timing table (None: no rows)."""
    if timing is None or len(timing) == 0:
        return None
    return timing.sort_values("update_index").groupby("call_index").tail(1)


def host_ms_to_wrap(timing: Any) -> float | None:
    """The longest host time (ms) from a forward's start to the enqueue of its last prefetch, over the forwards."""
    last = wrap_prefetches(timing)
    return None if last is None else float(last.host_ms_since_forward_start.max())


def sleep_plan(host_ms: float | None, rate: float, factor: float = SLEEP_FACTOR, floor_ms: float = MIN_SLEEP_MS,
               cap_ms: float = MAX_SLEEP_MS) -> dict[str, Any]:
    """The sleep per forward: min(cap_ms, max(floor_ms, factor x host_ms)), in ms and in cycles at the measured rate."""
    wanted = max(floor_ms, factor * (host_ms or 0.0))
    ms = min(cap_ms, wanted)
    shown = host_ms if host_ms is None else round(host_ms, 3)
    return {"cycles_per_ms": rate, "host_ms_to_wrap": host_ms, "factor": factor, "floor_ms": floor_ms, "cap_ms": cap_ms,
            "sleep_ms": ms, "sleep_cycles": int(round(ms * rate)), "capped": wanted > cap_ms,
            "why": f"sleep = min({cap_ms} ms, max({floor_ms} ms, {factor} x {shown} ms host time to the wrap prefetch))"}


def busy_at_wrap(timing: Any) -> dict[str, Any]:
    """Per arm: how many wrap prefetches (the last of each forward) were enqueued while the default stream was busy."""
    last = wrap_prefetches(timing)
    if last is None:
        return {"wrap_prefetches": 0, "default_busy": 0}
    return {"wrap_prefetches": int(len(last)), "default_busy": int(last.default_busy_at_enqueue.sum())}


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


def event_wait_probe(waiter: Any, cycles_per_ms: float, ms: float = PROBE_MS) -> dict[str, Any]:
    """Both event forms waited by `waiter` (the installed release's prefetch stream): whether each held it."""
    cycles = int(ms * cycles_per_ms)
    arm = held_behind_sleep(waiter, tracking.device_event, cycles)  # the form the arm uses, looked up at call time
    noop = held_behind_sleep(waiter, tracking.cuda_event, cycles)
    conclusive = arm["default_still_busy"] and noop["default_still_busy"]
    kind = getattr(waiter, "api", None)  # a stand-in says which stream kind it stands in for
    kind = kind or ("torch.cuda.Stream" if isinstance(waiter, torch.cuda.Stream) else "torch.Stream")
    return {"prefetch_stream": kind, "sleep_ms": ms, "sleep_cycles": cycles, "conclusive": conclusive,
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


# --- timing events around every copy ----------------------------------------------------------------


@dataclass
class CopyTimes:
    """Timing events and host facts of one offloading run, in host order."""

    origin: Any = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    call: str = "(none)"
    call_index: int = -1
    update_index: int = -1
    forward_start: float = 0.0

    def begin(self, label: str) -> None:
        """A new forward call (host time is counted from here)."""
        self.call, self.call_index, self.forward_start = label, self.call_index + 1, time.perf_counter()

    def note(self, kind: str, layer: int, **fields: Any) -> dict[str, Any]:
        row = {"kind": kind, "call": self.call, "call_index": self.call_index, "update_index": self.update_index,
               "layer": layer, "host_ms": (time.perf_counter() - self.forward_start) * 1e3, **fields}
        self.rows.append(row)
        return row

    def ms(self, event: Any) -> float:
        """Device ms of `event` from the origin event (valid after a synchronize)."""
        return float(self.origin.elapsed_time(event))

    def table(self) -> Any:
        """Per prefetch: start/end, its producing offload's end, and whether it overwrote a block under a pending read."""
        import pandas as pd

        rows, last_offload, reads = [], {}, []
        for r in self.rows:
            if r["kind"] == "offload":
                last_offload[r["layer"]] = r
            elif r["kind"] == "update":
                reads.append(r)
            elif r["kind"] == "prefetch":
                rows.append(self._prefetch_row(r, last_offload.get(r["layer"]), reads))
        return pd.DataFrame(rows)

    def _prefetch_row(self, r: dict[str, Any], producer: dict[str, Any] | None, reads: list[dict[str, Any]]) -> dict[str, Any]:
        start, end = self.ms(r["start"]), self.ms(r["end"])
        done = self.ms(producer["done"]) if producer else None
        reused = [u for u in reads if set(u["read_ptrs"]) & set(r["ptrs"])]
        pending = [u for u in reused if self.ms(u["done"]) > start]
        return {"call": r["call"], "call_index": r["call_index"], "update_index": r["update_index"], "layer": r["layer"],
                "producer_call": producer["call"] if producer else None,
                "cross_forward": bool(producer and producer["call_index"] != r["call_index"]),
                "prefetch_start_ms": start, "prefetch_end_ms": end, "producer_done_ms": done,
                "lead_ms": None if done is None else done - start,
                "default_busy_at_enqueue": r["default_busy"], "host_ms_since_forward_start": r["host_ms"],
                "reused_block_of": [f"{u['call']} layer {u['layer']}" for u in reused],
                "overwrote_pending_read": bool(pending),
                "pending_read_of": [f"{u['call']} layer {u['layer']}" for u in pending]}


def _event(stream: Any) -> Any:
    """A timing event recorded on `stream` (None: the current stream)."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


@contextmanager
def time_copies(cache: Any, device: str | torch.device | None = None) -> Iterator[CopyTimes]:
    """Record timing events around every copy of `cache`'s offloading path (no ordering added between streams)."""
    device = torch.device(device) if device is not None else None
    times = CopyTimes(origin=_event(torch.cuda.default_stream(device)))

    def on_update(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        times.update_index += 1
        if method != "update":
            times.note("state write", _layer_arg(method, args, kwargs), method=method)

    def layer_hook(idx: int, layer: Any, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if method == "prefetch":
                busy = not torch.cuda.default_stream(device).query()
                start = _event(torch.cuda.current_stream(device))
                out = original(*args, **kwargs)
                times.note("prefetch", idx, start=start, end=_event(torch.cuda.current_stream(device)),
                           default_busy=busy, ptrs=[t.data_ptr() for t in _kv(layer)])
                return out
            read = [t.data_ptr() for t in _kv(layer)] if method == "update" else []
            out = original(*args, **kwargs)
            if method == "offload" and _kv(layer):
                times.note("offload", idx, done=_event(torch.cuda.current_stream(device)))
            elif method == "update":
                times.note("update", idx, done=_event(torch.cuda.current_stream(device)), read_ptrs=read)
            return out
        return wrapper

    with instrument(cache, on_update, layer_hook):
        yield times


def write_order(times: CopyTimes) -> dict[tuple[int, int], int]:
    """(call index, layer) -> host-order index of the last write of that layer's state in that call (update, state
    write, or a prefetch that brought it back): the order the state snapshots were written in."""
    order: dict[tuple[int, int], int] = {}
    for n, r in enumerate(times.rows):
        if r["kind"] in ("update", "state write", "prefetch"):
            order[(r["call_index"], r["layer"])] = n
    return order
