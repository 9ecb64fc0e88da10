"""Generation arguments that read or count the whole input, made to see it on a resumed call.

`resume()` feeds generate() only what the cache lacks, so its `input_ids` are the suffix. Length limits count from
the whole sequence (`max_length`, `min_length`: turned into new-token counts), and a caller's logits processors and
stopping criteria (and `stop_strings`, built as transformers' own `StopStringCriteria`) are handed the whole sequence:
the prompt given, then the tokens generated so far. Processors built from settings (penalties) are not rewritten:
`pool.unpooled` re-prefills those calls.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList, StopStringCriteria


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


def whole_input_kwargs(model: torch.nn.Module, ids: torch.Tensor, kwargs: dict[str, Any],
                       config: GenerationConfig) -> dict[str, Any]:
    """The call's keyword arguments for a resume of the whole sequence `ids`: the generation config in one object,
    its length limits in new tokens, the caller's processors and criteria (and stop strings) seeing the whole input."""
    config = GenerationConfig.from_dict(config.to_dict())
    n = int(ids.shape[1])
    if config.max_new_tokens is None and config.max_length is not None:
        config.max_new_tokens, config.max_length = max(int(config.max_length) - n, 0), None
    if config.min_new_tokens is None and config.min_length:
        config.min_new_tokens, config.min_length = max(int(config.min_length) - n, 0), None
    out = {k: v for k, v in kwargs.items() if not hasattr(config, k) and k not in ("logits_processor", "stopping_criteria")}
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
