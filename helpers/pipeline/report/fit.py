"""Fitting a line into its allowance by saying less: whole clauses are kept or dropped, a value is never cut.

A line is a list of parts in priority order, each part a list of variants from the fullest to the shortest; a part
whose shortest variant does not fit is left out. Clauses split only at the top level: never inside a code span or
inside parentheses or brackets, so a number, a code span or an aside always stays whole."""
from __future__ import annotations

import re

Part = list[str]  # one clause's variants, the fullest first


def clauses(text: str, seps: tuple[str, ...] = ("; ",)) -> list[tuple[str, str]]:
    """[(separator before it, clause)] of `text` split at top-level `seps` (the first separator is '')."""
    out, start, before, depth, in_code, i = [], 0, "", 0, False, 0
    while i < len(text):
        sep = None if depth or in_code else next((s for s in seps if text.startswith(s, i)), None)
        if sep:
            out.append((before, text[start:i]))
            start, before, i = i + len(sep), sep, i + len(sep)
            continue
        if text[i] == "`":
            in_code = not in_code
        elif not in_code and text[i] in "([":
            depth += 1
        elif not in_code and text[i] in ")]" and depth:
            depth -= 1
        i += 1
    out.append((before, text[start:]))
    return [(s, c) for s, c in out if c]


def _asides(text: str) -> dict[int, int]:
    """{index of a '(': index of the ')' that closes it}, code spans skipped."""
    open_at, pairs, in_code = [], {}, False
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        elif not in_code and ch == "(":
            open_at.append(i)
        elif not in_code and ch == ")" and open_at:
            pairs[open_at.pop()] = i
    return pairs


def drop_asides(text: str) -> str:
    """`text` without its parenthesised asides (' (...)' outside code spans), code spans kept whole."""
    out, i = "", 0
    for start, end in sorted(_asides(text).items()):
        if start >= i:  # an aside inside a dropped one goes with it
            out, i = (out + text[i:start]).rstrip(" "), end + 1
    return re.sub(r"\s+", " ", out + text[i:]).strip()


def fit(parts: list[Part], limit: int, sep: str = "; ") -> str:
    """The parts joined by `sep`, each its fullest variant that still fits in `limit`; a part none of whose variants
    fits is left out. The first part is always there (its shortest variant where none fits)."""
    chosen: list[str] = []
    for n, variants in enumerate(p for p in parts if p):
        used = len(sep.join(chosen)) + (len(sep) if chosen else 0)
        got = next((v for v in variants if v and used + len(v) <= limit), None)
        if got is None and n == 0:
            got = min(variants, key=len)
        if got:
            chosen.append(got)
    return sep.join(chosen)


def fit_clauses(text: str, limit: int, seps: tuple[str, ...] = ("; ", ". ")) -> str:
    """`text` whole where it fits, else its leading top-level clauses while they fit (the first always): a clause
    is never kept after one that was dropped, so nothing reads as a continuation of what is gone."""
    if len(text) <= limit:
        return text
    out = ""
    for before, clause in clauses(text, seps):
        candidate = out + before + clause if out else clause
        if out and len(candidate) > limit:
            break
        out = candidate
    return out
