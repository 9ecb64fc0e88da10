"""The resume guard's checks, in the order they run: each one independent, each a function of one `ResumeCall`.

A check raises `ResumeInputError` saying what to pass instead, or returns. `CHECKS` is the ordered list the guard
runs; a check that needs the caller's processed length (which generate() is never given) says so, and is skipped
where it is absent, so its catches are counted apart. Where the cache has a token ledger (kvresume.ledger), the
ledger's checks (kvresume.ledger_checks) decide what the shape rules marked `untracked_only` guessed from lengths
(nothing_fed, mask_width, uneven_layers, rope_state, already_cached, positions_at_processed): those run only for untracked caches
(or embeddings, whose ids the ledger cannot compare). A check marked `needs_positions` runs at the text rotary
embedding's first call, where the positions the model rotates with are known. Adding a check is one function (in its own module if it is
long) and one `Check(...)` entry in `CHECKS` (docs/api.md, "Adding a check").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import compat
from . import layers
from .call import ResumeCall, ResumeInputError, refuse
from .ledger import ledger_owner
from .ledger_checks import (ledger_length, ledger_mask, ledger_positions, ledger_processed,
                            ledger_tokens)
from .linear_checks import linear_length, linear_rollback
from .row_checks import ledger_rows, ledger_stale
from .vision import new_vision_tokens


@dataclass(frozen=True)
class Check:
    """One check: its name (shown with each catch), the function, whether it needs the caller's processed length."""

    name: str
    run: Callable[[ResumeCall], None]
    needs_processed_length: bool = False
    untracked_only: bool = False  # a shape rule the ledger decides: run only where the cache has no ledger
    needs_positions: bool = False  # reads the positions the first call rotates with (call.fed_positions)

    def applies(self, call: ResumeCall) -> bool:
        """Whether this check runs on this call (processed length given; no ledger deciding it)."""
        if self.needs_processed_length and call.processed_length is None:
            return False
        return not (self.untracked_only and call.ledger is not None and call.given_ids is not None)


def _ones(call: ResumeCall, columns: int) -> torch.Tensor:
    return torch.ones(call.given_rows, columns, dtype=torch.long)


def empty_input(call: ResumeCall) -> None:
    """No token given at all."""
    if call.n == 0:
        raise ResumeInputError("input_ids is empty: pass the unprocessed suffix (at least one token)")


def linear_state(call: ResumeCall) -> None:
    """A linear-attention layer with no conv/recurrent state beside attention layers that hold tokens."""
    _, widest = call.lengths
    for i, layer in enumerate(compat.cache_layers(ledger_owner(call.cache))):
        if layers.has_linear_state(layer):
            states = [v for v in list(layer.conv_states.values()) + list(layer.recurrent_states.values()) if v is not None]
            if not states:
                raise ResumeInputError(f"layer {i} (linear attention) holds no conv/recurrent state while the attention "
                                       f"layers hold {widest} tokens: rebuild it with its states "
                                       f"(kv_cache_from_tensors(..., linear_states={{{i}: ...}}))")


def nothing_fed(call: ResumeCall) -> None:
    """generate() gave its first model call no token (it sliced the whole input away as cached)."""
    if call.f != 0:
        return
    past, _ = call.lengths
    mask, n = call.mask2d(), call.n
    if mask is None and call.attention_mask is None:
        why = (f"no attention_mask: the cache holds {past} tokens and input_ids {n}; generate() reads input_ids as the "
               f"whole sequence and slices off its first {past} tokens, so no token reaches the model. Pass "
               f"attention_mask with {past + n} columns (cached + suffix)")
    elif mask is not None and int(mask.shape[-1]) == n:
        why = (f"attention_mask covers only the suffix ({n} columns) while the cache holds {past} tokens: pass the "
               f"full mask of {past + n} columns (the cached prefix's mask + the suffix's)")
    else:
        why = (f"generate() feeds the model none of the {n} tokens given beside a cache of {past}: pass the suffix "
               f"with an attention_mask of {past + n} columns (cached + suffix)")
    raise refuse("nothing_fed", why, attention_mask=_ones(call, past + n))


