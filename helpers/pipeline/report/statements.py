"""Source statements, each counted once: claims grouped by the passage they quote (helpers.quotes), so a statement
checked in two notebooks is one statement; one verdict per statement and one verdict line per source."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...quotes import normalized, quote_for, statement_key
from ...results import KINDS
from .sources import kind_of, source_of


@dataclass
class Statement:
    """One quoted statement of a source and the claims (notebook, claim) that test it."""

    source: str
    text: str
    kind: str = "reproduces"
    claims: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The kind's holding verdict (reproduced, refuted) when one claim gave it and none gave the other; the other
        when one claim gave it; else skipped when every claim was skipped, error otherwise."""
        yes, no = KINDS[self.kind]
        verdicts = [c.get("verdict") for _, c in self.claims]
        if no in verdicts:
            return no
        if yes in verdicts:
            return yes
        return "skipped" if verdicts and all(v == "skipped" for v in verdicts) else "error"

    @property
    def reasons(self) -> list[str]:
        """The reasons of the claims that tested it, once each."""
        return list(dict.fromkeys(str(c.get("reason") or "") for _, c in self.claims))


def quote_of(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim's quote as its results file recorded it, else the registry's ({} where neither has one)."""
    return claim.get("quote") or quote_for(str(claim.get("id")))


def source_key(nb: str, claim: dict[str, Any]) -> str:
    """The source a claim answers: its quote's, else its notebook's."""
    quote = quote_of(claim)
    return quote.get("answers") or quote.get("source") or source_of(nb).key


def statements(claims: list[tuple[str, dict[str, Any]]], kind: str = "reproduces") -> list[Statement]:
    """The distinct statements that claims of `kind` test, in first-seen order."""
    found: dict[str, Statement] = {}
    for nb, c in claims:
        if kind_of(c) != kind:
            continue
        key = statement_key({**c, "quote": quote_of(c)})
        text = normalized(quote_of(c).get("text") or "") or f"(no quote registered for {c.get('id')})"
        found.setdefault(key, Statement(source_key(nb, c), text, kind)).claims.append((nb, c))
    return list(found.values())


def tally(stmts: list[Statement]) -> dict[str, int]:
    """{verdict: number of statements}."""
    out: dict[str, int] = {}
    for s in stmts:
        out[s.verdict] = out.get(s.verdict, 0) + 1
    return out


def first_line(text: str, limit: int = 70) -> str:
    """A quote shortened at a word boundary for the first screen, with an ellipsis where cut."""
    text = normalized(text)
    if len(text) <= limit:
        return text
    return text[: text.rfind(" ", 0, limit - 5)].rstrip(",;:") + " [...]"
