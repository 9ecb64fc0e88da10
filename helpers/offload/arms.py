"""One arm of the GPU experiment: a loop (helpers.offload.loops.LOOPS) on a model, with or without offloading, with
one fix edge or none, under the calibrated device lag, its timing events and its state snapshots.

Arms share the device's caching allocator as it is (no `torch.cuda.empty_cache()` between arms); each records the
allocator's counters before and after (`torch.cuda.memory_stats`, and the pinned host allocator's where torch has
`host_memory_stats`). Before an offloading arm the pinned host pool is poisoned (helpers.offload.pool), so that a
stale read cannot return what an earlier arm left. With `simulate=True` the same code runs on CPU under the recording
stand-ins (helpers.offload.standins), optionally serving the race replay's stale reads (`race_lag`) from a modelled
pool: a simulation.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kvresume import compat
from .devicetiming import CopyTimes, time_copies, write_order
from .loops import GreedyRun, run_loop
from .pool import SimPool, poison_before_arm
from .states import State, snapshot
from .standins import recording_streams
from .streams import StreamLog
from .tracking import EDGES, track

BASE, AGAIN, OFF = "offloading=False", "offloading=False (again)", "offloading=True"
OFF_AGAIN = "offloading=True (again)"  # the report's loop only: is the drift exactly reproducible run to run?
UNLAGGED = "offloading=True (unlagged)"  # the report's loop only: no injected device lag (does it drift by itself?)
FIXES = ("5.20.0 edge", "offload event", "record_stream")
MEMORY_KEYS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "allocation.all.allocated",
               "num_alloc_retries")


def variant_name(edge: str | None) -> str:
    """offloading=True, or offloading=True + <fix edge>."""
    return OFF if edge in (None, "none") else f"{OFF} + {edge}"


def lag_site(model: torch.nn.Module) -> torch.nn.Module:
    """Where the lag goes: the first decoder layer. A pre-hook on the top-level model would sleep before the forward's
    own host reads (5.17.0 checks generate()'s all-ones mask inside the forward, before the layers), which drain the
    lag; at the first decoder layer no host read follows it before the first cache update
    (tests/test_offload_gpu_arms.py records the reads)."""
    n = compat.text_config(model.config).num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.endswith("layers") and len(module) == n:
            return module[0]
    raise ValueError(f"{type(model).__name__}: no decoder layer list of {n} layers to put the device lag on")


@contextmanager
def device_lag(model: torch.nn.Module, cycles: int) -> Iterator[None]:
    """`torch.cuda._sleep(cycles)` on the current (default) stream at the start of every forward's first decoder layer."""
    site = lag_site(model) if cycles > 0 else None
    handle = site.register_forward_pre_hook(lambda module, args: torch.cuda._sleep(int(cycles))) if site is not None else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def memory_counters(device: torch.device) -> dict[str, Any]:
    """The caching allocators' counters that tell whether arms started from the same state (CUDA only)."""
    if device.type != "cuda":
        return {"device": "not CUDA: no allocator counters"}
    stats = torch.cuda.memory_stats(device)
    out: dict[str, Any] = {k: stats.get(k) for k in MEMORY_KEYS}
    host = getattr(torch.cuda, "host_memory_stats", None)
    if callable(host):
        h = host()
        out.update({f"host.{k}": h.get(k) for k in ("allocated_bytes.current", "reserved_bytes.current") if k in h})
    return out


@dataclass
class Arm:
    """One run: its logits, its state snapshots (after each call, or the final one), its timing, its counters."""

    name: str
    loop: str
    run: GreedyRun
    states: list[State] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    timing: Any = None
    order: dict[tuple[int, int], int] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    stale_reads: int = 0
    poisoned: dict[str, Any] = field(default_factory=dict)


def _hooks(loop: str, log: StreamLog | None, times: CopyTimes | None, per_call: bool,
           states: list[State], calls: list[str]) -> dict[str, Any]:
    def before(label: str) -> None:
        if log is not None:
            log.begin(label, host_synced=(loop == "cpu"))
        if times is not None:
            times.begin(label)

    def after(label: str, cache: Any) -> None:
        if per_call:
            states.append(snapshot(cache))
            calls.append(label)

    kw: dict[str, Any] = {"before_call": before, "after_call": after}
    if loop == "generate" and log is not None:
        kw["on_host_wait"] = lambda label: log.synchronize(log.default_stream(), "generate()'s stop check read the device")
    return kw


def run_arm(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, loop: str, offloading: bool, cycles: int,
            edge: str | None = None, simulate: bool = False, race_lag: int | None = None, pool: SimPool | None = None,
            poison: bool = True) -> Arm:
    """One arm; the report's loop is snapshotted only after its final synchronize (no host wait added to it). An
    offloading arm first poisons the pinned pool it draws from (`pool`: the modelled one under the stand-ins)."""
    per_call = loop != "report"
    states: list[State] = []
    calls: list[str] = []
    poisoned = poison_before_arm(model, ids, n_steps, pool) if offloading and poison else {"poisoned": False}
    before = memory_counters(ids.device)
    with (recording_streams() if simulate else nullcontext()) as log, ExitStack() as stack:
        cache = compat.dynamic_cache(model.config, offloading=True) if offloading else None
        if cache is not None and log is not None:
            stack.enter_context(track(cache, log, lag=race_lag, pool=pool))
        times = stack.enter_context(time_copies(cache, ids.device)) if cache is not None else None
        if cache is not None and EDGES.get(edge or "none") is not None:  # outside the timer: its waits precede the copy
            stack.enter_context(EDGES[edge](cache))
        stack.enter_context(device_lag(model, cycles))
        run = run_loop(loop, model, ids, n_steps, cache=cache, **_hooks(loop, log, times, per_call, states, calls))
        if not per_call:
            states.append(snapshot(cache if cache is not None else run.cache))
            calls.append("prefill" if n_steps == 1 else f"decode {n_steps - 1}")
        torch.cuda.synchronize()
        timing = times.table() if times is not None else None
        order = write_order(times) if times is not None else {}
        stale = sum(r["served_stale"] for r in log.reads()) if log is not None else 0
    run.cache = None
    name = BASE if not offloading else variant_name(edge)
    return Arm(name, loop, run, states, calls, timing, order, {"before": before, "after": memory_counters(ids.device)}, stale,
               poisoned)
