"""A recording model of the CUDA stream API: which copy is ordered before which read.

The offloading path of `Cache.update` enqueues non-blocking copies on two CUDA streams. Where there
is no GPU (or in the tests), `recording_streams()` (helpers.offload.standins) replaces torch.Stream, torch.cuda.Stream,
torch.cuda.stream, default_stream, current_stream, synchronize, torch.Event, torch.cuda.Event and _sleep by stand-ins that
record, in host order, every stream created, every `wait_stream` / `record_event` / `wait_event` /
synchronize, and which stream is current (`with stream:`). helpers.offload.tracking.track adds, per
cache layer, the copies and the compute those calls order: an offload reads the layer's device K/V and
writes a new host buffer, a prefetch reads that host buffer and writes the device K/V, the layer's
own update reads and writes the device K/V. Happens-before between them comes from vector clocks
(one per stream, joined by waits and host synchronizations), so `log.reads()` lists every read with
whether its producing copy is ordered before it.

Race replay (helpers.offload.tracking.track(..., lag=L)): the device is modelled as running L *cache-update calls* behind
the host — a cache-update call is one call of `Cache.update`, `Cache.update_conv_state` or
`Cache.update_recurrent_state` on this cache (one layer's cache write, in host order). A copy
enqueued during cache-update call u has landed by cache-update call u + L. A read that is not ordered
after its producing copy executes as soon as it is enqueued, so when it is enqueued fewer than L
calls after the copy it sees what the host buffer held before the copy landed: zeros, as a freshly
allocated pinned buffer. This is a simulation of the hypothesis, not a measurement of a GPU.

Device timeline of the stand-ins (a model of the hardware, used only to run the GPU arms' event timing on CPU):
every enqueued op starts when the host has enqueued it (the host spends STAND_IN_HOST_MS per enqueue) and its
stream has finished earlier work (waits join stream times); `torch.cuda._sleep(c)` lasts c / standins.STAND_IN_CYCLES_PER_MS
ms, every other op takes no time. Stand-in events then give `elapsed_time` and `query()` from that timeline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from typing import Any

Clock = dict[str, int]
STAND_IN_HOST_MS = 0.001  # host time per enqueued op in the stand-ins' timeline
STALE_VALUE = "zeros (what a freshly allocated pinned host buffer holds in this replay)"
# The two stream and event kinds the stand-ins model. torch 2.13: `torch.cuda.Stream.wait_event(e)` is `e.wait(self)`
# (torch/cuda/streams.py), a real cudaStreamWaitEvent for either event kind; `torch.Stream.wait_event(e)` is C++
# (torch/csrc/Stream.cpp, THPStream_wait_event: `c10::Stream::unpack3(...).wait(event->event)`) and waits on the base
# c10::Event of `e`. A torch.cuda.Event is `struct THCPEvent : THPEvent { at::cuda::CUDAEvent cuda_event; }`
# (torch/csrc/cuda/Event.h) whose record() fills only `cuda_event`, and c10's InlineEvent::block returns at once when
# the event was never recorded (`if (!was_marked_for_recording_) return;`, c10/core/impl/InlineEvent.h): so
# torch.Stream.wait_event(torch.cuda.Event) waits on nothing. torch.Event(device="cuda") records its c10::Event, on
# either stream kind (`struct THCPStream : THPStream`, torch/csrc/cuda/Stream.h: a torch.cuda.Stream is a torch.Stream).
TORCH_STREAM, CUDA_STREAM, TORCH_EVENT, CUDA_EVENT = "torch.Stream", "torch.cuda.Stream", "torch.Event", "torch.cuda.Event"


def join(a: Clock, b: Clock) -> Clock:
    """Element-wise max of two vector clocks."""
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}


@dataclass
class StreamLog:
    """Every stream operation and modelled buffer access, in host order, with vector clocks."""

    events: list[dict[str, Any]] = field(default_factory=list)
    clocks: dict[str, Clock] = field(default_factory=dict)
    host: Clock = field(default_factory=dict)
    writers: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    stack: list["RecStream"] = field(default_factory=list)
    default: "RecStream | None" = None
    call: str = "(none)"
    call_index: int = -1
    update_index: int = -1
    update_layer: int = -1
    n_streams: int = 0
    host_t: float = 0.0
    ready: dict[str, float] = field(default_factory=dict)

    # --- streams and their clocks ---
    def new_stream(self, how: str, name: str | None = None, api: str = CUDA_STREAM) -> "RecStream":
        """A new recorded stream of kind `api` (the default stream, a torch.cuda.Stream, is named 'default')."""
        self.n_streams += 1
        stream = RecStream(self, name or f"stream {self.n_streams}", api)
        self.clocks[stream.name] = dict(self.host)
        self._note("create", stream.name, detail=how)
        return stream

    def default_stream(self) -> "RecStream":
        if self.default is None:
            self.default = self.new_stream("default stream", "default")
        return self.default

    def current(self) -> "RecStream":
        return self.stack[-1] if self.stack else self.default_stream()

    def _note(self, op: str, stream: str, **fields: Any) -> dict[str, Any]:
        event = {"seq": len(self.events), "call": self.call, "call_index": self.call_index,
                 "update_index": self.update_index, "update_layer": self.update_layer, "op": op, "stream": stream, **fields}
        self.events.append(event)
        return event

    def enqueue(self, stream: "RecStream", op: str, duration_ms: float = 0.0, **fields: Any) -> dict[str, Any]:
        """Work enqueued on `stream`: ticks its clock; the event keeps the clock it ran under and its modelled times."""
        clock = join(self.clocks[stream.name], self.host)
        clock[stream.name] = clock.get(stream.name, 0) + 1
        self.clocks[stream.name] = clock
        start = self._tick(stream.name)
        self.ready[stream.name] = start + duration_ms
        return self._note(op, stream.name, clock=dict(clock), t_start=start, t_end=start + duration_ms, **fields)

    def _tick(self, stream: str) -> float:
        """The host enqueues one op: the modelled time it can start on `stream`."""
        self.host_t += STAND_IN_HOST_MS
        return max(self.host_t, self.ready.get(stream, 0.0))

    def record_stream(self, stream: "RecStream", layer: int, detail: str) -> None:
        """`tensor.record_stream(stream)` entered for a layer's block (no clock changes: it orders only the allocator)."""
        self._note("record_stream", stream.name, layer=layer, detail=detail)

    def wait(self, waiter: "RecStream", clock: Clock, t: float, op: str, detail: str) -> None:
        """Later work on `waiter` waits for the work up to `clock`, done at modelled time `t`."""
        self.clocks[waiter.name] = join(self.clocks[waiter.name], clock)
        self.ready[waiter.name] = max(self.ready.get(waiter.name, 0.0), t)
        self._note(op, waiter.name, detail=detail)

    def wait_stream(self, waiter: "RecStream", waited: "RecStream") -> None:
        """Later work on `waiter` waits for everything enqueued on `waited` so far."""
        self.wait(waiter, self.clocks[waited.name], self.ready.get(waited.name, 0.0), "wait_stream",
                   f"waits for {waited.name}")

    def record_event(self, stream: "RecStream", event: "RecEvent") -> None:
        event.clock = join(self.clocks[stream.name], self.host)
        event.t = self.ready[stream.name] = self._tick(stream.name)
        self._note("record_event", stream.name, detail=f"event {event.ident}")

    def host_wait(self, clock: Clock, what: str, why: str = "", until: float = 0.0) -> None:
        """The host blocks until work up to `clock` (modelled time `until`) is done: everything enqueued later is after it."""
        self.host = join(self.host, clock)
        self.host_t = max(self.host_t, until)
        self._note("host_wait", what, detail=why)

    def synchronize(self, stream: "RecStream | None" = None, why: str = "synchronize") -> None:
        if stream is None:
            everything = reduce(join, self.clocks.values(), {})
            self.host_wait(everything, "all streams", why, max(self.ready.values(), default=0.0))
        else:
            self.host_wait(self.clocks[stream.name], stream.name, why, self.ready.get(stream.name, 0.0))

    @staticmethod
    def ordered(first: dict[str, Any], then: dict[str, Any]) -> bool:
        """Happens-before: `first` is ordered before `then` iff then's clock has seen first's tick."""
        return first["clock"][first["stream"]] <= then["clock"].get(first["stream"], 0)

    # --- buffers, copies and reads ---
    def begin(self, label: str, host_synced: bool = False) -> None:
        """A new forward call; `host_synced`: the host waited for the default stream before it."""
        if host_synced and self.call_index >= 0:
            self.synchronize(self.default_stream(), "the greedy loop copied the previous call's logits to the host (.cpu())")
        self.call, self.call_index = label, self.call_index + 1

    def access(self, op: str, layer: int, reads: str | None, writes: str | None, stream: "RecStream | None" = None,
               **fields: Any) -> dict[str, Any]:
        """Enqueue an op that reads buffer `reads` and writes buffer `writes`; judges the read."""
        stream = stream or self.current()
        event = self.enqueue(stream, op, layer=layer, reads=reads, writes=writes, **fields)
        producer = self.writers.get(reads)  # None for a read of nothing (reads None)
        event["producer_seq"] = producer["seq"] if producer else None
        event["read_ordered"] = None if producer is None else self.ordered(producer, event)
        event["calls_since_producer"] = None if producer is None else event["update_index"] - producer["update_index"]
        if writes:
            self.writers[writes] = event
        return event

    def reads(self) -> list[dict[str, Any]]:
        """Every modelled read that has a producer: call, layer, streams, and whether it is ordered."""
        rows = []
        for e in self.events:
            if e.get("producer_seq") is None:
                continue
            prod = self.events[e["producer_seq"]]
            rows.append({"call": e["call"], "call_index": e["call_index"], "update_index": e["update_index"],
                         "layer": e["layer"], "reader": e["op"], "reads": e["reads"], "reading_stream": e["stream"],
                         "producer": prod["op"], "producing_stream": prod["stream"],
                         "producer_call": prod["call"], "producer_call_index": prod["call_index"],
                         "update_layer": e["update_layer"], "producer_update_layer": prod["update_layer"],
                         "calls_since_producer": e["calls_since_producer"],
                         "ordered": e["read_ordered"], "served_stale": bool(e.get("served_stale"))})
        return rows

    def unordered_reads(self) -> list[dict[str, Any]]:
        return [r for r in self.reads() if not r["ordered"]]


