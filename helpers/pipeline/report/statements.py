"""Source statements, each counted once: claims grouped by the passage they quote (helpers.quotes), so a statement
checked in two notebooks is one statement; one verdict per statement and one verdict line per source."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...findings import quote_for
from ...quotes import normalized
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
    def by_construction(self) -> str:
        """What fixes the quoted value whatever the code does ('' unless a claim's quote says so)."""
        return next((quote_of(c)["by_construction"] for _, c in self.claims if quote_of(c).get("by_construction")), "")

    @property
    def cites(self) -> list[str]:
        """The claims whose measurement decides this statement, when every claim testing it cites one ([] else)."""
        cited = [quote_of(c).get("cites") for _, c in self.claims]
        return list(dict.fromkeys(cited)) if cited and all(cited) else []

    @property
    def reasons(self) -> list[str]:
        """The reasons of the claims that tested it, once each."""
        return list(dict.fromkeys(str(c.get("reason") or "") for _, c in self.claims))


def quote_of(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim's quote as its results file recorded it, else the registry's ({} where neither has one)."""
    return claim.get("quote") or quote_for(str(claim.get("id")))


def statement_key(claim: dict[str, Any]) -> str:
    """What makes two claims one statement: their quote's source and text (the claim id where none is quoted)."""
    quote = quote_of(claim)
    text = normalized(quote.get("text") or "")
    return f"{quote.get('source')}: {text}" if text else f"claim: {claim.get('id')}"


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


@dataclass
class Count:
    """A source's statements as the first screen counts them: one measurement decides one statement."""

    tested: list[Statement]  # counted and decided here
    reproduced: list[Statement]  # of `tested`, those reproduced
    not_tested: list[Statement]  # skipped or in error (each with its reasons)
    by_construction: list[Statement]  # a value the set-up fixes: listed apart, never reproduced
    cited: list[Statement]  # decided by another statement's measurement: cited there, not counted again


def count(stmts: list[Statement]) -> Count:
    """Split statements: by construction (where measured: one not run here is not tested, with its reason) and cited
    apart, then tested (reproduced or not) and not tested."""
    built = [s for s in stmts if s.by_construction and s.verdict not in ("skipped", "error")]
    cited = [s for s in stmts if s.cites and s not in built]
    rest = [s for s in stmts if s not in built and s not in cited]
    tested = [s for s in rest if s.verdict not in ("skipped", "error")]
    return Count(tested, [s for s in tested if s.verdict == "reproduced"],
                 [s for s in rest if s.verdict in ("skipped", "error")], built, cited)


def own_checks(claims: list[tuple[str, dict[str, Any]]]) -> tuple[int, int]:
    """(held, decided) over the kit's own checks (kind beyond), claims citing another's measurement left out."""
    own = [c for _, c in claims if kind_of(c) == "beyond" and not quote_of(c).get("cites")
           and c.get("verdict") not in ("skipped", "error")]
    return sum(c.get("verdict") == "holds" for c in own), len(own)


def tally(stmts: list[Statement]) -> dict[str, int]:
    """{verdict: number of statements}."""
    return dict(Counter(s.verdict for s in stmts))
