"""The race observed on the device: CUDA events around every copy of the offloading path, and the blocks it reuses.

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

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .tracking import _kv, _layer_arg, instrument


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