class RecStream:
    """Stand-in for a CUDA stream of kind `api` (torch.Stream or torch.cuda.Stream): a context manager and the
    wait/record/synchronize calls, recorded."""

    device_type = "cuda"

    def __init__(self, log: StreamLog, name: str, api: str = CUDA_STREAM) -> None:
        self.log, self.name, self.api = log, name, api

    def __enter__(self) -> "RecStream":
        self.log.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.log.stack.pop()
        return False

    def wait_stream(self, other: "RecStream") -> None:
        self.log.wait_stream(self, other)

    def wait_event(self, event: "RecEvent") -> None:
        """torch.cuda.Stream: `event.wait(self)`, a real wait; torch.Stream: no wait on a torch.cuda.Event, noted as
        ignored (it waits on the event's unrecorded c10::Event, see CUDA_EVENT above)."""
        if self.api == TORCH_STREAM and event.api == CUDA_EVENT:
            self.log._note("wait_event ignored", self.name, detail=f"{self.api}.wait_event({event.api} {event.ident}): "
                           "waits on the event's unrecorded c10::Event")
        else:
            event.wait(self)

    def record_event(self, event: "RecEvent | None" = None) -> "RecEvent":
        event = event or RecEvent(self.log, api=TORCH_EVENT if self.api == TORCH_STREAM else CUDA_EVENT)
        self.log.record_event(self, event)
        return event

    def synchronize(self) -> None:
        self.log.synchronize(self, f"{self.name}.synchronize()")

    def query(self) -> bool:
        """Whether the modelled stream has finished everything enqueued on it (the stand-ins' timeline)."""
        return self.log.host_t >= self.log.ready.get(self.name, 0.0)


class RecEvent:
    """Stand-in for torch.cuda.Event or torch.Event (`api`): record / wait / synchronize, recorded; `wait(stream)` is
    a real wait for both kinds."""

    def __init__(self, log: StreamLog, *args: Any, api: str = CUDA_EVENT, **kwargs: Any) -> None:
        self.log, self.clock, self.t, self.api = log, {}, 0.0, api
        self.ident = sum(e["op"] == "record_event" for e in log.events) + 1

    def record(self, stream: RecStream | None = None) -> None:
        self.log.record_event(stream or self.log.current(), self)

    def wait(self, stream: RecStream | None = None) -> None:
        self.log.wait(stream or self.log.current(), self.clock, self.t, "wait_event", f"event {self.ident}")

    def synchronize(self) -> None:
        self.log.host_wait(self.clock, f"event {self.ident}", "event.synchronize()", self.t)

    def query(self) -> bool:
        return self.log.host_t >= self.t

    def elapsed_time(self, end: "RecEvent") -> float:
        """Modelled ms from this event to `end` (the stand-ins' timeline, not a measurement)."""
        return end.t - self.t
