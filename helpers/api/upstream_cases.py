"""Generation-equivalence cases for resuming from a KV cache (the resume-contract control's regression list).

Standalone: torch and transformers only. Tiny models are built from configs with seeded random weights, as
transformers' own tests do; every case resumes one greedy step from a prefix cache of ``prompt[:-1]`` with the
unprocessed ``prompt[-1]`` and returns ``(status, detail)``: ``matches`` (within a floor measured on the same
model: the full forward under sdpa vs eager, times 4), ``differs``, or ``raises``.
"""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable

import torch
import transformers
from transformers import DynamicCache, GenerationConfig

MARGIN, MIN_FLOOR = 4.0, 1e-5
IMAGE_TOKEN, VISION_START, VISION_END = 2000, 2002, 2003


def _text_config(kind: str, attn: str) -> Any:
    """Tiny Qwen3 (dense or sliding/full interleaved, window 16) or Qwen3.5 (linear x3 + full) text configs."""
    common = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False)
    if kind == "hybrid":
        cfg = transformers.Qwen3_5TextConfig(num_hidden_layers=8, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                                             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                                             layer_types=["linear_attention"] * 3 + ["full_attention"]
                                             + ["linear_attention"] * 3 + ["full_attention"], **common)
    else:
        sliding = kind == "sliding"
        cfg = transformers.Qwen3Config(num_hidden_layers=4, use_sliding_window=sliding, sliding_window=16 if sliding else None,
                                       max_window_layers=0, layer_types=["sliding_attention", "full_attention"] * 2
                                       if sliding else None, **common)
    cfg._attn_implementation = attn
    return cfg


def _vl_config(attn: str) -> Any:
    """A tiny Qwen3-VL: 4 text layers, a 2-block vision tower, patch 16 (a 224x224 image is 49 tokens)."""
    cfg = transformers.Qwen3VLConfig(
        text_config=dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [8, 4, 4],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0, 1],
                           num_position_embeddings=2304),
        image_token_id=IMAGE_TOKEN, video_token_id=2001, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=False)
    cfg._attn_implementation = attn
    return cfg


def build(kind: str, attn: str = "sdpa") -> torch.nn.Module:
    """A seeded tiny model of `kind` (dense, sliding, hybrid, multimodal), in eval mode."""
    torch.manual_seed(0)
    if kind == "multimodal":
        return transformers.Qwen3VLForConditionalGeneration(_vl_config(attn)).eval()
    if kind == "hybrid":
        return transformers.Qwen3_5ForCausalLM(_text_config(kind, attn)).eval()
    return transformers.Qwen3ForCausalLM(_text_config(kind, attn)).eval()


@functools.lru_cache(maxsize=None)
def model(kind: str, attn: str = "sdpa") -> torch.nn.Module:
    return build(kind, attn)


def _accepts(fn: Any, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def cache_kw(m: torch.nn.Module) -> str:
    """The forward keyword of the cache on this release (past_key_values, later cache)."""
    return "past_key_values" if _accepts(m.forward, "past_key_values") else "cache"


@functools.lru_cache(maxsize=None)
def prompt(kind: str, length: int = 24) -> dict[str, torch.Tensor]:
    """Forward kwargs of the case's prompt: random ids (text), or one 224x224 image's 49 tokens amid text."""
    gen = torch.Generator().manual_seed(1)
    if kind != "multimodal":
        ids = torch.randint(10, 2038, (1, 40 if kind == "sliding" else length), generator=gen)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ids = torch.cat([torch.randint(10, 1900, (1, 12), generator=gen),
                     torch.tensor([[VISION_START] + [IMAGE_TOKEN] * 49 + [VISION_END]]),
                     torch.randint(10, 1900, (1, 19), generator=gen)], dim=1)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
           "pixel_values": torch.randn(196, 3 * 2 * 16 * 16, generator=gen), "image_grid_thw": torch.tensor([[1, 14, 14]])}
    if _accepts(model(kind).forward, "mm_token_type_ids"):
        out["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return out


def _cut(kwargs: dict[str, torch.Tensor], end: int | None) -> dict[str, torch.Tensor]:
    return {k: (v[:, :end] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v) for k, v in kwargs.items()}


@torch.no_grad()
def full_logits(m: torch.nn.Module, p: dict[str, torch.Tensor]) -> torch.Tensor:
    return m(**p).logits[:, -1, :].float()


@torch.no_grad()
def prefix_cache(m: torch.nn.Module, p: dict[str, torch.Tensor]) -> Any:
    out = m(**_cut(p, -1), use_cache=True)
    return getattr(out, "cache", None) or out.past_key_values


@torch.no_grad()
def step(m: torch.nn.Module, suffix: torch.Tensor, cache: Any, **kwargs: Any) -> torch.Tensor:
    """One greedy generate() step from a copy of `cache`; the first-step logits."""
    config = GenerationConfig(do_sample=False, max_new_tokens=1, return_dict_in_generate=True, output_logits=True,
                              pad_token_id=0)
    out = m.generate(input_ids=suffix, generation_config=config, **{cache_kw(m): copy.deepcopy(cache)}, **kwargs)
    return out.logits[0].float()


@functools.lru_cache(maxsize=None)
def _floor(kind: str) -> float:
    p = prompt(kind)
    return max(MARGIN * float((full_logits(model(kind), p) - full_logits(model(kind, "eager"), p)).abs().max()), MIN_FLOOR)


def floor(kind: str, p: dict[str, torch.Tensor] | None = None) -> float:
    """MARGIN x (full forward over the kind's prompt, sdpa vs eager), at least MIN_FLOOR."""
    return _floor(kind)


def judge(call: Callable[[], torch.Tensor], target: torch.Tensor, tol: float) -> tuple[str, str]:
    """matches / differs / raises for `call()` against `target` within `tol`."""
    try:
        got = call()
    except Exception as exc:  # noqa: BLE001 - a raising resume is the measured behaviour
        return "raises", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    diff = float((got.reshape(target.shape) - target).abs().max())
    return ("matches" if diff <= tol else "differs"), f"max |logit diff| {diff:.3g} vs tolerance {tol:.3g}"


def rebuild_update(cache: Any, config: Any | None = None) -> DynamicCache:
    """The control's identity rebuild: update() of every layer's K/V into a new DynamicCache (config-aware if given)."""
    new = DynamicCache(config=config) if config is not None else DynamicCache()
    for i, layer in enumerate(cache.layers):
        if isinstance(getattr(layer, "keys", None), torch.Tensor):
            new.update(layer.keys.clone(), layer.values.clone(), i)
            if hasattr(layer, "cumulative_length") and hasattr(new.layers[i], "cumulative_length"):
                new.layers[i].cumulative_length = layer.cumulative_length
    return new


def text_positions(m: torch.nn.Module, position: int) -> torch.Tensor:
    """Explicit ids of the suffix at `position` (3-D M-RoPE ids with the model's rope_deltas for Qwen3-VL)."""
    deltas = getattr(getattr(m, "model", m), "rope_deltas", None)
    if deltas is None:
        return torch.tensor([[position]])
    return torch.full((3, 1, 1), position) + deltas.view(1, -1, 1)


ARG_SETS = ("neither", "position_only", "mask_only", "both")