def fed_neither(call: ResumeCall) -> None:
    """generate() fed neither the tokens given (a suffix) nor those a whole sequence leaves uncached."""
    past, widest = call.lengths
    f, n = call.f, call.n
    if f not in (n, n - past, n - widest):
        raise ResumeInputError(f"generate() feeds the model {f} of the {n} tokens given beside a cache of {past}: neither "
                               f"the suffix ({n}) nor what a whole sequence leaves uncached; pass the suffix with an "
                               f"attention_mask of {past + n} columns (cached + suffix)")


def fed_mask_narrow(call: ResumeCall) -> None:
    """generate() gave its first model call a [batch, columns] mask narrower than the one given and than the cache + the
    fed tokens (5.17.0's candidate generation, assistant_model or prompt_lookup_num_tokens, keeps only the given ids'
    columns): the cached slots' columns are missing, so the model attends them wrongly (0.57-0.61 off measured)."""
    mask, given, f = call.fed_mask, call.mask2d(), call.f
    past, _ = call.lengths
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or given is None or call.fed is None or not past:
        return
    if mask.shape[-1] >= min(past + f, int(given.shape[-1])):  # as given, or wide enough: not generate()'s narrowing
        return
    raise refuse("fed_mask_narrow", f"generate() gives its first model call an attention_mask of {mask.shape[-1]} "
                 f"columns beside a cache of {past} tokens and {f} fed token(s) (this release's assisted decoding / "
                 f"prompt lookup (candidate generation) keeps only the given ids' columns), so the cached slots are "
                 f"attended wrongly; pass the whole sequence through kvresume.resume(model, whole_ids, cache), "
                 f"which re-prefills for candidate generation, or generate the whole sequence without the cache",
                 resume=True)


def restart_token(call: ResumeCall) -> None:
    """An encoder-decoder's first fed decoder token is its decoder start token while the decoder cache is filled."""
    ids, past = call.fed_ids, call.lengths[0]
    if call.decoder_start is None or ids is None or ids.shape[-1] == 0 or past == 0:
        return
    if bool((ids[:, 0] == call.decoder_start).all()):
        raise refuse("restart_token", f"generate() feeds all {call.f} decoder_input_ids, the decoder start token "
                     f"first, beside a decoder cache of {past} tokens: pass decoder_attention_mask over the whole "
                     f"sequence ({call.n} columns, so generate() feeds only what is not cached), or only the new "
                     f"tokens",
                     decoder_attention_mask=_ones(call, call.n))


def mask_width(call: ResumeCall) -> None:
    """A [batch, columns] mask covers the cache plus the tokens generate() feeds (its widest layer's, for sliding)."""
    mask = call.mask2d()
    if mask is None:
        return
    past, widest = call.lengths
    m, f = int(mask.shape[-1]), call.f
    if m not in (past + f, widest + f):
        raise refuse("mask_width", f"attention_mask has {m} columns; a resume from a cache of {past} tokens with "
                     f"{call.n} new tokens needs {past + call.n} (cached + suffix)",
                     attention_mask=_ones(call, past + call.n))


def uneven_layers(call: ResumeCall) -> None:
    """Full-attention layers (by class and by the config's layer_types) holding different lengths (a per-layer
    compressed cache) and no positions given."""
    if call.position_ids is not None:
        return
    types = call.layer_types
    held = sorted({layers.layer_length(l) for i, l in enumerate(compat.cache_layers(ledger_owner(call.cache)))
                   if layers.has_kv(l) and not layers.is_sliding(l)
                   and (i >= len(types) or types[i] == "full_attention")} - {None})
    if len(held) > 1:
        past, _ = call.lengths
        raise ResumeInputError(f"the cache's attention layers hold {held} tokens (compressed per layer), so the mask "
                               f"cannot say where the suffix sits and generate() places it at {past}; pass position_ids "
                               f"starting at the processed length")


