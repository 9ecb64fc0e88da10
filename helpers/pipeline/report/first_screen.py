"""SUMMARY.md's first screen (everything before the first <details>, at most FIRST_SCREEN_CHARS): the run in one
line, the headline over distinct source statements, one verdict line per source, the releases measured, what was
not verified here, and each source's plain-transformers repro (sources.Source.repro) in a python block."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .claims_md import all_claims
from .paste import code, code_refs
from .records import RUN_STATUS, load_results, load_run
from .sources import SOURCES, Source, kind_of
from .statements import Statement, first_line, quote_of, source_key, statements, tally
from ..paths import repo_root

FIRST_SCREEN_CHARS = 4000


def _needs_cuda(stmt: Statement) -> bool:
    return all("cuda" in r.lower() for r in stmt.reasons)


def _not_tested(stmts: list[Statement]) -> str:
    why = "needs CUDA" if all(_needs_cuda(s) for s in stmts) else "skipped or in error: reasons in the details"
    return f"not tested here ({why})"


def source_verdict(claims: list[tuple[str, dict[str, Any]]]) -> str:
    """One line: statements reproduced (or not tested and why), hypotheses refuted, simulations by construction."""
    stmts = statements(claims)
    count = tally(stmts)
    done, missed = count.get("reproduced", 0), [s for s in stmts if s.verdict == "not_reproduced"]
    undecided = [s for s in stmts if s.verdict in ("skipped", "error")]
    parts = []
    if stmts and len(undecided) == len(stmts):
        parts.append(f"⏭️ {_not_tested(undecided)}: {len(stmts)} statement(s)")
    elif stmts:
        parts.append(f"{'✅' if not missed else '☑️'} {done} of {len(stmts)} statement(s) reproduced")
        if missed:
            parts.append("❌ not reproduced: " + ", ".join(f'"{first_line(s.text, 40)}"' for s in missed))
        if undecided:
            parts.append(f"⏭️ {len(undecided)} {_not_tested(undecided)}")
    for hyp in statements(claims, "refutes"):
        word = {"refuted": "✅ hypothesis refuted", "not_refuted": "❌ hypothesis not refuted"}.get(hyp.verdict)
        parts.append(f'{word or "⏭️ hypothesis " + _not_tested([hyp])}: "{first_line(hyp.text, 60)}"')
    if not parts:
        parts += _own_checks(claims)
    sims = [c for _, c in claims if kind_of(c) == "simulation"]
    built = sum(bool(quote_of(c).get("by_construction")) for c in sims)
    if sims:
        parts.append(f"{len(sims)} simulation(s)" + (" (holds by construction)" if built == len(sims) else
                                                      f", {built} holding by construction" if built else ""))
    return "; ".join(parts) or "nothing decided"


def _own_checks(claims: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A source with no quoted statement: how many of the kit's own checks (kind beyond) hold; never 'reproduced'."""
    own = [c for _, c in claims if kind_of(c) == "beyond"]
    if not own:
        return []
    held = sum(c.get("verdict") == "holds" for c in own)
    undecided = sum(c.get("verdict") in ("skipped", "error") for c in own)
    mark = "✅" if held == len(own) else "☑️"
    return [f"{mark} {held} of {len(own)} own checks hold (kind beyond, not counted as reproduced)" + (f"; {undecided} skipped or in error" if undecided else "")]


