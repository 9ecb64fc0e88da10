"""Prefill and one-step continuations: generate() and direct forward(), each captured and caught.

Every continuation gets a deep copy of its cache, so variants never contaminate each other, and
failures are returned as data (the matrix *is* which calls fail), not raised. What reaches the first real
model call is captured with forward hooks (as the source did): a `Trace` records the first call's input shapes
(a pre-hook on the model), whether that call finished (a post-hook), so a failure can be placed at the stage
that raised, and the position ids the text rotary embedding received during the first call (a pre-hook on
it): the mechanism checks of notebook 02 are decided from these, never from the error text.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from transformers import GenerationConfig

from kvresume import compat
from .inputs import Prompt

# Where an exception was raised, relative to the first model call.
BEFORE_MODEL_CALL = "before the first model call"
IN_FIRST_CALL = "inside the first model call"
AFTER_FIRST_CALL = "after the first model call returned"


def shape_of(value: Any) -> list[int] | None:
    """A tensor's shape as a list; None for anything else."""
    return list(value.shape) if isinstance(value, torch.Tensor) else None


def as_list(value: torch.Tensor | None) -> list | None:
    """A tensor as one flat plain list (None stays None)."""
    return None if value is None else value.detach().cpu().flatten().tolist()


def describe_call(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Shapes of input_ids, attention_mask, position_ids and the cache length of one forward call."""
    cache = compat.cache_from_kwargs(kwargs)
    return {
        "input_ids_shape": shape_of(kwargs.get("input_ids")),
        "attention_mask_shape": shape_of(kwargs.get("attention_mask")),
        "position_ids_shape": shape_of(kwargs.get("position_ids")),
        "past_length": int(cache.get_seq_length()) if cache is not None else None,
    }


@dataclass
class Trace:
    """The first model call (shapes), whether it finished, and the rotary position shapes seen inside it."""

    first: dict[str, Any] = field(default_factory=dict)
    started: int = 0
    finished: int = 0
    rotary_position_shapes: list[list[int]] = field(default_factory=list)

    def stage(self) -> str:
        """Where an exception raised now sits relative to the first model call."""
        if self.started == 0:
            return BEFORE_MODEL_CALL
        return IN_FIRST_CALL if self.finished == 0 else AFTER_FIRST_CALL


def raised_at(exc: BaseException) -> str:
    """'module.function' of the innermost frame that raised (for the evidence, not for decisions)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    module = last.filename.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{last.name}"


@contextmanager
def trace(model: torch.nn.Module) -> Iterator[Trace]:
    """Yields a Trace filled in by hooks on the model (first call) and on its text rotary embedding."""
    record = Trace()

    def pre(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        if record.started == 0:
            record.first = describe_call(kwargs)
        record.started += 1

    def post(_module: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], _out: Any) -> None:
        record.finished += 1

    def rotary(_module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if record.started == 1 and record.finished == 0:
            positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            record.rotary_position_shapes.append(shape_of(positions))

    with hooked(model, pre, post, rotary):
        yield record


@contextmanager
def hooked(model: torch.nn.Module, pre: Callable, post: Callable, rotary: Callable) -> Iterator[None]:
    """Pre and post hooks on the model and a pre hook on its text rotary embedding, removed on exit."""
    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.register_forward_hook(post, with_kwargs=True)]
    rope = compat.rotary_embedding(model)
    if rope is not None:
        handles.append(rope.register_forward_pre_hook(rotary, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# The source's four generation variants: which of the full mask and explicit positions each passes.
GENERATION_VARIANTS = {"neither": (), "position_only": ("position_ids",), "mask_only": ("attention_mask",),
                       "both": ("attention_mask", "position_ids")}


@dataclass
class Outcome:
    """What one continuation did: its first-step logits, or the error it raised, where, and its first call.

    `stage`: where the error was raised relative to the first model call (BEFORE_MODEL_CALL, IN_FIRST_CALL, ...);
    `rotary_position_shapes`: the position ids the text rotary embedding received during that call.
    """

    ok: bool
    logits: torch.Tensor | None = None
    first_call: dict[str, Any] = field(default_factory=dict)
    error_type: str | None = None
    error: str | None = None
    stage: str | None = None
    raised_at: str | None = None
    rotary_position_shapes: list[list[int]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {"result": "worked" if self.ok else "failed", "error_type": self.error_type or "",
                "error": (self.error or "")[:120], "stage": self.stage or "", **self.first_call,
                "rotary_position_shapes": self.rotary_position_shapes}

    def error_summary(self) -> str:
        """'Type: message (stage, raised in module.function)' for a claim's evidence."""
        return f"{self.error_type}: {self.error} ({self.stage}; raised in {self.raised_at})" if not self.ok else ""


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


def generation_kwargs(variant: str, prompt: Prompt, position_ids: torch.Tensor,
                      mask: torch.Tensor | None = None) -> dict[str, Any]:
    """The keyword arguments of one of GENERATION_VARIANTS (neither, position_only, mask_only, both); `mask`: the full
    mask (the prompt's when not given)."""
    given = {"attention_mask": prompt.attention_mask if mask is None else mask, "position_ids": position_ids}
    return {name: given[name] for name in GENERATION_VARIANTS[variant]}


def _run(model: torch.nn.Module, call: Any) -> Outcome:
    with trace(model) as record:
        try:
            logits = call()
        except Exception as exc:  # noqa: BLE001 - a failing continuation is a measurement
            message = str(exc).splitlines()[0] if str(exc) else ""
            return Outcome(False, None, record.first, type(exc).__name__, message, record.stage(), raised_at(exc),
                           record.rotary_position_shapes)
    return Outcome(True, logits, record.first, rotary_position_shapes=record.rotary_position_shapes)


# Neutral values for every sampling flag: generate() fills flags left at None from the checkpoint's own
# generation_config.json (often do_sample/top_k/top_p/temperature set), which would make a greedy call
# warn about, or depend on, sampling settings it does not use.
NEUTRAL_SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "min_p": None,
                    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}


def greedy_config(model: torch.nn.Module) -> GenerationConfig:
    """An explicit greedy one-step GenerationConfig (no sampling, one beam, first-step logits returned)."""
    base = getattr(model, "generation_config", None)
    special = {k: getattr(base, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    if special["pad_token_id"] is None and special["eos_token_id"] is not None:
        eos = special["eos_token_id"]
        special["pad_token_id"] = eos[0] if isinstance(eos, (list, tuple)) else eos  # greedy: padding is never used
    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=1, return_dict_in_generate=True,
                            output_logits=True, **NEUTRAL_SAMPLING, **special)


@torch.no_grad()
def generate_first_step(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Outcome:
    """`generate()` one greedy step (explicit GenerationConfig, logits returned) from a cache; logits or the error."""

    def call() -> torch.Tensor:
        out = model.generate(input_ids=input_ids, generation_config=greedy_config(model),
                             **{compat.generate_cache_kwarg(model): cache}, **kwargs)
        return compat.generate_logits(out)[0].detach().clone()

    return _run(model, call)


@torch.no_grad()
def forward_step(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Outcome:
    """A direct one-token `forward()` from a cache; last-position logits or the error."""

    def call() -> torch.Tensor:
        out = model(input_ids=input_ids, use_cache=True, **{compat.cache_kwarg(model): cache}, **kwargs)
        return out.logits[:, -1, :].detach().clone()

    return _run(model, call)


OTHER_ATTENTION = {"sdpa": "eager", "eager": "sdpa"}


@contextmanager
def attention_kernel(model: torch.nn.Module, implementation: str | None = None) -> Iterator[str]:
    """The model under `implementation` (None: the other kernel, sdpa <-> eager) inside the block; its own put back."""
    current = getattr(model.config, "_attn_implementation", None) or "sdpa"
    chosen = implementation or OTHER_ATTENTION.get(current, "eager")
    model.set_attn_implementation(chosen)
    try:
        yield chosen
    finally:
        model.set_attn_implementation(current)


@torch.no_grad()
def other_attention_logits(model: torch.nn.Module, prompt: Prompt) -> tuple[torch.Tensor, str]:
    """The full forward's last logits with the other attention kernel (sdpa <-> eager): the same math by a
    different kernel, i.e. this dtype's rounding noise on this model. The model's kernel is put back."""
    with attention_kernel(model) as other:
        logits, _ = prefill(model, prompt, end=None)
    return logits, other
