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
        if layers.has_linear_state(layer) and not layers.has_kv(layer) and filled > 0:
            states = [v for v in list(layer.conv_states.values()) + list(layer.recurrent_states.values()) if v is not None]
            if not states:
                raise ResumeInputError(f"layer {i} (linear attention) holds no conv/recurrent state while the attention "
                                       f"layers hold {filled} tokens: rebuild it with its states "
                                       f"(kv_cache_from_tensors(..., linear_states={{{i}: ...}}))")


def _check_mask(past: int, widest: int, n: int, mask: torch.Tensor | None) -> int:
    """The cached columns the mask accounts for; raises where generate() would drop or misplace the suffix."""
    if mask is None:
        if n <= past:
            raise ResumeInputError(f"no attention_mask: the cache holds {past} tokens and input_ids {n}; generate() reads "
                                   f"input_ids as the whole sequence and slices off its first {past} tokens, so no token "
                                   f"reaches the model. Pass attention_mask with {past + n} columns (cached + suffix)")
        return past
    m = int(mask.shape[-1])
    if m in (past + n, widest + n):
        return m - n
    if m == n and n > past:
        return past  # the whole sequence passed with its mask: generate() slices the suffix itself
    if m == n:
        raise ResumeInputError(f"attention_mask covers only the suffix ({m} columns) while the cache holds {past} tokens: "
                               f"pass the full mask of {past + n} columns (the cached prefix's mask + the suffix's)")
    raise ResumeInputError(f"attention_mask has {m} columns; a resume from a cache of {past} tokens with {n} new tokens "
                           f"needs {past + n} (cached + suffix)")


def _first_positions(position_ids: torch.Tensor, rope_deltas: torch.Tensor | None) -> torch.Tensor | None:
    """Per row: the text position of the first suffix token (3-D M-RoPE ids less rope_deltas; None: not checkable)."""
    if position_ids.dim() == 3:
        if rope_deltas is None:
            return None
        return position_ids[0, :, 0].long() - rope_deltas.reshape(-1).to(position_ids.device).long()
    return position_ids.reshape(-1, position_ids.shape[-1])[:, 0].long()


def _check_positions(cached: int, n: int, mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                     processed: int, rows: torch.Tensor | None, rope_deltas: torch.Tensor | None) -> None:
    """Explicit positions, or those generate() derives from the mask, start at the processed length: per row where
    `rows` gives each row's processed (unpadded) tokens, else the processed length less the row's padding."""
    prefix = mask[:, :-n] if mask is not None and int(mask.shape[-1]) > n else None
    pads = (prefix == 0).sum(-1).long() if prefix is not None else None
    want = rows if rows is not None else processed - (pads if pads is not None else 0)
    if position_ids is None:
        if mask is None:
            return
        derived = (prefix != 0).sum(-1).long() if prefix is not None else torch.zeros(mask.shape[0], dtype=torch.long)
        if rows is not None and not torch.equal(derived, rows.to(derived.device)):
            raise ResumeInputError(f"the mask marks {derived.tolist()} cached tokens per row but the rows processed "
                                   f"{rows.tolist()}: generate() would attend to and position from the wrong slots; pass the "
                                   f"prefix's own mask (zeros on padding) + the suffix's")
        if rows is None and cached != processed:
            raise ResumeInputError(f"no position_ids: the mask accounts for {cached} cached columns but {processed} "
                                   f"tokens were processed, so generate() places the suffix at position {cached}; "
                                   f"pass position_ids starting at {processed}")
        return
    got = _first_positions(position_ids, rope_deltas)
    if got is None:
        return
    want_t = torch.as_tensor(want, device=got.device).expand_as(got)
    if not torch.equal(got, want_t):
        raise ResumeInputError(f"position_ids start at {got.tolist()} but the suffix follows {processed} processed "
                               f"tokens (expected {want_t.tolist()}): pass positions starting at the processed length")


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
    if past == 0 and widest == 0:
        return
    n = int(input_ids.shape[-1])
    if n == 0:
        raise ResumeInputError("input_ids is empty: pass the unprocessed suffix (at least one token)")
    _check_linear_layers(past_key_values, widest)
    processed_length, rows = _processed(processed_length)
    if processed_length is not None and past > processed_length:
        extra = past - processed_length
        raise ResumeInputError(f"the cache already holds {past} tokens but processed_length is {processed_length}: the first "
                               f"{extra} suffix token(s) are cached already and would be processed twice; pass only the "
                               f"tokens after position {past - 1} (or a cache of the first {processed_length} tokens)")
    cached = _check_mask(past, widest, n, attention_mask)
    _check_positions(cached, n, attention_mask, position_ids, processed_length if processed_length is not None else widest,
                     rows, rope_deltas)


def guarded_generate(model: torch.nn.Module, processed_length: int | torch.Tensor | list[int] | None = None,
                     **kwargs: Any) -> Any:
    """check_resume_inputs on generate()'s own arguments, then `model.generate(**kwargs)` unchanged."""
    cache = compat.cache_from_kwargs(kwargs)
    if cache is not None and kwargs.get("input_ids") is not None:
        check_resume_inputs(cache, kwargs["input_ids"], kwargs.get("attention_mask"), kwargs.get("position_ids"),
                            processed_length, rope_deltas=compat.get_rope_state(model))
    return model.generate(**kwargs)