def rope_state(call: ResumeCall) -> None:
    """An M-RoPE model whose rope_deltas is unset beside a filled cache, and no positions given."""
    if call.keeps_rope_state and call.rope_deltas is None and call.position_ids is None:
        raise ResumeInputError(f"the model keeps rope_deltas but it is None beside a cache of {call.lengths[0]} tokens (a "
                               f"fresh instance?): generate() recomputes multimodal positions from the suffix alone; "
                               f"restore rope_deltas from the prefix's prefill (kvresume.state) or pass position_ids")


def already_cached(call: ResumeCall) -> None:
    """The cache holds more tokens than the caller processed: suffix tokens would be processed twice."""
    past, _ = call.lengths
    if call.processed_length is not None and past > call.processed_length:
        p = call.processed_length
        raise ResumeInputError(f"the cache already holds {past} tokens but processed_length is {p}: the first {past - p} "
                               f"suffix token(s) are cached already and would be processed twice; pass only the tokens "
                               f"after position {past - 1} (or a cache of the first {p} tokens)")


def _first_text_positions(position_ids: torch.Tensor, rope_deltas: torch.Tensor | None) -> torch.Tensor | None:
    """The text position of the first fed token per row: 1-D ids, the text row of 4-row M-RoPE ids, or 3-row ids less
    rope_deltas ([3, batch]); None where 3-row ids come without rope_deltas (not checkable)."""
    first = position_ids[..., 0].long()
    if position_ids.dim() == 3 and position_ids.shape[0] == 4:
        return first[0]
    if position_ids.dim() == 3:
        if rope_deltas is None:
            return None
        return first - rope_deltas.reshape(1, -1).to(first.device).long()  # pragma: no mutate (CPU: one device)
    return first.reshape(-1)


def positions_at_processed(call: ResumeCall) -> None:
    """Explicit positions, or those generate() derives from the mask, start at the processed length: per row where the
    caller gave each row's processed (unpadded) count, else the processed length less the row's padding."""
    if call.processed_length is None:
        return
    mask, f, processed, rows = call.mask2d(), max(call.f, 1), call.processed_length, call.rows
    prefix = None if mask is None else mask[:, :-f]
    if call.position_ids is None:
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
    got = _first_text_positions(call.position_ids[..., -f:], call.rope_deltas)
    if got is None:
        return
    pads = 0 if prefix is None else (prefix == 0).sum(-1).long()  # pragma: no mutate (2-D: dim -1 and 1 are one axis)
    want = torch.as_tensor(rows if rows is not None else processed - pads).expand_as(got)
    if not torch.equal(got, want):
        raise ResumeInputError(f"position_ids start at {got.tolist()} but the suffix follows {processed} processed "
                               f"tokens (expected {want.tolist()}): pass positions starting at the processed length")


CHECKS: list[Check] = [
    Check("empty_input", empty_input),
    Check("ledger_rows", ledger_rows),
    Check("ledger_stale", ledger_stale),
    Check("ledger_tokens", ledger_tokens),
    Check("ledger_length", ledger_length),
    Check("linear_state", linear_state),
    Check("linear_length", linear_length),
    Check("linear_rollback", linear_rollback),
    Check("nothing_fed", nothing_fed, untracked_only=True),
    Check("fed_neither", fed_neither),
    Check("restart_token", restart_token),
    Check("ledger_mask", ledger_mask),
    Check("mask_width", mask_width, untracked_only=True),
    Check("uneven_layers", uneven_layers, untracked_only=True),
    Check("rope_state", rope_state, untracked_only=True),
    Check("new_vision_tokens", new_vision_tokens),
    Check("already_cached", already_cached, needs_processed_length=True, untracked_only=True),
    Check("positions_at_processed", positions_at_processed, needs_processed_length=True, untracked_only=True),
    Check("fed_mask_narrow", fed_mask_narrow),
    Check("ledger_positions", ledger_positions, needs_positions=True),
    Check("ledger_processed", ledger_processed, needs_processed_length=True),
]
