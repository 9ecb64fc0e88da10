"""The tiny hybrid's layouts (built by helpers.models.build_tiny_hybrid): a seeded Qwen3.5-style causal LM.

Built from a `Qwen3_5TextConfig` whose `layer_types` interleave Gated-DeltaNet `linear_attention`
layers with `full_attention` layers 3:1, as in the seed's Qwen3.8-27B (48 linear / 16 full of 64).
Nothing is downloaded; the same seed gives the same weights.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from kvresume.compat import text_config

from .models import build_tiny_hybrid


def _layer_types(n_layers: int, linear: bool) -> list[str]:
    """`linear_attention` x3 then `full_attention`, repeated over `n_layers` (or `full_attention` throughout)."""
    return ["linear_attention" if linear and i % 4 < 3 else "full_attention" for i in range(n_layers)]


# Model layouts of notebook 05: name -> the decoder's layer_types (all with the tiny hidden sizes); the tiny hybrid
# has 8 layers, the report's model 64 (48 linear_attention / 16 full_attention, 3 linear then 1 full), each with
# its dense twin.
LAYOUTS = {
    "tiny hybrid": functools.partial(_layer_types, 8, True),
    "tiny dense": functools.partial(_layer_types, 8, False),
    "report layout (64)": functools.partial(_layer_types, 64, True),
    "report dense (64)": functools.partial(_layer_types, 64, False),
}


def build_layout(layout: str, seed: int = 0, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """A seeded `Qwen3_5ForCausalLM` with one of `LAYOUTS` and the tiny sizes, in eval mode."""
    return build_tiny_hybrid(seed, attn_implementation, LAYOUTS[layout]())


def as_built(model: torch.nn.Module) -> bool:
    """Whether every parameter is float32 on the CPU, as `build_layout` leaves it (no `.to()` changed it)."""
    return all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def layout_models(seed: int = 0, built: dict[str, torch.nn.Module] | None = None) -> dict[str, torch.nn.Module]:
    """Every one of `LAYOUTS` (`build_layout(name, seed)`); a model in `built` is taken as it is, not built again."""
    built = built or {}
    return {name: built[name] if name in built else build_layout(name, seed) for name in LAYOUTS}


def layer_types(config: Any) -> list[str]:
    """The decoder's `layer_types` (text config of a multimodal config); `full_attention` everywhere if absent."""
    text = text_config(config)
    types = getattr(text, "layer_types", None)
    return list(types) if types is not None else ["full_attention"] * int(text.num_hidden_layers)
