"""The resume guard: the control's "validation in generate()", as a check before an unchanged `generate()`.

`check_resume_inputs` raises `ResumeInputError` saying what to pass instead for the resume inputs the kit has
seen go silently wrong (or fail deep inside the first model call): a mask over the suffix only, no mask where
`generate()` slices the suffix away, a suffix token already in the cache (given the processed length), positions
(explicit or mask-derived) that disagree with the processed length, and a hybrid cache whose linear-attention
layers hold no state beside filled attention layers. `guarded_generate` calls it, then `model.generate(**kwargs)`
unchanged. Nothing of transformers is patched.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import compat
from ..regress import layers


class ResumeInputError(ValueError):
    """Resume inputs that generate() would take silently or fail on deep inside; the message says what to pass."""


def cache_lengths(cache: Any) -> tuple[int, int]:
    """(what `get_seq_length()` reports, the largest length any attention layer reports)."""
    reported = int(cache.get_seq_length())
    per_layer = [n for n in layers.lengths(cache) if n is not None]
    return reported, max(per_layer + [reported])


def _check_linear_layers(cache: Any, filled: int) -> None:
    """A linear-attention layer with no conv/recurrent state beside attention layers that hold tokens."""
    for i, layer in enumerate(compat.cache_layers(cache)):
        if layers.has_linear_state(layer):
            states = [v for v in list(layer.conv_states.values()) + list(layer.recurrent_states.values()) if v is not None]
            if not states:
                raise ResumeInputError(f"layer {i} (linear attention) holds no conv/recurrent state while the attention "
                                       f"layers hold {filled} tokens: rebuild it with its states "
                                       f"(kv_cache_from_tensors(..., linear_states={{{i}: ...}}))")


def _suffix_length(past: int, widest: int, n: int, mask: torch.Tensor | None) -> int:
    """How many tokens of input_ids generate() will feed; raises where it would drop or misplace them.

    input_ids is the suffix (with a mask over cached + suffix), or the whole sequence (no mask, or a mask of its own
    length): then generate() slices off the first `past` tokens itself."""
    if mask is None:
        if n <= past:
            raise ResumeInputError(f"no attention_mask: the cache holds {past} tokens and input_ids {n}; generate() reads "
                                   f"input_ids as the whole sequence and slices off its first {past} tokens, so no token "
                                   f"reaches the model. Pass attention_mask with {past + n} columns (cached + suffix)")
        return n - past
    m = int(mask.shape[-1])
    if m in (past + n, widest + n):
        return n
    if m == n and n > past:
        return n - past
    if m == n:
        raise ResumeInputError(f"attention_mask covers only the suffix ({m} columns) while the cache holds {past} tokens: "
                               f"pass the full mask of {past + n} columns (the cached prefix's mask + the suffix's)")
    raise ResumeInputError(f"attention_mask has {m} columns; a resume from a cache of {past} tokens with {n} new tokens "
                           f"needs {past + n} (cached + suffix)")


def _first_positions(position_ids: torch.Tensor, rope_deltas: torch.Tensor | None) -> torch.Tensor | None:
    """The text position of the first fed token: [batch] (1-D ids), [3, batch] (M-RoPE ids less rope_deltas), or None
    where M-RoPE ids come without rope_deltas (not checkable)."""
    first = position_ids[..., 0].long()
    if position_ids.dim() == 3:
        if rope_deltas is None:
            return None
        return first - rope_deltas.reshape(1, -1).to(first.device).long()  # pragma: no mutate (CPU: one device)
    return first.reshape(-1)


def _check_positions(n: int, mask: torch.Tensor | None, position_ids: torch.Tensor | None, processed: int,
                     rows: torch.Tensor | None, rope_deltas: torch.Tensor | None) -> None:
    """Explicit positions, or those generate() derives from the mask, start at the processed length: per row where
    `rows` gives each row's processed (unpadded) tokens, else the processed length less the row's padding."""
    prefix = None if mask is None else mask[:, :-n]
    if position_ids is None:
        if prefix is None:
            return
        derived = (prefix != 0).sum(-1).long()  # pragma: no mutate (2-D: dim -1 and 1 are one axis)
        if rows is not None and not torch.equal(derived, rows):
            raise ResumeInputError(f"the mask marks {derived.tolist()} cached tokens per row but the rows processed "
                                   f"{rows.tolist()}: generate() would attend to and position from the wrong slots; pass the "
                                   f"prefix's own mask (zeros on padding) + the suffix's")
        if rows is None and int(prefix.shape[-1]) != processed:
            raise ResumeInputError(f"no position_ids: the mask accounts for {prefix.shape[-1]} cached columns but "
                                   f"{processed} tokens were processed, so generate() places the suffix at position "
                                   f"{prefix.shape[-1]}; pass position_ids starting at {processed}")
        return
    got = _first_positions(position_ids[..., -n:], rope_deltas)
    if got is None:
        return
    pads = 0 if prefix is None else (prefix == 0).sum(-1).long()  # pragma: no mutate (2-D: dim -1 and 1 are one axis)
    want = torch.as_tensor(rows if rows is not None else processed - pads).expand_as(got)
    if not torch.equal(got, want):
        raise ResumeInputError(f"position_ids start at {got.tolist()} but the suffix follows {processed} processed "
                               f"tokens (expected {want.tolist()}): pass positions starting at the processed length")


def _processed(processed_length: int | torch.Tensor | list[int] | None) -> tuple[int | None, torch.Tensor | None]:
    """(the processed length, per-row processed tokens or None): a batch's rows may give one count each."""
    if processed_length is None or isinstance(processed_length, int):
        return processed_length, None
    rows = torch.as_tensor(processed_length, dtype=torch.long).reshape(-1)
    return int(rows.max()), rows


def check_resume_inputs(past_key_values: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        position_ids: torch.Tensor | None = None, processed_length: int | torch.Tensor | list[int] | None = None,
                        *, rope_deltas: torch.Tensor | None = None) -> None:
    """Raise ResumeInputError (what to pass instead) for resume inputs that generate() would mishandle silently.

    `processed_length`: tokens before the suffix (one int), or per row of a left-padded batch its unpadded count."""
    if past_key_values is None:
        return
    past, widest = cache_lengths(past_key_values)
    if widest == 0:
        return
    n = int(input_ids.shape[-1])
    if n == 0:
        raise ResumeInputError("input_ids is empty: pass the unprocessed suffix (at least one token)")
    _check_linear_layers(past_key_values, widest)
    processed_length, rows = _processed(processed_length)
    if processed_length is not None and past > processed_length:
        raise ResumeInputError(f"the cache already holds {past} tokens but processed_length is {processed_length}: the first "
                               f"{past - processed_length} suffix token(s) are cached already and would be processed "
                               f"twice; pass only the tokens after position {past - 1} (or a cache of the first "
                               f"{processed_length} tokens)")
    fed = _suffix_length(past, widest, n, attention_mask)
    _check_positions(fed, attention_mask, position_ids, processed_length if processed_length is not None else widest,
                     rows, rope_deltas)


def guarded_generate(model: torch.nn.Module, processed_length: int | torch.Tensor | list[int] | None = None,
                     **kwargs: Any) -> Any:
    """check_resume_inputs on generate()'s own arguments, then `model.generate(**kwargs)` unchanged."""
    cache = compat.cache_from_kwargs(kwargs)
    if cache is not None and kwargs.get("input_ids") is not None:
        check_resume_inputs(cache, kwargs["input_ids"], kwargs.get("attention_mask"), kwargs.get("position_ids"),
                            processed_length, rope_deltas=compat.get_rope_state(model))
    return model.generate(**kwargs)
