"""The pinned host pool, poisoned before each offloading arm so that a stale read cannot return correct values.

A prefetch that reads a host buffer before its offload copy has landed reads what the pinned block held before. The
offload's `.to("cpu", non_blocking=True)` allocates pinned memory (ATen's `_to_copy`: `pin_out = non_blocking &&
self.is_cuda() && options.device().is_cpu() && ...`), from the caching host allocator, which hands out freed blocks again, and an earlier arm (or a calibration run) that computed the same
K/V may have left the correct values there, so the race would not show. Before each offloading arm,
`poison_pinned_pool` checks out every cached pinned block of the sizes the arm's offloads allocate (allocating until
the pool has to grow: `num_host_alloc` in `torch.cuda.host_memory_stats()`), fills them with POISON and releases them.
POISON is large and finite: the comparisons treat non-finite values as not differing, so NaN would hide the race too.

Under the recording stand-ins, `SimPool` models the pool: per layer, tensor and shape, what the block last held (an
offload fills it when its copy lands); a stale read (helpers.offload.tracking.track's replay) returns that, or zeros
for a block never used. A simulation of the allocator, not a measurement of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvresume import compat
from kvresume.compat import kv_geometry

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


def kv_nbytes(model: torch.nn.Module, ids: torch.Tensor, n_steps: int) -> list[int]:
    """Bytes of one offloaded K or V of `model` at every length the arm offloads (prefill, then one more per step)."""
    heads, head_dim = kv_geometry(compat.text_config(model.config))
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
        n = 0
        while n < (MAX_BLOCKS if counted else FIXED_BLOCKS):
            before = _grown()
            block = torch.empty(max(1, nbytes // elt), dtype=dtype, pin_memory=True)
            block.fill_(value)
            held.append(block)
            n += 1
            if counted and (_grown() or 0) > (before or 0):  # a new block: none of this size was left in the pool
                break
        per_size[nbytes] = n
    blocks = len(held)
    del held
    how = "until torch.cuda.host_memory_stats()['num_host_alloc'] grew" if counted else f"{FIXED_BLOCKS} per size (no host_memory_stats)"
    return {"poisoned": True, "value": value, "blocks": blocks, "per_size_bytes": per_size, "how": how}


def poison_before_arm(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, pool: SimPool | None) -> dict[str, Any]:
    """Poison the pool an offloading arm is about to draw from: the modelled one, the CUDA one, or none (CPU)."""
    if pool is not None:
        return pool.poison()
    if ids.device.type != "cuda":
        return {"poisoned": False, "why": "not CUDA: no pinned pool"}
    return poison_pinned_pool(kv_nbytes(model, ids, n_steps), next(model.parameters()).dtype)
