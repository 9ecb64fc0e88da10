"""One arm of the GPU experiment: a loop (helpers.offload.loops.LOOPS) on a model, with or without offloading, with
one fix edge or none, under the calibrated device lag, its timing events and its state snapshots.

Arms share the device's caching allocator as it is (no `torch.cuda.empty_cache()` between arms); each records the
allocator's counters before and after (`torch.cuda.memory_stats`, and the pinned host allocator's where torch has
`host_memory_stats`). With `simulate=True` the same code runs on CPU under the recording stand-ins
(helpers.offload.standins), optionally serving the race replay's stale reads (`race_lag`) from a modelled pool: a
simulation.

Before an offloading arm the pinned host pool is poisoned, so that a stale read cannot return correct values: a
prefetch that reads a host buffer before its offload copy has landed reads what the pinned block held before. The
offload's `.to("cpu", non_blocking=True)` allocates pinned memory (ATen's `_to_copy`: `pin_out = non_blocking &&
self.is_cuda() && options.device().is_cpu() && ...`), from the caching host allocator, which hands out freed blocks
again, and an earlier arm (or a calibration run) that computed the same K/V may have left the correct values there,
so the race would not show. `poison_pinned_pool` checks out every cached pinned block of the sizes the arm's offloads
allocate (allocating until the pool has to grow: `num_host_alloc` in `torch.cuda.host_memory_stats()`), fills them
with POISON and releases them. POISON is large and finite: the comparisons treat non-finite values as not differing,
so NaN would hide the race too. Under the recording stand-ins, `SimPool` models the pool: per layer, tensor and
shape, what the block last held (an offload fills it when its copy lands); a stale read (the replay of
helpers.offload.tracking.track) returns that, or zeros for a block never used. A simulation of the allocator, not a
measurement of it.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kvresume import compat
from .calibrate import CopyTimes, time_copies, write_order
from .loops import GreedyRun, run_loop
from .ordering import stream_hooks
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
POISON = 1024.0  # exact in bfloat16 and float32; far outside the tiny models' K/V
MAX_BLOCKS = 4096  # per size: a bound on the check-out loop
FIXED_BLOCKS = 64  # per size, where torch has no host_memory_stats to say when the pool grows

BlockKey = tuple[int, str, tuple[int, ...], torch.dtype]


@dataclass
class SimPool:
    """What each modelled pinned block last held, keyed by (layer, 'keys'/'values', shape, dtype)."""

    last: dict[BlockKey, torch.Tensor] = field(default_factory=dict)

    def fill(self, layer: int, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """An offload allocates a block and its copy fills it: returns what the block held before (None: never used)."""
        key = (layer, name, tuple(tensor.shape), tensor.dtype)
        before = self.last.get(key)
        self.last[key] = tensor.detach().clone()
        return before

    def poison(self, value: float = POISON) -> dict[str, Any]:
        """Every modelled block filled with `value`."""
        self.last = {k: torch.full_like(t, value) for k, t in self.last.items()}
        return {"poisoned": True, "value": value, "blocks": len(self.last), "how": "simulated pool (stand-ins)"}


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
    sleep = lambda module, args: torch.cuda._sleep(int(cycles))  # noqa: E731
    with lag_site(model).register_forward_pre_hook(sleep) if cycles > 0 else nullcontext():  # the handle removes it
        yield


def memory_counters(device: torch.device) -> dict[str, Any]:
    """The caching allocators' counters that tell whether arms started from the same state (CUDA only)."""
    if device.type != "cuda":
        return {"device": "not CUDA: no allocator counters"}
    stats = torch.cuda.memory_stats(device)
    out: dict[str, Any] = {k: stats.get(k) for k in MEMORY_KEYS}
    h = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}  # the pinned pool
    out.update({f"host.{k}": h[k] for k in ("allocated_bytes.current", "reserved_bytes.current") if k in h})
    return out


def kv_nbytes(model: torch.nn.Module, ids: torch.Tensor, n_steps: int) -> list[int]:
    """Bytes of one offloaded K or V of `model` at every length the arm offloads (prefill, then one more per step)."""
    heads, head_dim = compat.kv_geometry(compat.text_config(model.config))
    elt = next(model.parameters()).element_size()
    batch, seq = ids.shape[0], ids.shape[1]
    return [batch * heads * (seq + k) * head_dim * elt for k in range(n_steps)]


def _grown() -> int | None:
    stats = getattr(torch.cuda, "host_memory_stats", None)
    value = stats().get("num_host_alloc") if callable(stats) else None
    return None if value is None else int(value)


def poison_pinned_pool(sizes: list[int], dtype: torch.dtype, value: float = POISON) -> dict[str, Any]:
    """Check out the cached pinned blocks of each size (until the pool grows), fill them with `value`, release them."""
    elt = torch.tensor([], dtype=dtype).element_size()
    held: list[torch.Tensor] = []
    per_size: dict[int, int] = {}
    counted = _grown() is not None
    for nbytes in sorted(set(sizes)):
        for n in range(1, (MAX_BLOCKS if counted else FIXED_BLOCKS) + 1):
            before = _grown()
            held.append(torch.empty(max(1, nbytes // elt), dtype=dtype, pin_memory=True).fill_(value))
            if counted and (_grown() or 0) > (before or 0):  # a new block: none of this size was left in the pool
                break
        per_size[nbytes] = n
    how = "until torch.cuda.host_memory_stats()['num_host_alloc'] grew" if counted else f"{FIXED_BLOCKS} per size (no host_memory_stats)"
    return {"poisoned": True, "value": value, "blocks": len(held), "per_size_bytes": per_size, "how": how}


def poison_before_arm(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, pool: SimPool | None) -> dict[str, Any]:
    """Poison the pool an offloading arm is about to draw from: the modelled one, the CUDA one, or none (CPU)."""
    if pool is not None:
        return pool.poison()
    if ids.device.type != "cuda":
        return {"poisoned": False, "why": "not CUDA: no pinned pool"}
    return poison_pinned_pool(kv_nbytes(model, ids, n_steps), next(model.parameters()).dtype)


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
    kw = stream_hooks(loop, log) if log is not None else {}
    logged = kw.get("before_call")

    def before(label: str) -> None:
        if logged is not None:
            logged(label)
        if times is not None:
            times.begin(label)

    def after(label: str, cache: Any) -> None:
        if per_call:
            states.append(snapshot(cache))
            calls.append(label)

    return {**kw, "before_call": before, "after_call": after}


def run_arm(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, loop: str, offloading: bool, cycles: int,
            edge: str | None = None, simulate: bool = False, race_lag: int | None = None, pool: SimPool | None = None,
            poison: bool = True, name: str = "") -> Arm:
    """One arm (`name`: its variant); the report's loop is snapshotted only after its final synchronize (no host wait
    added to it). An offloading arm first poisons the pinned pool it draws from (`pool`: the modelled one under the
    stand-ins)."""
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
        if cache is not None:  # the fix edge outside the timer: its waits precede the copy
            stack.enter_context(EDGES[edge or "none"](cache))
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
    return Arm(name, loop, run, states, calls, timing, order, {"before": before, "after": memory_counters(ids.device)}, stale,
               poisoned)
