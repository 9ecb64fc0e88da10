"""The families notebook 10 rolls back: seeded tiny models, the cache each starts from, a prompt and its references."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache, StaticCache

from kvresume import compat
from ..compare import NoiseFloor, noise_floor
from ..continuation import other_attention_logits
from ..inputs import Prompt
from ..models import SLIDING_WINDOW, build_tiny_qwen3
from ..families.setup import synthetic_ids

PROMPT = 20  # tokens prefilled before the k tokens that are rolled back (longer than the sliding window, 16)
STATIC_LEN = 48  # the static cache's capacity


def error_line(exc: BaseException) -> str:
    """'Type: first line of the message' (at most 160 characters of it): how a rollback row records a raise."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


@dataclass
class Family:
    """One family: its model, how it makes an empty cache, and what that cache is."""

    name: str
    model: torch.nn.Module
    new_cache: Callable[[], Any]
    what: str


def families(hybrid: torch.nn.Module, seed: int = 0, dense: torch.nn.Module | None = None,
             sliding: torch.nn.Module | None = None) -> dict[str, Family]:
    """dense, sliding, static (the dense model with a StaticCache) and the hybrid given (the notebook's model); the
    dense and sliding models are the seed's tiny Qwen3 defaults unless given (notebook 08's own)."""
    dense = build_tiny_qwen3(seed) if dense is None else dense
    sliding = build_tiny_qwen3(seed, sliding_window=SLIDING_WINDOW) if sliding is None else sliding
    return {
        "dense": Family("dense", dense, lambda: DynamicCache(config=dense.config), "DynamicCache, full attention"),
        "sliding": Family("sliding", sliding, lambda: DynamicCache(config=sliding.config),
                          f"DynamicCache, sliding window {SLIDING_WINDOW} / full attention interleaved"),
        "static": Family("static", dense, lambda: StaticCache(config=dense.config, max_cache_len=STATIC_LEN),
                         f"StaticCache(max_cache_len={STATIC_LEN}), full attention"),
        "hybrid": Family("hybrid", hybrid, lambda: DynamicCache(config=compat.text_config(hybrid.config)),
                         "DynamicCache, linear attention (Gated DeltaNet) and full attention 3:1"),
    }


def token_ids(length: int, model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    """[1, length] deterministic ids inside the model's vocabulary."""
    return synthetic_ids(length, int(compat.text_config(model.config).vocab_size), seed)


@torch.no_grad()
def forward(model: torch.nn.Module, ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
    """All positions' logits of a forward over `ids`, continuing `cache` (updated in place) where given."""
    kwargs = {} if cache is None else {compat.cache_kwarg(model): cache, "use_cache": True}
    return model(input_ids=ids, **kwargs).logits.detach().clone()


def floor_of(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype, new_cache: Callable[[], Any]) -> NoiseFloor:
    """The floor: the full forward's last logits vs a one-token continuation of the cache of ids[:-1] and vs the
    other attention kernel (computations that must agree, this run, model and dtype)."""
    full = forward(model, ids)[:, -1]
    cache = new_cache()
    forward(model, ids[:, :-1], cache)
    stepped = forward(model, ids[:, -1:], cache)[:, -1]
    other, _ = other_attention_logits(model, Prompt(input_ids=ids, attention_mask=torch.ones_like(ids)))
    return noise_floor(full, [stepped, other], dtype, what="full forward vs one cached step and vs the other attention kernel")
