"""Generation arguments that read or count the whole input, made to see it on a resumed call.

`resume()` feeds generate() only what the cache lacks, so its `input_ids` are the suffix. Length limits count from
the whole sequence (`max_length`, `min_length`: turned into new-token counts), and a caller's logits processors and
stopping criteria (and `stop_strings`, built as transformers' own `StopStringCriteria`) are handed the whole sequence:
the prompt given, then the tokens generated so far. Settings whose processors generate() builds over its own ids
(`READS_WHOLE`: penalties, n-gram bans, ...) and settings that expand the rows (`num_beams`, `num_return_sequences`:
generate() expands the ids and not the cache) cannot be resumed exactly: `needs_prefill` names them, and `resume()`
re-prefills those calls. `server_kwargs` refuses, by name and before any work, what a chat server passes that a
resume cannot take: its own `cache_position`, `position_ids` not of the whole sequence, a `cache_implementation`
other than the given cache's class, a StaticCache shorter than the conversation and its new tokens.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StaticCache, StoppingCriteriaList, StopStringCriteria

from . import compat
from .call import refuse

# settings (with their neutral value) whose processors generate() builds over its own input ids: the whole sequence
# on a run without a cache, the suffix on a resumed one
READS_WHOLE = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
               "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "exponential_decay_length_penalty": None,
               "forced_bos_token_id": None, "guidance_scale": None, "penalty_alpha": None, "dola_layers": None,
               "watermarking_config": None}
EXPANDS_ROWS = {"num_beams": 1, "num_return_sequences": 1}


def effective_config(model: torch.nn.Module, kwargs: dict[str, Any]) -> GenerationConfig:
    """The generation config generate() would use: the call's (or the model's), the call's keyword fields on top."""
    config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    config.update(**{k: v for k, v in kwargs.items() if hasattr(config, k) and k != "generation_config"})
    return config


def needs_prefill(config: GenerationConfig) -> tuple[str, str] | None:
    """(the setting, why) where a call with this config cannot be resumed exactly: a setting that reads the whole
    input or expands the rows; None where it can."""
    for rules, why in ((READS_WHOLE, "its processor reads the whole input, of which a resumed call feeds the suffix"),
                       (EXPANDS_ROWS, "generate() expands the ids to more rows, and not the cache")):
        for name, neutral in rules.items():
            value = getattr(config, name, neutral)  # pragma: no mutate - a None default skips a missing field alike
            if value is not None and value != neutral:
                return name, f"{name}={value!r}: {why}"
    return None


class _Whole:
    """A processor or criterion called with the whole sequence: the prompt, then the tokens generated so far (the
    `lag`-th call of a processor has seen `calls` new tokens; a criterion runs after its step's token is appended)."""

    def __init__(self, inner: Any, prompt: torch.Tensor, lag: int):
        self.inner, self.prompt, self.lag, self.calls = inner, prompt, lag, 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> Any:
        new = self.calls + self.lag
        self.calls += 1
        tail = input_ids[:, input_ids.shape[1] - new:] if new else input_ids[:, :0]
        whole = torch.cat([self.prompt.to(input_ids.device).expand(input_ids.shape[0], -1), tail], 1)
        return self.inner(whole, scores, **kwargs)


