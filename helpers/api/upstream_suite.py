"""The cases of the generation-equivalence list, by id (standalone with upstream_cases: torch and transformers only)."""
from __future__ import annotations  # upstream: drop

import copy
from typing import Any, Callable

import torch

from .upstream_cases import (ARG_SETS, build, cache_kw, floor, full_logits, judge, model,  # upstream: drop
                             prefix_cache, prompt, rebuild_update, step, text_positions)  # upstream: drop


def _arg_kwargs(name: str, m: torch.nn.Module, p: dict[str, torch.Tensor]) -> dict[str, Any]:
    mask, pos = {"attention_mask": p["attention_mask"]}, {"position_ids": text_positions(m, p["input_ids"].shape[1] - 1)}
    return {"neither": {}, "position_only": pos, "mask_only": mask, "both": {**mask, **pos}}[name]


def case_arg_set(kind: str, name: str) -> tuple[str, str]:
    """generate() from the prefix cache under one of the control's four argument sets vs the full forward."""
    m, p = model(kind), prompt(kind)
    ref, cache = full_logits(m, p), prefix_cache(m, p)
    return judge(lambda: step(m, p["input_ids"][:, -1:], cache, **_arg_kwargs(name, m, p)), ref, floor(kind, p))


def case_identity_rebuild(kind: str, with_config: bool) -> tuple[str, str]:
    """The identity rebuild (update() into DynamicCache(), or DynamicCache(config=...)) vs the original, full mask."""
    m, p = model(kind), prompt(kind)
    cache = prefix_cache(m, p)
    config = m.config.get_text_config(decoder=True) if with_config else None
    mask = {"attention_mask": p["attention_mask"]}
    original = step(m, p["input_ids"][:, -1:], cache, **mask)
    return judge(lambda: step(m, p["input_ids"][:, -1:], rebuild_update(cache, config), **mask), original, 0.0)


def case_fresh_instance(restore_state: bool) -> tuple[str, str]:
    """The same cache resumed in a fresh Qwen3-VL instance, with or without the model-side rope_deltas."""
    m, p = model("multimodal"), prompt("multimodal")
    cache = prefix_cache(m, p)
    deltas = m.model.rope_deltas.clone()
    mask = {"attention_mask": p["attention_mask"]}
    same = step(m, p["input_ids"][:, -1:], cache, **mask)
    fresh = build("multimodal")
    fresh.model.rope_deltas = deltas.clone() if restore_state else None
    return judge(lambda: step(fresh, p["input_ids"][:, -1:], cache, **mask), same, floor("multimodal", p))


def case_backend(attn: str) -> tuple[str, str]:
    """generate() with the full mask under one attention implementation vs that implementation's full forward."""
    m, p = model("dense", attn), prompt("dense")
    ref, cache = full_logits(m, p), prefix_cache(m, p)
    return judge(lambda: step(m, p["input_ids"][:, -1:], cache, attention_mask=p["attention_mask"]), ref, floor("dense", p))


def _padded() -> tuple[torch.nn.Module, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    m = model("dense")
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(10, 2038, (n,), generator=gen) for n in (12, 20)]
    ids, mask = torch.zeros(2, 20, dtype=torch.long), torch.zeros(2, 20, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 20 - len(r):], mask[i, 20 - len(r):] = r, 1
    return m, rows, ids, mask


@torch.no_grad()
def case_padded(mask_kind: str) -> tuple[str, str]:
    """A left-padded batch resumed with its padded mask (or an all-ones one) vs each row's unpadded full forward."""
    m, rows, ids, mask = _padded()
    ref = torch.cat([m(input_ids=r.view(1, -1)).logits[:, -1, :].float() for r in rows])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = m(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    resume = mask if mask_kind == "padded" else torch.ones_like(mask)
    return judge(lambda: step(m, ids[:, -1:], cache, attention_mask=resume), ref, floor("dense", prompt("dense")))


def case_family(kind: str, rebuilt: str) -> tuple[str, str]:
    """A sliding or hybrid cache resumed as is or rebuilt by update() (the control's loop into DynamicCache(); for
    hybrid, the attention layers into DynamicCache(config=...), linear layers left empty), vs the full forward."""
    m, p = model(kind), prompt(kind)
    ref, cache = full_logits(m, p), prefix_cache(m, p)
    if rebuilt == "update":
        cache = rebuild_update(cache, m.config if kind == "hybrid" else None)
    return judge(lambda: step(m, p["input_ids"][:, -1:], cache, attention_mask=p["attention_mask"]), ref, floor(kind, p))


@torch.no_grad()
def case_layer_variable() -> tuple[str, str]:
    """A layer-variable compressed cache (layer i keeps its last 20 - 4i slots): generate() with the full mask and the
    logical position vs a direct forward of the same cache at the same position (the engine's resume)."""
    m, p = model("dense"), prompt("dense")
    cache = prefix_cache(m, p)
    for i, layer in enumerate(cache.layers):
        keep = 20 - 4 * i
        layer.keys, layer.values = layer.keys[:, :, -keep:].clone(), layer.values[:, :, -keep:].clone()
    physical, logical = int(cache.get_seq_length()), p["input_ids"].shape[1] - 1
    mask, pos = torch.ones(1, physical + 1, dtype=torch.long), torch.tensor([[logical]])
    engine = m(input_ids=p["input_ids"][:, -1:], attention_mask=mask, position_ids=pos, use_cache=True,
               **{cache_kw(m): copy.deepcopy(cache)}).logits[:, -1, :].float()
    return judge(lambda: step(m, p["input_ids"][:, -1:], cache, attention_mask=mask, position_ids=pos), engine,
                 floor("dense", p))


CASES: dict[str, Callable[[], tuple[str, str]]] = {
    **{f"arg_set[{kind}-{name}]": (lambda k=kind, n=name: case_arg_set(k, n))
       for kind in ("dense", "multimodal") for name in ARG_SETS},
    **{f"identity_rebuild[{kind}-{'config' if c else 'plain'}]": (lambda k=kind, c=c: case_identity_rebuild(k, c))
       for kind in ("dense", "multimodal") for c in (False, True)},
    "fresh_instance[rope_deltas_restored]": lambda: case_fresh_instance(True),
    "fresh_instance[no_model_state]": lambda: case_fresh_instance(False),
    "backend[eager]": lambda: case_backend("eager"),
    "backend[sdpa]": lambda: case_backend("sdpa"),
    "padded_batch[padded_mask]": lambda: case_padded("padded"),
    "padded_batch[all_ones_mask]": lambda: case_padded("all_ones"),
    "sliding[original]": lambda: case_family("sliding", "original"),
    "sliding[control_update_rebuild]": lambda: case_family("sliding", "update"),
    "hybrid[original]": lambda: case_family("hybrid", "original"),
    "hybrid[attention_only_rebuild]": lambda: case_family("hybrid", "update"),
    "layer_variable_compressed[generate_vs_engine]": case_layer_variable,
}


def measure_all() -> dict[str, tuple[str, str]]:
    """Every case's (status, detail) on the installed release."""
    return {case: fn() for case, fn in CASES.items()}
