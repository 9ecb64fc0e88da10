"""Fitting a line into its allowance by saying less: whole clauses are kept or dropped, a value is never cut.

A line is a list of parts in priority order, each part a list of variants from the fullest to the shortest; a part
whose shortest variant does not fit is left out. Clauses split only at the top level: never inside a code span or
inside parentheses or brackets, so a number, a code span or an aside always stays whole."""
from __future__ import annotations

import re

Part = list[str]  # one clause's variants, the fullest first


def _top_level(text: str) -> list[tuple[int, int]]:
    """(start, depth) per character: depth 0 outside code spans, parentheses and brackets."""
    depth, in_code, out = 0, False, []
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        elif not in_code and ch in "([":
            depth += 1
        elif not in_code and ch in ")]" and depth:
            depth -= 1
        out.append((i, depth + in_code))
    return out


def clauses(text: str, seps: tuple[str, ...] = ("; ",)) -> list[tuple[str, str]]:
    """[(separator before it, clause)] of `text` split at top-level `seps` (the first separator is '')."""
    level = dict(_top_level(text))
    cuts, i = [], 0
    while i < len(text):
        sep = next((s for s in seps if text.startswith(s, i) and level.get(i, 1) == 0), None)
        if sep:
            cuts.append((i, sep))
            i += len(sep)
        else:
            i += 1
    out, start, before = [], 0, ""
    for at, sep in cuts:
        out.append((before, text[start:at]))
        start, before = at + len(sep), sep
    out.append((before, text[start:]))
    return [(s, c) for s, c in out if c]


def _close(text: str, at: int) -> int:
    """The index of the ')' that closes the '(' at `at` (code spans skipped), -1 where none does."""
    depth, in_code = 0, False
    for i in range(at, len(text)):
        ch = text[i]
        if ch == "`":
            in_code = not in_code
        elif not in_code and ch == "(":
            depth += 1
        elif not in_code and ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def drop_asides(text: str) -> str:
    """`text` without its parenthesised asides (' (...)' outside code spans), code spans kept whole."""
    out, i, in_code = [], 0, False
    while i < len(text):
        ch = text[i]
        end = _close(text, i) if ch == "(" and not in_code else -1
        if end > 0:
            while out and out[-1] == " ":
                out.pop()
            i = end + 1
            continue
        in_code = not in_code if ch == "`" else in_code
        out.append(ch)
        i += 1
    return re.sub(r"\s+", " ", "".join(out)).strip()


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
