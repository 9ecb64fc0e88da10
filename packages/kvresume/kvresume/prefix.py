"""What of a cache `resume()` reuses, and why the common prefix broke: the record it attaches to its output.

`reusable(led, ids, mask)`: the longest cached prefix that equals the given ids and mask bits (a left-padded row's
padding included) and whose slots were written at increasing positions (`misplaced`: slots at stuck or repeated
positions are re-fed, not reused). `explain` names why the prefix broke, from the decoded text (a tokenizer given):
`tokenizer` (the text is the cached text continued, only split into other tokens at the join), `template` (the chat
template rendered earlier text differently: the differing character is markup or text no message carries verbatim),
`edit` (it lies inside a message's content, which a template renders verbatim: the user changed it); without a
tokenizer: `differs`. A record without a break says `extends` (all cached tokens reused) or `regenerate` (the ids
are a prefix of the cache: re-fed from one token before their end).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import compat, layers
from .ledger import Ledger, ledger_owner

ATTR = "kv_resume_record"


@dataclass
class ResumeRecord:
    """One resume: tokens the cache held, reused, fed; why the reuse stopped where it did (reason + detail)."""

    cached: int
    reused: int
    fed: int
    reason: str
    detail: str = ""


def record_of(obj: Any) -> ResumeRecord | None:
    """The record `resume()` attached to its output (or to the cache it wrote)."""
    return getattr(obj, ATTR, None)


def misplaced(led: Ledger) -> int | None:
    """The first slot (in any row) of attended tokens written at a position not after the previous attended one (a
    cache written at stuck positions); None where every row increases. M-RoPE ledgers are not read (None)."""
    if led.positions.shape[0] != 1 or led.length == 0:
        return None
    real = led.mask != 0
    pos = led.positions[0].masked_fill(~real, -1)  # pragma: no mutate - padding never raises the running maximum
    bad = (real[:, 1:] & (pos[:, 1:] <= pos.cummax(-1).values[:, :-1])).any(0).nonzero()  # pragma: no mutate - 2-D
    return int(bad[0]) + 1 if bad.numel() else None


def reusable(led: Ledger, ids: torch.Tensor, mask: torch.Tensor | None) -> int:
    """How many first cached slots equal the given ids (and mask bits, where a mask is given), at increasing positions."""
    p = led.common_prefix(ids)
    if mask is not None and p:
        differ = (led.mask[:, :p] != mask[:, :p].long().cpu()).any(0).nonzero()
        p = int(differ[0]) if differ.numel() else p
    bad = misplaced(led.first(p))
    return p if bad is None else bad


def start_positions(kept: Ledger) -> torch.Tensor:
    """Per row, the position the next attended token takes: 1 + the last attended slot's position, 0 without one."""
    if kept.length == 0:
        return torch.zeros(kept.batch, dtype=torch.long)
    pos = kept.positions.amax(0).masked_fill(kept.mask == 0, -1)
    return pos.amax(-1) + 1  # pragma: no mutate - 2-D: dim 1 is dim -1


def text_positions(kept: Ledger, suffix_mask: torch.Tensor) -> torch.Tensor:
    """[batch, f] positions of the suffix as a no-cache run gives them: each row's attended tokens count on from the
    kept ones; padding at 1 (generate()'s own fill)."""
    m = suffix_mask.long().cpu()
    ids = start_positions(kept).view(-1, 1) + m.cumsum(-1) - 1  # pragma: no mutate - 2-D: dim 1 is dim -1
    return ids.masked_fill(m == 0, 1)


def explain(cached: torch.Tensor, given: torch.Tensor, p: int, tokenizer: Any = None,
            messages: Sequence[dict[str, Any]] | None = None) -> tuple[str, str]:
    """(reason, detail) of the break at slot p between the cached ids and the given ids (row 0)."""
    if tokenizer is None:
        return "differs", f"the ids differ from the cached ones at token {p} (no tokenizer given to say why)"
    old = tokenizer.decode(cached[0].tolist(), skip_special_tokens=False)
    new = tokenizer.decode(given[0].tolist(), skip_special_tokens=False)
    c = len(os.path.commonprefix([old, new]))
    if c >= len(old) or c >= len(new):
        return "tokenizer", (f"the text is the cached text continued, but the tokenizer split it differently at token {p} "
                             f"(cached {cached[0, p:p + 3].tolist()}, given {given[0, p:p + 3].tolist()}): the join "
                             f"{old[max(c - 20, 0):c]!r} is re-tokenized")
    where = _content_at(new, c, messages, old)
    if where is not None:
        return "edit", f"message {where} was edited: text differs at character {c} ({old[c:c + 20]!r} -> {new[c:c + 20]!r})"
    return "template", (f"the chat template rendered earlier text differently at character {c} ({old[c:c + 20]!r} -> "
                        f"{new[c:c + 20]!r}): not inside any message's verbatim content" if messages is not None else
                        f"earlier text changed at character {c} ({old[c:c + 20]!r} -> {new[c:c + 20]!r}); pass "
                        f"messages= to tell a template change from an edit")


def _content_at(text: str, c: int, messages: Sequence[dict[str, Any]] | None, old: str = "") -> int | None:
    """The index of the message whose content, found verbatim in order in `text`, covers character c (where it starts
    at c and the old text still holds it further on, the template changed what came before it: None)."""
    if messages is None:
        return None
    at = 0  # pragma: no mutate - str.find(x, None) reads from 0 alike
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, str) or not content:
            continue
        found = text.find(content, at)
        if found < 0:
            continue
        if found <= c < found + len(content):
            return None if found == c and old.find(content, c) > c else i
        at = found + len(content)
    return None


def has_crop(cache: Any) -> bool:
    """Whether every layer of the (self-attention) cache has a crop method."""
    return all(hasattr(layer, "crop") for layer in compat.cache_layers(ledger_owner(cache)))


def can_crop(cache: Any) -> bool:
    """Whether every layer of the cache can be cropped now: it has `crop`, and no sliding layer past its window nor
    linear-attention layer lacks the recorded past states a crop needs."""
    if not has_crop(cache):
        return False
    for layer in compat.cache_layers(ledger_owner(cache)):
        window = getattr(layer, "sliding_window", None)
        full_window = isinstance(window, int) and int(layer.get_seq_length()) >= window
        if not getattr(layer, "record_past", True) and (full_window or layers.has_linear_state(layer)):
            return False
    return True
