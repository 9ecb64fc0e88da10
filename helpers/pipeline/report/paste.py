"""Markdown that pastes into a GitHub thread without side effects: issue/PR references, @names and URLs
inside code spans (GitHub links them, and posts cross-reference events, only outside code), table cells
that never end in a cut-off word, and no JSON blobs."""
from __future__ import annotations

import json
import re
from typing import Any

CELL_CHARS = 48  # the longest value a table cell shows; anything longer stays in the attached results
GITHUB_LIMIT = 65_536  # characters in one GitHub comment
MAX_CHARS = 60_000  # SUMMARY.md stays this far under GitHub's limit

# A whitespace-delimited token GitHub (or a GFM linkifier) would turn into a link or a mention:
# #123, owner/repo#123, GH-123, @name, user@host, http(s)://..., www....
_LINKY = re.compile(r"#\d|\bGH-\d|@[A-Za-z0-9]|://|^www\.|^\(?www\.", re.IGNORECASE)
_PARTS = re.compile(r"([(\[]*)(.*?)([.,;:!?)\]]*)")  # leading brackets, the body, trailing punctuation


def _wrap_token(token: str) -> str:
    """The token's body in a code span, its leading brackets and trailing punctuation outside, where it would link."""
    lead, body, trail = _PARTS.fullmatch(token).groups()
    return f"{lead}`{body}`{trail}" if body and _LINKY.search(token) and "`" not in token else token


def code_refs(text: Any) -> str:
    """`text` with every issue/PR reference, @name and URL outside code spans put inside one."""
    parts = re.split(r"(`+[^`]*`+)", str(text))  # the odd ones are code spans already
    return "".join(part if i % 2 else re.sub(r"\S+", lambda m: _wrap_token(m.group(0)), part)
                   for i, part in enumerate(parts))


def one_line(text: Any) -> str:
    """Whitespace collapsed to single spaces."""
    return " ".join(str(text).split())


def cell(text: Any) -> str:
    """Text safe for one Markdown table cell: one line, pipes escaped, references in code spans."""
    return code_refs(one_line(text)).replace("|", "\\|")


def code(text: Any) -> str:
    """`text` as one inline code span, safe in a table cell (a backtick inside becomes ', a pipe is escaped)."""
    return "`" + one_line(text).replace("`", "'").replace("|", "\\|") + "`"


def fmt_scalar(value: Any) -> str:
    """A scalar written compactly: 0.0 -> 0, 1.234567e-07 -> 1.23e-07, True -> true."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        text = f"{value:.3g}"
        if float(text) == round(value) != value:  # 0.99973 must not read as 1 (nor 2.0004 as 2)
            text = f"{value:.6g}"
        return text
    return one_line(value)


def fmt_value(value: Any, limit: int = CELL_CHARS) -> str | None:
    """A short, whole rendering of `value` (a scalar, or a list of up to 4 scalars), or None when it would
    not fit in `limit` characters: such a value is named, never cut, and read from the results file."""
    if isinstance(value, (list, tuple)) and len(value) <= 4 and all(not isinstance(v, (list, dict)) for v in value):
        text = "[" + ", ".join(fmt_scalar(v) for v in value) + "]"
    elif isinstance(value, (list, tuple, dict)):
        return None
    else:
        text = fmt_scalar(value)
    return text if len(text) <= limit else None


def pairs(values: Any, limit: int = 4) -> str:
    """`k=v; k=v` for the values that fit whole; the rest are counted as 'in the results file'."""
    if not isinstance(values, dict) or not values:
        return ""
    shown, left = [], 0
    for key, value in values.items():
        text = fmt_value(value)
        if text is None or len(shown) >= limit:
            left += 1
        else:
            shown.append(f"{key}={text}")
    if left:
        shown.append(f"+{left} more in the results file")
    return "; ".join(shown)


# Marks by verdict, for callers that show a verdict without its kind (the release matrix).
VERDICT_MARK = {"reproduced": "✅", "refuted": "✅", "holds": "✅", "not_reproduced": "❌", "not_refuted": "❌",
                "fails": "❌", "skipped": "⏭️", "error": "⚠️"}


def fmt_compact(value: Any, limit: int = 40) -> str:
    """A JSON value written compactly (matrix.md's form): scalars as fmt_scalar, others as compact JSON."""
    if isinstance(value, (bool, int, float)) or value is None:
        return fmt_scalar(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
