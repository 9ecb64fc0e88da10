"""Example rebuilds a reporter can copy, edit and hand to notebook 06:

    make run NB=06 ARGS="-p rebuild examples/my_rebuild.py:rebuild"

A rebuild is a function `(cache, model, prompt) -> cache`. It gets a deep copy of the prefix cache
(the already processed tokens: everything but the prompt's last token), the model instance that
prefilled it, and the prompt (`prompt.input_ids`, `prompt.attention_mask`). It may return the cache
alone, or a resume state: a dict {"past_key_values": cache, "processed_length": n} saying how many
tokens have logically passed through the model (the kit then also continues at that logical position).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def _layers(cache):
    """(keys, values) of every layer of a transformers cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def rebuild(cache, model, prompt):
    """Save-and-reload in bfloat16: copy K/V through a half-precision buffer into a new DynamicCache."""
    new = DynamicCache(config=model.config.get_text_config(decoder=True))
    for i, (keys, values) in enumerate(_layers(cache)):
        new.update(keys.to(torch.bfloat16).to(keys.dtype), values.to(torch.bfloat16).to(values.dtype), i)
    return new


def keep_recent(cache, model, prompt, keep: int = 32):
    """Keep the most recent `keep` tokens of every layer and say how many were processed (a resume state)."""
    new = DynamicCache(config=model.config.get_text_config(decoder=True))
    for i, (keys, values) in enumerate(_layers(cache)):
        new.update(keys[..., -keep:, :].clone(), values[..., -keep:, :].clone(), i)
    return {"past_key_values": new, "processed_length": cache.get_seq_length()}


@torch.no_grad()
def probe_then_copy(cache, model, prompt):
    """A compressor that first probes the model with a short text-only generate() (to score tokens), then
    copies the K/V unchanged. The probe runs on the same model instance that will resume."""
    probe = prompt.input_ids[:, :8]
    model.generate(input_ids=probe, attention_mask=torch.ones_like(probe), max_new_tokens=1, do_sample=False)
    new = DynamicCache(config=model.config.get_text_config(decoder=True))
    for i, (keys, values) in enumerate(_layers(cache)):
        new.update(keys.clone(), values.clone(), i)
    return new


def my_rebuild(cache, model, prompt):
    """The example to start from: the bfloat16 save-and-reload of `rebuild`, on the prompt the notebook was given."""
    return rebuild(cache, model, prompt)


def keep_first_last(cache, model, prompt, first: int = 8, last: int = 16):
    """An eviction as a user writes it: keep the first 8 and the last 16 cached tokens of every layer, return the cache."""
    new = DynamicCache()
    for i, (keys, values) in enumerate(_layers(cache)):
        new.update(torch.cat([keys[..., :first, :], keys[..., -last:, :]], dim=-2),
                   torch.cat([values[..., :first, :], values[..., -last:, :]], dim=-2), i)
    return new


def keep_first_last_resume(cache, model, prompt, first: int = 8, last: int = 16):
    """The same eviction returning a resume state: the cache and how many tokens were processed before it."""
    return {"past_key_values": keep_first_last(cache, model, prompt, first, last), "processed_length": cache.get_seq_length()}


def assign_layers(cache, model, prompt):
    """A rebuild as memory and caching projects write it: a config-aware cache whose layers are filled by assigning
    `.keys` and `.values` (no update()). The tensors are the original's, but the layers stay uninitialized
    (`is_initialized` False, so they report length 0): notebook 06 names cache_metadata, and re-registering the
    same K/V through update() restores the full forward."""
    new = DynamicCache(config=model.config.get_text_config(decoder=True))
    for layer, (keys, values) in zip(new.layers, _layers(cache)):
        layer.keys, layer.values = keys.clone(), values.clone()
    return new
