"""Tiny seeded models, prompts and one-step helpers for kvresume's tests and the resume contract tests.

Standalone: torch and transformers only. Tiny models are built from configs with seeded random weights, as
transformers' own tests do: Qwen3 (dense, sliding/full interleaved), Llama, Qwen3.5 (hybrid), Qwen3-VL (and a
second chat turn with a new image after its prompt), BART. The tolerance of a comparison is a floor measured on the same model: its full forward under sdpa vs eager, times 4.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

import torch
import transformers
from transformers import DynamicCache, GenerationConfig

from . import compat, images, layers

MARGIN, MIN_FLOOR = 4.0, 1e-5
IMAGE_TOKEN, VISION_START, VISION_END = 2000, 2002, 2003


def _config(cls: type, attn: str, fields: dict[str, Any], override: dict[str, Any]) -> Any:
    """`cls(**fields)` with `override` replacing fields, run under attention implementation `attn`."""
    cfg = cls(**{**fields, **override})
    cfg._attn_implementation = attn
    return cfg


def text_config(kind: str, attn: str = "sdpa", **override: Any) -> Any:
    """Tiny Qwen3 (dense or sliding/full interleaved, window 16) or Qwen3.5 (linear x3 + full) text configs; `override`
    replaces fields (a deeper layout, a longer context)."""
    common = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False)
    if kind == "hybrid":
        return _config(transformers.Qwen3_5TextConfig, attn, dict(
            num_hidden_layers=8, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2, **common), override)
    sliding = kind == "sliding"
    return _config(transformers.Qwen3Config, attn, dict(
        num_hidden_layers=4, use_sliding_window=sliding, sliding_window=16 if sliding else None, max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"] * 2 if sliding else None, **common), override)


def vl_config(attn: str = "sdpa", **override: Any) -> Any:
    """A tiny Qwen3-VL: 4 text layers, a 2-block vision tower, patch 16 (a 224x224 image is 49 tokens); `override`
    replaces top-level fields (a real tokenizer's special token ids)."""
    return _config(transformers.Qwen3VLConfig, attn, dict(
        text_config=dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [8, 4, 4],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0, 1],
                           num_position_embeddings=2304),
        image_token_id=IMAGE_TOKEN, video_token_id=2001, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False), override)


def llama_config(attn: str = "sdpa", **override: Any) -> Any:
    """A tiny Llama: 2 layers."""
    return _config(transformers.LlamaConfig, attn, dict(
        vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096), override)


def bart_config(attn: str = "sdpa") -> Any:
    """A tiny encoder-decoder: BART, 2 + 2 layers."""
    return _config(transformers.BartConfig, attn, dict(
        vocab_size=2048, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=None,
        forced_eos_token_id=None), {})