def _version(release: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", release))


def _load_matrix(out: Path) -> dict[str, list[dict[str, Any]]]:
    """{release: results files} of outputs/matrix/<release>/results/ (releases with none left out)."""
    found = {d.name: load_results(d) for d in sorted((out / "matrix").glob("*/")) if (d / "results").is_dir()}
    return {release: results for release, results in found.items() if results}


def _short_verdict(claims: list[tuple[str, dict[str, Any]]]) -> str:
    """The source's quoted statements on one release in a few words ('' where it has none)."""
    stmts = statements(claims)
    undecided = [s for s in stmts if s.verdict in ("skipped", "error")]
    if not stmts:
        return ""
    if len(undecided) == len(stmts):
        return "not tested (needs CUDA)" if all(_needs_cuda(s) for s in undecided) else "not tested"
    return f"{tally(stmts).get('reproduced', 0)} of {len(stmts)}"


def _own_count(claims: list[tuple[str, dict[str, Any]]]) -> str:
    own = [c for _, c in claims if kind_of(c) == "beyond" and c.get("verdict") not in ("skipped", "error")]
    return f"{sum(c.get('verdict') == 'holds' for c in own)} of {len(own)}" if own else ""  # of those decided


def _runs(values: dict[str, str], releases: list[str]) -> str:
    """'X' (the same on every release), or 'X on 5.14.1, Y on 5.17.0/5.19.0' (consecutive releases joined)."""
    runs: list[tuple[str, list[str]]] = []
    for rel in releases:
        if runs and runs[-1][0] == values[rel]:
            runs[-1][1].append(rel)
        else:
            runs.append((values[rel], [rel]))
    if len(runs) == 1:
        return runs[0][0]  # the same on every release named in the line's head
    return ", ".join(f"{v} on {'/'.join(rels)}" for v, rels in runs)  # the releases measured, none implied between


def _per_source(rows: dict[str, list[dict[str, Any]]], shown: list[Source]) -> str:
    """Per source: its statements' verdicts across releases, then its own checks where they change (or are all)."""
    releases = sorted(rows, key=_version)
    by_release = {rel: all_claims(res) for rel, res in rows.items()}
    parts = []
    for src in shown:
        mine = {rel: [(nb, c) for nb, c in by_release[rel] if source_key(nb, c) == src.key] for rel in releases}
        rels = [rel for rel in releases if mine[rel]]
        if not rels:
            continue
        stated = {rel: _short_verdict(mine[rel]) for rel in rels}
        own = {rel: _own_count(mine[rel]) for rel in rels}
        text = []
        if any(stated.values()):
            text.append(_runs(stated, rels))
        if any(own.values()) and (not text or len(set(own.values())) > 1):
            text.append("own checks " + _runs(own, rels))
        parts.append(f"{code_refs(src.short)} {'; '.join(text)}")
    return " · ".join(parts)


def releases_line(out: Path, run: dict[str, Any], current: list[dict[str, Any]], shown: list[Source]) -> str:
    """The releases measured with their verdicts: outputs/matrix/ of the same kit commit where present, else this run's."""
    mine = sorted({str((r.get("environment") or {}).get("transformers")) for r in current} - {"None"})
    this = {rel: current for rel in mine}
    matrix_run, matrix = load_run(out / "matrix"), _load_matrix(out)
    commit = run.get("kit_commit")
    same = bool(matrix) and bool(commit) and matrix_run.get("kit_commit") == commit
    rows = {**(matrix if same else {}), **this}
    names = ", ".join(f"{rel}{' (this run)' if rel in this else ''}" for rel in sorted(rows, key=_version))
    text = _per_source(rows, shown)
    if same:
        nbs = sorted({r["notebook"].split("_", 1)[0] for res in matrix.values() for r in res})
        mine_nbs = sorted({r["notebook"].split("_", 1)[0] for r in current})
        which = "every notebook" if nbs == mine_nbs else f"notebooks {' '.join(nbs)}"
        dirty = " + uncommitted changes" if run.get("kit_dirty") or matrix_run.get("kit_dirty") else ""
        return f"**Releases measured** (`make matrix` of this kit commit{dirty}, {which}): **{names}**: {text}."
    stale = " (`outputs/matrix` is from another kit commit: not shown)" if matrix else ""
    return (f"**Releases measured:** **{names or 'none'}**: {text}; only the release this run used{stale}; "
            '`make matrix RELEASES="5.14.1 5.24.0"` then `make report` adds releases.')


def not_verified_line(current: list[dict[str, Any]]) -> str:
    """What this run could not verify: real checkpoints, CUDA, and the CPU record's stand-in streams."""
    envs = [r.get("environment") or {} for r in current]
    parts = []
    if any(str(e.get("model_id") or "").startswith("tiny-") for e in envs):
        parts.append("the real checkpoints (tiny random-weight models stand in)")
    cuda = sum(1 for _, c in all_claims(current) if c.get("verdict") == "skipped" and "cuda" in str(c.get("reason")).lower())
    if cuda and not any(e.get("cuda_available") for e in envs):
        parts.append(f"{cuda} claim(s) that need CUDA (`make gpu-check`; the CPU record's copy streams are stand-ins)")
    return "**Not verified here:** " + ("; ".join(parts) if parts else "nothing declared") + "."


def repro_block(source: Source) -> list[str]:
    """The source's repro file in a python block, with what it prints; a missing file says so."""
    path = repo_root() / source.repro
    head = f"**Repro, {code_refs(source.short)}:** {code(source.repro)} prints {source.repro_prints}."
    if not path.is_file():
        return [head, "", f"> ⚠️ {code(source.repro)} is missing from this checkout.", ""]
    return [head, "", "```python", path.read_text().rstrip(), "```", ""]


def run_line(run: dict[str, Any], current: list[dict[str, Any]]) -> list[str]:
    if not run:
        return ["> ⚠️ **No run record** (run.json is missing): nothing below is presented as one run's. "
                "Run `make run-all`.", ""]
    status = run.get("status") or "unknown"
    commit = f"kit {code(str(run.get('kit_commit'))[:12])}" if run.get("kit_commit") else "kit commit unknown"
    envs = [r.get("environment") or {} for r in current]
    where = sorted({f"{e.get('device')}, {e.get('dtype')}" for e in envs if e.get("device")})
    lines = [f"Run {code(run.get('run_id'))} · {code(run.get('command', '?'))} · {RUN_STATUS.get(status, code(status))} · "
             f"{commit}{' (dirty)' if run.get('kit_dirty') else ''} · {' / '.join(where) or 'environment unknown'}", ""]
    if status != "complete":
        lines += [f"> ⚠️ This run is **{status}**: claims of unfinished notebooks are `error` (see the run record below).", ""]
    return lines


def first_screen(out: Path, run: dict[str, Any], current: list[dict[str, Any]], headline: str,
                 budget: int = FIRST_SCREEN_CHARS) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines before the first <details>, and the repros that would not fit in `budget` characters (with the
    title's line) as (summary, lines) to fold into <details> right after it; the first screen names each one."""
    claims = all_claims(current)
    shown = [s for s in SOURCES.values() if s.repro]
    lines = [*run_line(run, current), headline, ""]
    for s in shown:
        mine = [(nb, c) for nb, c in claims if source_key(nb, c) == s.key]
        lines.append(f"- **{code_refs(s.short)}:** {code_refs(source_verdict(mine)) if mine else 'not run in this run'}")
    lines += ["", releases_line(out, run, current, shown), "", not_verified_line(current), ""]
    lines += ["Each repro: torch + transformers only, a tiny model from a config, CPU, seconds.", ""]
    folded = [(s, repro_block(s)) for s in shown]
    while folded:  # in order, each repro inline while the screen (with one line per folded repro) fits
        rest = folded[1:]
        if _size(lines + folded[0][1] + [_folded_line(f) for f, _ in rest]) > budget:
            break
        lines, folded = lines + folded[0][1], rest
    return lines + [_folded_line(s) for s, _ in folded] + ([""] if folded else []), \
        [(f"Repro, {s.short}: {s.repro}", block) for s, block in folded]


def _folded_line(source: Source) -> str:
    return f"**Repro, {code_refs(source.short)}:** {code(source.repro)} (folded below)."


def _size(lines: list[str]) -> int:
    return len("\n".join(lines)) + 30  # the title line
