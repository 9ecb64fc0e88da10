"""Capture what reaches the first real model call, with a forward pre-hook (as the seed did)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from .compat import cache_from_kwargs


def _shape(value: Any) -> list[int] | None:
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def describe_call(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Shapes of input_ids, attention_mask, position_ids and the cache length of one forward call."""
    cache = cache_from_kwargs(kwargs)
    return {
        "input_ids_shape": _shape(kwargs.get("input_ids")),
        "attention_mask_shape": _shape(kwargs.get("attention_mask")),
        "position_ids_shape": _shape(kwargs.get("position_ids")),
        "past_length": int(cache.get_seq_length()) if cache is not None else None,
    }


@contextmanager
def first_call(model: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Yields a list that holds the description of the first forward call made inside the block."""
    captured: list[dict[str, Any]] = []

    def hook(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        if not captured:
            captured.append(describe_call(kwargs))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()
