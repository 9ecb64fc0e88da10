"""NVIDIA's kvpress itself (0.5.5): two of its presses applied the way its README does, `with press(model): model(...)`.

    make run NB=06 ARGS="-p rebuild examples/kvpress_real.py:knorm"

kvpress 0.5.5 declares `transformers<5.3`; the kit installs it with `--no-deps` (Makefile `env`). Its forward
hook reads `kwargs["cache_position"]` on each attention layer to tell a prefill; transformers 5.3 and later no longer
pass it there, so the call passes it itself (the model's `**kwargs` reach the attention layers). Measured running on
5.17.0; from 5.24.0 the layers get the cache as `cache`, not the `past_key_values` its hook reads (KeyError on 5.25.0).
examples/kvpress_presses.py rebuilds the same presses line for line; tests/test_triage_kvpress.py checks that both
give the same cache and the same 06 leaf.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


@torch.no_grad()
def _pressed(press, model, prompt) -> DynamicCache:
    """The prompt's prefix prefilled into a new DynamicCache with the press's forward hooks on."""
    kwargs = prompt.prefix_kwargs()
    cache = DynamicCache(config=model.config)
    positions = torch.arange(kwargs["input_ids"].shape[-1], device=kwargs["input_ids"].device)
    with press(model):
        model(**kwargs, past_key_values=cache, use_cache=True, cache_position=positions)
    return cache


def knorm(cache, model, prompt, compression_ratio: float = 0.5) -> DynamicCache:
    """kvpress.KnormPress: per KV head, the slots with the smallest key norms (kept in score order)."""
    from kvpress import KnormPress

    return _pressed(KnormPress(compression_ratio=compression_ratio), model, prompt)


def streaming_llm(cache, model, prompt, compression_ratio: float = 0.5, n_sink: int = 4) -> DynamicCache:
    """kvpress.StreamingLLMPress: the first n_sink slots and the most recent ones."""
    from kvpress import StreamingLLMPress

    return _pressed(StreamingLLMPress(compression_ratio=compression_ratio, n_sink=n_sink), model, prompt)