def build(kind: str, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """A seeded tiny model of `kind` (dense, sliding, hybrid, multimodal, llama, bart, assistant), in eval mode."""
    torch.manual_seed(seed + 1 if kind == "assistant" else seed)
    cls, cfg = {"llama": (transformers.LlamaForCausalLM, llama_config),
                "bart": (transformers.BartForConditionalGeneration, bart_config),
                "multimodal": (transformers.Qwen3VLForConditionalGeneration, vl_config),
                "hybrid": (transformers.Qwen3_5ForCausalLM, functools.partial(text_config, kind))}.get(
        kind, (transformers.Qwen3ForCausalLM, functools.partial(text_config, kind)))
    return cls(cfg(attn)).eval()


@functools.lru_cache(maxsize=None)
def model(kind: str, attn: str = "sdpa") -> torch.nn.Module:
    return build(kind, attn)


cache_kw = compat.cache_kwarg  # the forward keyword of the cache on this release (past_key_values, later cache)


@functools.lru_cache(maxsize=None)
def prompt(kind: str, length: int = 24) -> dict[str, torch.Tensor]:
    """Forward kwargs of the case's prompt: random ids (text), or one 224x224 image's 49 tokens amid text."""
    gen = torch.Generator().manual_seed(1)
    if kind != "multimodal":
        ids = torch.randint(10, 2038, (1, {"bart": 4, "sliding": 40}.get(kind, length)), generator=gen)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ids = torch.cat([torch.randint(10, 1900, (1, 12), generator=gen),
                     torch.tensor([[VISION_START] + [IMAGE_TOKEN] * 49 + [VISION_END]]),
                     torch.randint(10, 1900, (1, 19), generator=gen)], dim=1)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
           "pixel_values": torch.randn(196, 3 * 2 * 16 * 16, generator=gen), "image_grid_thw": torch.tensor([[1, 14, 14]])}
    if compat.accepts(model(kind).forward, "mm_token_type_ids"):
        out["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return out


def _cut(kwargs: dict[str, torch.Tensor], end: int | None) -> dict[str, torch.Tensor]:
    return {k: (v[:, :end] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v) for k, v in kwargs.items()}


@torch.no_grad()
def full_logits(m: torch.nn.Module, p: dict[str, torch.Tensor]) -> torch.Tensor:
    return m(**p).logits[:, -1, :].float()


@torch.no_grad()
def prefix_cache(m: torch.nn.Module, p: dict[str, torch.Tensor]) -> Any:
    return compat.output_cache(m(**_cut(p, -1), use_cache=True))


def config(**fields: Any) -> GenerationConfig:
    """Greedy, one new token, first-step logits returned (fields override)."""
    base = dict(do_sample=False, max_new_tokens=1, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    return GenerationConfig(**{**base, **fields})


@torch.no_grad()
def step(m: torch.nn.Module, inputs: torch.Tensor | None, cache: Any, generate: Callable[..., Any] | None = None,
         fields: dict[str, Any] | None = None, **kwargs: Any) -> torch.Tensor:
    """One greedy step of `generate(m, inputs, ...)` (default: m.generate) from a copy of `cache`; the first-step logits."""
    call = generate or (lambda mm, *a, **k: mm.generate(*a, **k))
    out = call(m, inputs, generation_config=config(**(fields or {})), **{cache_kw(m): copy.deepcopy(cache)}, **kwargs)
    return out.logits[0].float()


@functools.lru_cache(maxsize=None)
def floor(kind: str) -> float:
    """MARGIN x (full forward over the kind's prompt, sdpa vs eager), at least MIN_FLOOR."""
    p = prompt(kind)
    return max(MARGIN * float((full_logits(model(kind), p) - full_logits(model(kind, "eager"), p)).abs().max()), MIN_FLOOR)


def assert_close(got: torch.Tensor, target: torch.Tensor, kind: str) -> None:
    """`got` equals the full computation `target` within the kind's floor."""
    diff = float((got.reshape(target.shape) - target).abs().max())
    assert diff <= floor(kind), f"max |logit diff| {diff:.3g} vs tolerance {floor(kind):.3g}"


def rebuild_update(cache: Any, cfg: Any | None = None) -> DynamicCache:
    """The control's identity rebuild: update() of every layer's K/V into a new DynamicCache (config-aware if given)."""
    new = compat.dynamic_cache(cfg)
    for i, layer in enumerate(cache.layers):
        if isinstance(getattr(layer, "keys", None), torch.Tensor):
            new.update(layer.keys.clone(), layer.values.clone(), i)
            layers.copy_processed_length(layer, new.layers[i])
    return new


def text_positions(m: torch.nn.Module, position: int) -> torch.Tensor:
    """Explicit ids of the suffix at `position` (3-D M-RoPE ids with the model's rope_deltas for Qwen3-VL)."""
    deltas = compat.get_rope_state(m)
    if deltas is None:
        return torch.tensor([[position]])
    return torch.full((3, 1, 1), position) + deltas.view(1, -1, 1)


# --- a second chat turn with a new image (Qwen3-VL), resumed from the first turn's cache -------------------------

@functools.lru_cache(maxsize=None)
def second_turn() -> dict[str, torch.Tensor]:
    """Turn 2 after prompt("multimodal"): 8 text tokens, a new 160x160 image (25 tokens in its block), 14 text tokens."""
    gen = torch.Generator().manual_seed(2)
    ids = torch.cat([torch.randint(10, 1900, (1, 8), generator=gen),
                     torch.tensor([[VISION_START] + [IMAGE_TOKEN] * 25 + [VISION_END]]),
                     torch.randint(10, 1900, (1, 14), generator=gen)], dim=1)
    return {"input_ids": ids, "pixel_values": torch.randn(100, 3 * 2 * 16 * 16, generator=gen),
            "image_grid_thw": torch.tensor([[1, 10, 10]])}


def both_turns(text_only: bool = False) -> dict[str, torch.Tensor]:
    """Forward kwargs of both turns as one sequence with both images (or turn 2 without its image block)."""
    one, two = prompt("multimodal"), second_turn()
    turn2 = two["input_ids"][:, [i for i in range(two["input_ids"].shape[1]) if not 8 <= i < 35]] if text_only \
        else two["input_ids"]
    ids = torch.cat([one["input_ids"], turn2], dim=1)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
           "pixel_values": one["pixel_values"] if text_only else torch.cat([one["pixel_values"], two["pixel_values"]]),
           "image_grid_thw": one["image_grid_thw"] if text_only else torch.cat([one["image_grid_thw"], two["image_grid_thw"]])}
    if "mm_token_type_ids" in one:
        out["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return out


@torch.no_grad()
def first_turn_cache(m: torch.nn.Module) -> Any:
    """The cache of all of turn 1, its rope_deltas left on the model (as a prefill leaves them)."""
    getattr(m, "model", m).rope_deltas = None
    return compat.output_cache(m(**prompt("multimodal"), use_cache=True))


def second_turn_kwargs(m: torch.nn.Module, text_only: bool = False) -> dict[str, torch.Tensor]:
    """generate() kwargs of turn 2 as people pass them: its own ids, its image, the full mask (and its own types)."""
    full, past = both_turns(text_only), prompt("multimodal")["input_ids"].shape[1]
    ids = full["input_ids"][:, past:]
    out = {"input_ids": ids, "attention_mask": full["attention_mask"]}
    if not text_only:
        out.update(pixel_values=second_turn()["pixel_values"], image_grid_thw=second_turn()["image_grid_thw"])
    if "mm_token_type_ids" in full:
        out["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return out


@torch.no_grad()
def second_turn_positions(m: torch.nn.Module) -> torch.Tensor:
    """Turn 2's position ids, 4 rows (the sequence index over t, h, w): the model's get_rope_index over both turns'
    ids and grids, sliced to turn 2."""
    full = both_turns()
    positions, _ = images.rope_index(m, full["input_ids"], full)
    past, n = prompt("multimodal")["input_ids"].shape[1], full["input_ids"].shape[1]
    return torch.cat([torch.arange(past, n).view(1, 1, -1), positions[:, :, past:]])
