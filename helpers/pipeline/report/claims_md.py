"""The claims of one run as Markdown: counts per kind, one section per source (two opening lines, the
source's setup beside this run's, the rows, notes, undecided claims with whole reasons, statements)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from ...results import KINDS
from .paste import cell, code, code_refs, fmt_scalar, one_line, pairs
from ...findings import sources
from .sources import Source, kind_of, setup_rows, source_of
from .statements import Statement, quote_of, tally
from .verdict_line import count_line

MARK = {"skipped": "⏭️", "error": "⚠️"}
KIND_TEXT = {"reproduces": "the source states it", "refutes": "a hypothesis the source puts forward, tested",
             "beyond": "a control the source proposed but did not run, or the kit's own",
             "simulation": "a model of the hardware or a race, run here", "environment": "a fact about this machine"}


def mark(kind: str, verdict: str) -> str:
    """✅ for a kind's holding verdict, ❌ for its other one, ⏭️ skipped, ⚠️ error or a verdict foreign to the kind."""
    pair = KINDS.get(kind)
    if pair and verdict == pair[0]:
        return "✅"
    if pair and verdict == pair[1]:
        return "❌"
    return MARK.get(verdict, "⚠️")


def all_claims(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(r["notebook"], c) for r in results for c in (r.get("claims") or []) if isinstance(c, dict)]


