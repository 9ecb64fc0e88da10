"""A source's counts on the first screen, as clauses with shorter variants (helpers.pipeline.report.fit): the
statements reproduced of those tested, the kit's own checks, "fixed on X" where every check that described the bug
on the first release measured no longer holds on X, what was not tested and why, hypotheses, what is listed apart.
No clause ever cuts a value: a long one has a shorter variant that says less."""
from __future__ import annotations

import re
from typing import Any

from ...results import KINDS
from .asks import Claims, joined
from .fit import Part
from .sources import kind_of
from .statements import count, own_checks, quote_of, statements


def first_sentence(text: str) -> str:
    """The text up to its first '. ', whole."""
    return re.split(r"\. ", " ".join(str(text).split()), maxsplit=1)[0].rstrip(".")


def _bug_checks(claims: Claims) -> dict[str, str]:
    """{claim id: kind} of the source's statements and own checks that hold (the bug as described), citing ones out."""
    return {str(c.get("id")): kind_of(c) for _, c in claims if kind_of(c) in ("reproduces", "beyond")
            and not quote_of(c).get("cites") and c.get("verdict") == KINDS[kind_of(c)][0]}


def fixed_on(by_release: dict[str, Claims]) -> dict[str, int]:
    """{release: n} for each release after the first where every check that held on the first release and is decided
    there gives its kind's other verdict (n of them, at least one): the bug is fixed there as far as measured."""
    releases = list(by_release)
    held = _bug_checks(by_release[releases[0]])
    out = {}
    for rel in releases[1:]:
        there = {str(c.get("id")): c.get("verdict") for _, c in by_release[rel] if str(c.get("id")) in held}
        decided = {cid: v for cid, v in there.items() if v in KINDS[held[cid]]}
        if decided and all(v == KINDS[held[cid]][1] for cid, v in decided.items()):
            out[rel] = len(decided)
    return out


def not_tested_why(stmts: list) -> str:
    """Why statements were not tested here: each reason's first sentence, whole, the shared tail said once."""
    whys: dict[str, list[str]] = {}  # the reason's last clause -> what each statement measured before it, once each
    for s in stmts:
        for r in s.reasons:
            short = "needs CUDA" if "cuda" in r.lower()[:60] else first_sentence(r)
            head, _, tail = short.rpartition(": ")
            got = whys.setdefault(tail, [])
            if head and head not in got:
                got.append(head)
    return "; ".join(f"{'; '.join(heads)}: {tail}" if heads else tail for tail, heads in whys.items()) or \
        "no reason recorded"


def _failing(claims: Claims, most: int = 2) -> str:
    """' (not: `a`, `b`)': the kit's own checks that fail, named where there are at most `most`."""
    ids = [str(c.get("id")) for _, c in claims if kind_of(c) == "beyond" and c.get("verdict") == "fails"]
    return f" (not: {', '.join(f'`{i}`' for i in ids)})" if 0 < len(ids) <= most else ""


def _counted(by_release: dict[str, Claims], fixed: dict[str, int]) -> list[Part]:
    """Statements reproduced of those tested, the own checks, then where the bug is fixed."""
    live = {rel: claims for rel, claims in by_release.items() if rel not in fixed}
    per = {rel: count(statements(claims)) for rel, claims in live.items()}
    stated = {rel: f"{len(c.reproduced)} of {len(c.tested)}" for rel, c in per.items() if c.tested}
    parts: list[Part] = []
    if stated:
        parts.append([f"reproduced {joined(stated)} (statements tested)", f"reproduced {joined(stated)}"])
    own = {rel: "{} of {}".format(*own_checks(claims)) for rel, claims in live.items() if own_checks(claims)[1]}
    named = {rel: text + _failing(live[rel]) for rel, text in own.items()}
    if own:
        parts.append([f"the kit's own checks hold {joined(named)}", f"the kit's own checks hold {joined(own)}"])
    if fixed:
        rels = " and ".join(fixed)
        n = " and ".join(dict.fromkeys(str(v) for v in fixed.values()))
        parts.append([f"fixed on {rels} (all {n} fail there)", f"fixed on {rels}"])
    return parts


def _apart(c: Any, last: Claims) -> tuple[list[str], int]:
    """What is listed apart (by construction: its value, whole, or its claim; cited; simulations) and how many."""
    out = []
    for s in c.by_construction:
        value = s.text.rsplit(": ", 1)[-1]
        out.append(f'"{value}" by construction' if len(value) <= 40 else f"`{s.claims[0][1].get('id')}` by construction")
    if c.cited:
        out.append(f"{len(c.cited)} decided by the same measurement as `{c.cited[0].cites[0]}` (cited, not recounted)")
    sims = [x for _, x in last if kind_of(x) == "simulation"]
    return out + ([f"{len(sims)} simulation(s)"] if sims else []), len(c.by_construction) + len(c.cited) + len(sims)


def count_parts(by_release: dict[str, Claims]) -> list[Part]:
    """The count clauses in the order the screen says them, each with its shorter variants."""
    fixed = fixed_on(by_release)
    last = list(by_release.values())[-1]
    parts = _counted(by_release, fixed)
    c = count(statements(last))
    if c.not_tested:
        n = f"{len(c.not_tested)} not tested here"
        parts.append([f"{n} ({not_tested_why(c.not_tested)})", n])
    for hyp in statements(last, "refutes"):
        word = {"refuted": "refuted", "not_refuted": "not refuted"}.get(hyp.verdict, "not tested")
        decided = next((x for _, x in hyp.claims if x.get("verdict") == hyp.verdict), hyp.claims[0][1])
        said = f"hypothesis `{decided.get('id')}` {word}"
        why = first_sentence(decided.get("reason") or "")
        parts.append([f"{said} ({why})", said] if word != "not tested" and why else [said])
    apart, n = _apart(c, last)
    if apart:
        parts.append([f"apart: {', '.join(apart)}", f"{n} listed apart"])
    return parts


def count_line(by_release: dict[str, Claims]) -> str:
    """Every count clause at its fullest (the notebook pages, which have the room)."""
    return "; ".join(p[0] for p in count_parts(by_release))
