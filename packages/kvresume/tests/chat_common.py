"""Shared helpers of the test_chat* files: tracked caches, the no-cache greedy reference, the comparison."""
from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from kvresume import testing as T, track
from kvresume.compat import generate_cache_kwarg, text_config
from kvresume import resume_report as record_of

NEW = 3  # new tokens per greedy run


def tracked(kind: str) -> torch.nn.Module:
    m = T.build(kind)
    track(m)
    return m


@torch.no_grad()
def prefill(m: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None, static: bool = False,
            **kwargs: Any) -> Any:
    """A tracked cache written by one forward over ids (a StaticCache where asked)."""
    cache = StaticCache(config=text_config(m.config), max_cache_len=96) if static else DynamicCache(config=m.config)
    mask = torch.ones_like(ids) if mask is None else mask
    m(input_ids=ids, attention_mask=mask, **{T.cache_kw(m): cache}, use_cache=True, **kwargs)
    return cache


@torch.no_grad()
def reference(m: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """The no-cache greedy run over the whole sequence."""
    mask = torch.ones_like(ids) if mask is None else mask
    return m.generate(ids, attention_mask=mask, generation_config=T.config(max_new_tokens=NEW), **kwargs)


def assert_same(out: Any, ref: Any, kind: str) -> float:
    """Greedy tokens equal, the last logits within the kind's floor; returns the max logit diff."""
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:]), (out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    diff = float((out.logits[-1] - ref.logits[-1]).abs().max())
    assert diff <= T.floor(kind), f"max |logit diff| {diff:.3g} vs floor {T.floor(kind):.3g}"
    return diff


def cfg() -> Any:
    return T.config(max_new_tokens=NEW)


def record(out: Any) -> Any:
    rec = record_of(out)
    assert rec is not None
    return rec


def cache_kw(m: torch.nn.Module) -> str:
    return generate_cache_kwarg(m)
