"""Prefill and one-step continuations: generate() and direct forward(), each captured and caught.

Every continuation gets a deep copy of its cache, so variants never contaminate each other, and
failures are returned as data (the matrix *is* which calls fail), not raised.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import compat
from .capture import first_call
from .inputs import Prompt

GENERATION_VARIANTS = ("neither", "position_only", "mask_only", "both")


@dataclass
class Outcome:
    """What one continuation did: its first-step logits, or the error it raised, and its first call."""

    ok: bool
    logits: torch.Tensor | None = None
    first_call: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        return {"result": "worked" if self.ok else "failed", "error_type": self.error_type or "",
                "error": (self.error or "")[:120], **self.first_call}


@torch.no_grad()
def prefill(model: torch.nn.Module, prompt: Prompt, end: int | None = -1) -> tuple[torch.Tensor, Any]:
    """Forward over input_ids[:, :end] with a fresh cache; returns (last logits, cache). end=None: whole prompt."""
    out = model(**prompt.forward_kwargs(end), use_cache=True)
    return out.logits[:, -1, :].detach().clone(), compat.output_cache(out)


def current_position_ids(model: torch.nn.Module, prompt: Prompt) -> torch.Tensor:
    """Explicit position ids of the last (unprocessed) token: 3-D M-RoPE ids for Qwen3-VL, 1-D otherwise."""
    position = prompt.length - 1
    delta = compat.get_rope_state(model) if prompt.is_multimodal else None
    if delta is None:
        return torch.tensor([[position]], device=prompt.input_ids.device)
    return (torch.full((3, 1, 1), position, device=prompt.input_ids.device) + delta.view(1, -1, 1).to(prompt.input_ids.device))


def generation_kwargs(variant: str, prompt: Prompt, position_ids: torch.Tensor) -> dict[str, Any]:
    """The seed's four generation variants: neither, position_only, mask_only, both."""
    table = {
        "neither": {},
        "position_only": {"position_ids": position_ids},
        "mask_only": {"attention_mask": prompt.attention_mask},
        "both": {"attention_mask": prompt.attention_mask, "position_ids": position_ids},
    }
    return dict(table[variant])


def _run(model: torch.nn.Module, call: Any) -> Outcome:
    with first_call(model) as captured:
        try:
            logits = call()
        except Exception as exc:  # noqa: BLE001 - a failing continuation is a measurement
            return Outcome(False, None, captured[0] if captured else {}, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return Outcome(True, logits, captured[0] if captured else {})


@torch.no_grad()
def generate_first_step(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Outcome:
    """`generate(max_new_tokens=1, greedy, output_logits=True)` from a cache; first-step logits or the error."""

    def call() -> torch.Tensor:
        out = model.generate(input_ids=input_ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True,
                             output_logits=True, **{compat.generate_cache_kwarg(model): cache}, **kwargs)
        return compat.generate_logits(out)[0].detach().clone()

    return _run(model, call)


@torch.no_grad()
def forward_step(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Outcome:
    """A direct one-token `forward()` from a cache; last-position logits or the error."""

    def call() -> torch.Tensor:
        out = model(input_ids=input_ids, use_cache=True, **{compat.cache_kwarg(model): cache}, **kwargs)
        return out.logits[:, -1, :].detach().clone()

    return _run(model, call)