class _WholeProcessor(_Whole):
    """A logits processor seeing the whole sequence (LogitsProcessorList passes exactly two arguments)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().__call__(input_ids, scores)


def counts_whole(config: GenerationConfig, kwargs: dict[str, Any]) -> bool:
    """Whether the call has a length limit counted from the whole sequence, or processors, criteria or stop strings."""
    return bool((config.max_new_tokens is None and config.max_length is not None) or
                (config.min_new_tokens is None and config.min_length) or config.stop_strings or
                kwargs.get("logits_processor") or kwargs.get("stopping_criteria"))


def whole_input_kwargs(model: torch.nn.Module, ids: torch.Tensor, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments for a resume of the whole sequence `ids` (unchanged where nothing counts it):
    the generation config in one object, its length limits in new tokens, the caller's processors and criteria (and
    stop strings) seeing the whole input."""
    config = effective_config(model, kwargs)
    if not counts_whole(config, kwargs):
        return kwargs
    n = int(ids.shape[1])
    if config.max_new_tokens is None and config.max_length is not None:
        config.max_new_tokens, config.max_length = max(int(config.max_length) - n, 0), None
    if config.min_new_tokens is None and config.min_length:
        config.min_new_tokens, config.min_length = max(int(config.min_length) - n, 0), None
    pieces = ("logits_processor", "stopping_criteria")
    out = {k: v for k, v in kwargs.items() if not hasattr(config, k) and k not in pieces}
    criteria = list(kwargs.get("stopping_criteria") or [])
    tokenizer = kwargs.get("tokenizer")
    if config.stop_strings and tokenizer is not None:
        criteria.append(StopStringCriteria(getattr(tokenizer, "tokenizer", tokenizer), config.stop_strings))
        config.stop_strings = None
    processors = list(kwargs.get("logits_processor") or [])
    if processors:
        out["logits_processor"] = LogitsProcessorList(_WholeProcessor(p, ids, 0) for p in processors)
    if criteria:
        out["stopping_criteria"] = StoppingCriteriaList(_Whole(c, ids, 1) for c in criteria)
    out["generation_config"] = config
    return out


# a cache_implementation naming the given cache's own class: what generate() would build is what it was given
SAME_CLASS = {"static": "StaticCache", "dynamic": "DynamicCache"}


def new_tokens(config: GenerationConfig, n: int) -> int:
    """The most tokens generate() appends to an n-token input with this config."""
    if config.max_new_tokens is not None:
        return int(config.max_new_tokens)
    return max(int(config.max_length or 0) - n, 1)


def without(kwargs: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The call's keyword arguments without `names`, also unset on a copy of its generation config."""
    out = {k: v for k, v in kwargs.items() if k not in names}
    config = out.get("generation_config")
    if config is not None and any(getattr(config, k, None) is not None for k in names):
        out["generation_config"] = config = copy.deepcopy(config)
        for k in names:
            setattr(config, k, None)
    return out


def server_kwargs(model: torch.nn.Module, ids: torch.Tensor, cache: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments for a resume of the whole sequence `ids` from `cache`: a cache_implementation of
    the cache's own class dropped; a refusal (ResumeInputError, before any work) for a caller's cache_position, another
    cache_implementation, or a StaticCache shorter than the ids and the new tokens."""
    if kwargs.get("cache_position") is not None:
        raise refuse("cache_position", "resume(): cache_position given: resume() writes the suffix at the slots after "
                     "the cached prefix it keeps, which the caller cannot know (and generate() rejects it where the "
                     "model's forward takes none). Leave it out (the fix drops it)", drop=("cache_position",))
    positions, n = kwargs.get("position_ids"), int(ids.shape[-1])
    if isinstance(positions, torch.Tensor) and positions.shape[-1] != n:
        raise refuse("position_ids", f"resume(): position_ids has {positions.shape[-1]} columns and the ids {n}: "
                     "resume() takes the whole sequence's positions, or none (it counts them on from the cached "
                     "slots). Leave them out (the fix drops them) or pass the whole sequence's", drop=("position_ids",))
    config = effective_config(model, kwargs)
    asked = config.cache_implementation
    if asked is not None and cache is not None:  # (no cache: generate() builds the one asked for)
        if SAME_CLASS.get(asked) != type(cache).__name__:
            raise refuse("cache_implementation", f"resume(): cache_implementation={asked!r} asks generate() to build a "
                         f"cache of its own, beside the given {type(cache).__name__} (generate() refuses both). Leave "
                         "it out (the fix drops it) to resume the given cache, or pass a cache of that class",
                         drop=("cache_implementation",))
        kwargs = without(kwargs, ("cache_implementation",))
    room = compat.static_capacity(cache)
    need = n + new_tokens(config, n)
    if room is not None and room < need:
        raise refuse("static_cache_short", f"resume(): the StaticCache holds max_cache_len={room} tokens, and this call "
                     f"needs {need}: the {n} ids of the conversation + {need - n} new tokens (generate() would write "
                     f"past its end). Pass a StaticCache of max_cache_len >= {need} (the fix's: a new one, re-prefilled)",
                     cache=StaticCache(config=compat.text_config(model.config), max_cache_len=need))
    return kwargs