def kind_counts(claims: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """{kind: {verdict: n}}; a verdict not of its kind is counted under 'other'."""
    counts: dict[str, dict[str, int]] = {}
    for _, c in claims:
        kind, verdict = kind_of(c), c.get("verdict", "error")
        key = verdict if verdict in KINDS.get(kind, ()) + ("skipped", "error") else "other"
        counts.setdefault(kind, Counter())[key] += 1
    return counts


def reproduced_count(counts: dict[str, dict[str, int]]) -> int:
    """Only claims of kind `reproduces` with verdict `reproduced` count as reproduced."""
    return counts.get("reproduces", {}).get("reproduced", 0)


def counts_table(counts: dict[str, dict[str, int]]) -> list[str]:
    """Per kind: holding verdict, other verdict, skipped, error (and verdicts foreign to the kind)."""
    lines = ["| kind | what it is | holds | does not hold | skipped | error |", "|---|---|---|---|---|---|"]
    for kind in list(KINDS) + sorted(set(counts) - set(KINDS)):
        got = counts.get(kind, {})
        if not got and kind != "reproduces":
            continue
        yes, no = KINDS.get(kind, ("?", "?"))
        other = f" + {got['other']} with a verdict foreign to the kind" if got.get("other") else ""
        lines.append(f"| {cell(kind)} | {cell(KIND_TEXT.get(kind, 'unknown kind'))} | {got.get(yes, 0)} {yes} "
                     f"| {got.get(no, 0)} {no} | {got.get('skipped', 0)} | {got.get('error', 0)}{other} |")
    return lines


def headline(counts: dict[str, dict[str, int]], n_notebooks: int, stmts: list[Statement] | None = None) -> str:
    """N of M source statements reproduced: M distinct quoted statements (a statement two notebooks check counts
    once), N of them reproduced; without `stmts`, each `reproduces` claim is its own statement."""
    total = sum(sum(v.values()) for v in counts.values())
    rep = counts.get("reproduces", {})
    und = sum(v.get("skipped", 0) + v.get("error", 0) for v in counts.values())
    n, m = ((tally(stmts).get("reproduced", 0), len(stmts)) if stmts is not None
            else (reproduced_count(counts), sum(rep.values())))
    claims = f"distinct quoted statements of {sum(rep.values())} `reproduces` claims; " if stmts is not None else ""
    return (f"**{n} of {m} source statement(s) reproduced** ({claims}{n_notebooks} notebook(s), {total} claim(s), "
            f"{und} skipped or in error).")


VERDICT_WORDS = {("refutes", "refuted"): "hypothesis refuted", ("refutes", "not_refuted"): "hypothesis not refuted"}


def verdict_text(kind: str, verdict: str) -> str:
    """The verdict as a row shows it: its mark, then the word (a refutation reads 'hypothesis refuted')."""
    return f"{mark(kind, verdict)} {cell(VERDICT_WORDS.get((kind, verdict), verdict))}"


CONTEXT_CHARS = 80  # a context passage's opening words in a claim row


def quote_cell(c: dict[str, Any]) -> str:
    """The source passage a claim tests, whole and quoted, then the source's values; by construction where so. A
    passage the claim only extends or models is its context, not its statement: its opening words (whole in the
    results file and pages)."""
    q = quote_of(c)
    text = one_line(q["text"]) if q.get("text") else ""
    if q.get("role") in ("extends", "models") and len(text) > CONTEXT_CHARS:
        text = text[: text.rfind(" ", 0, CONTEXT_CHARS)] + " …"
    text = f'"{text}"' if text else "no quote registered"
    role = {"extends": "extends ", "hypothesis": "hypothesis ", "models": "models "}.get(q.get("role", ""), "")
    values = pairs(c.get("source"))
    if q.get("by_construction"):
        return cell(f"{role}{text}; holds by construction, not comparable (note below)")
    return cell(f"{role}{text}" + (f" ({values})" if values else ""))


def claim_row(nb: str, c: dict[str, Any]) -> str:
    kind, verdict = kind_of(c), c.get("verdict", "error")
    measured = pairs(c.get("deciding"))
    if not measured:
        measured = "see below" if verdict in ("skipped", "error") else "in the results file"
    if c.get("notes") or quote_of(c).get("not_decided") or quote_of(c).get("by_construction"):
        measured += " (note below)"
    return (f"| {cell(nb.split('_', 1)[0])} | {code(c.get('id', '?'))} | {cell(kind)} | {verdict_text(kind, verdict)} "
            f"| {cell(measured)} | {quote_cell(c)} |")


def claims_table(claims: list[tuple[str, dict[str, Any]]], run: str = "this run") -> list[str]:
    """The claims' rows under their header, then a blank line."""
    return [f"| nb | claim | kind | verdict | {run} | source |", "|---|---|---|---|---|---|",
            *[claim_row(nb, c) for nb, c in claims], ""]


def _opening(source: Source, claims: list[tuple[str, dict[str, Any]]], release: str) -> list[str]:
    """Two lines: the source's count as the pages say it (verdict_line.count_line), what was not tested here and why."""
    counted = count_line({release: claims}) or "no claim decided"
    skipped = [c for _, c in claims if c.get("verdict") in ("skipped", "error")]
    why = f"{len(skipped)} claim(s) skipped or in error (reasons below); " if skipped else ""
    return [f"- **Counted:** {code_refs(counted)}.",
            f"- **Not tested here:** {why}{code_refs(source.not_tested) or 'nothing declared.'}"]


def source_section(source: Source, results: list[dict[str, Any]]) -> list[str]:
    """One source: the two opening lines, setups side by side, the claims, notes, undecided, statements."""
    claims = [(nb, c) for nb, c in all_claims(results) if kind_of(c) != "environment"]
    release = str(next(((r.get("environment") or {}).get("transformers") for r in results), None) or "?")
    lines = [f"## {code_refs(source.title)}", "", *_opening(source, claims, release), ""]
    if source.setup:
        rows, gap = setup_rows(source, [r.get("environment") or {} for r in results])
        scale = logit_scale(claims)
        if scale is not None:
            gap += f" The largest |logit| in this run is {fmt_scalar(scale)}: raw differences are on that scale."
        lines += ["| setup | source | this run | |", "|---|---|---|---|",
                  *[f"| {k} | {cell(a)} | {cell(b)} | {s} |" for k, a, b, s in rows], "", code_refs(gap), ""]
    lines += claims_table(claims)
    notes = [(c.get("id"), n) for _, c in claims for n in (c.get("notes") or [])]
    notes += [(c.get("id"), f"{word}: {quote_of(c)[key]}") for key, word in (("by_construction", "by construction"),
              ("not_decided", "not decidable here")) for _, c in claims if quote_of(c).get(key)]
    if notes:
        lines += ["Notes on the rows:", "", *[f"- {code(cid)}: {code_refs(one_line(n))}" for cid, n in notes], ""]
    lines += undecided(claims)
    return lines + statements(claims, "Statements and reasons")


def logit_scale(claims: list[tuple[str, dict[str, Any]]]) -> float | None:
    """The largest |logit| the claims' noise floors were measured at (evidence noise_scale), None if none says."""
    scales = [c["evidence"]["noise_scale"] for _, c in claims if isinstance(c.get("evidence"), dict)
              and isinstance(c["evidence"].get("noise_scale"), (int, float))]
    return max(scales) if scales else None


def undecided(claims: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Skipped and error claims with their reasons, whole: claims with the same verdict and reason on one line."""
    groups: dict[tuple[str, str], list[str]] = {}  # (verdict, reason) -> claim ids
    for _, c in claims:
        if c.get("verdict") in ("skipped", "error"):
            groups.setdefault((str(c.get("verdict")), code_refs(one_line(c.get("reason", "")))), []).append(code(c.get("id")))
    if not groups:
        return []
    return ["Not decided in this run:", "",
            *[f"- {', '.join(ids)} {MARK[verdict]} {verdict}: {why}" for (verdict, why), ids in groups.items()], ""]


def statements(claims: list[tuple[str, dict[str, Any]]], title: str) -> list[str]:
    """The decided claims whose verdict is not the kind's holding one (fails, not reproduced, not refuted), each with its
    statement and reason, in a collapsed block; a claim that holds is read from its row above, and every claim's
    reason is in the results files and pages (share.zip); skipped and error claims are in `undecided`'s list."""
    shown = [(nb, c) for nb, c in claims if mark(kind_of(c), str(c.get("verdict"))) != "✅"
             and c.get("verdict") not in ("skipped", "error")]
    if not shown:
        return []
    lines = [f"<details><summary>{title}: the {len(shown)} of {len(claims)} claims decided otherwise than stated</summary>",
             "", "Each claim's statement and why (the others' reasons are in the pages and results of share.zip).", ""]
    lines += [f"- {code(c.get('id'))} ({cell(kind_of(c))}, {cell(str(c.get('verdict')))}): "
              f"{code_refs(one_line(c.get('statement', '')))} _Why:_ {code_refs(one_line(c.get('reason', '')))}" for _, c in shown]
    return lines + ["", "</details>", ""]


def by_source(results: list[dict[str, Any]]) -> list[tuple[Source, list[dict[str, Any]]]]:
    """The results grouped by the source their notebook answers, in sources() order."""
    return [(src, mine) for key, src in sources().items()
            if (mine := [r for r in results if source_of(r["notebook"]).key == key])]


def environment_checks(results: list[dict[str, Any]]) -> list[str]:
    checks = [(nb, c) for nb, c in all_claims(results) if kind_of(c) == "environment"]
    if not checks:
        return []
    return ["## Environment checks", "",
            "Facts about the machine that ran the kit, not findings of a source: never counted as reproduced.", "",
            *claims_table(checks), *undecided(checks)]
