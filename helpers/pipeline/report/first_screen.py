"""SUMMARY.md's first screen (everything before the first <details>, at most screen_chars()): the run in one
line, the releases measured (`make share`: the pinned one and the newest on the package index), then per source a
Verdict line (the symptom and where it shows per release, that source's own count of statements reproduced of those
tested, what was not tested and why, what is listed apart) and an Ask line (helpers.pipeline.report.asks). No count
pools sources. The repros (examples/repro/, torch + transformers only) are named here; a one-source run (one thread's
paste) folds its repro right below, a run of several leaves them in share.zip (repro/), the paste's size not growing."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.version import Version

from ..paths import repo_root
from .asks import Claims, lines_for
from .claims_md import all_claims
from .fit import Part, clauses, drop_asides, fit, fit_clauses
from .paste import code, code_refs
from .records import RELEASES_FILE, RUN_STATUS, load_json, load_results
from ...findings import Source, sources
from .statements import source_key
from .verdict_line import count_parts

NAME_CHARS = 32  # a source's short name
SOURCE_CHARS = 490  # a source's Verdict and Ask text together (after "- Verdict: " and "- Ask: ")
ASK_CHARS = 200  # the Ask first gets up to this, the Verdict the rest; the Ask then takes what the Verdict left
BLOCK_CHARS = NAME_CHARS + SOURCE_CHARS + len("****\n- Verdict: .\n- Ask: .\n\n")  # a source's block at most
REPRO_CHARS = len(", `a_forty_character_repro_file_name_x.py`")  # its repro's name on the Repros line
HEAD_CHARS = 640  # the rest: the run, the releases, what is not verified, the Repros line's own words


def screen_chars() -> int:
    """The first screen's budget: the head, and one block and repro name for each declared source (helpers.findings.sources()), so
    a new source brings its own room and no constant is edited."""
    return HEAD_CHARS + len(sources()) * (BLOCK_CHARS + REPRO_CHARS)
SEPS = ("; ", ". ")


def release_rows(out: Path, run: dict[str, Any], current: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """{release: results} this screen reports (this run's, plus outputs/matrix/ of the same kit commit: with
    `make share`'s releases.json only its pinned and newest) and the sentence naming them."""
    mine = sorted({str((r.get("environment") or {}).get("transformers")) for r in current} - {"None"})
    rows = {rel: current for rel in mine}
    matrix_run, share = load_json(out / "matrix" / "run.json"), load_json(out / RELEASES_FILE)
    same = bool(run.get("kit_commit")) and matrix_run.get("kit_commit") == run.get("kit_commit")
    found = {d.name: load_results(d) for d in sorted((out / "matrix").glob("*/")) if (d / "results").is_dir()} if same else {}
    wanted = {share.get("pinned"), share.get("newest")} if share else set(found)
    rows.update({rel: res for rel, res in found.items() if res and rel in wanted and rel not in rows})
    ordered = dict(sorted(rows.items(), key=lambda kv: Version(kv[0])))
    tags = {rel: ", ".join(t for t in ("pinned", "newest") if share.get(t) == rel) for rel in ordered}
    names = [f"**{rel}**" + (f" ({tags[rel]})" if tags[rel] else "") for rel in ordered]
    if share:
        how = ("newest on the package index when it ran" if share.get("resolved") == "package index"
               else str(share.get("resolved")))
        missing = [r for r in (share.get("pinned"), share.get("newest")) if r not in ordered]
        text = (f"**Releases:** {' and '.join(names)}, by `make share` ({how})"
                + (f"; ⚠️ no results for {', '.join(missing)}" if missing else "") + ".")
    else:
        text = (f"**Releases:** {', '.join(names) or 'none'} only: `make share` also measures the newest release on "
                "the package index.")
    return ordered, text


def _variants(*texts: str) -> Part:
    """The texts once each, in order, empty ones left out."""
    return [t for t in dict.fromkeys(texts) if t]


def symptom_part(key: str, by_release: dict[str, Claims], out: Path) -> Part:
    """The source's symptom, then shorter: without its asides, on the newest release alone, its first clause."""
    said = lines_for(key, by_release, out).symptom
    newest = lines_for(key, dict([list(by_release.items())[-1]]), out).symptom if len(by_release) > 1 else said
    return _variants(said, drop_asides(said), newest, drop_asides(newest), clauses(drop_asides(newest))[0][1]
                     if newest else "")


def ask_line(ask: str, limit: int) -> str:
    """The Ask in `limit` characters: its leading whole clauses, with or without their asides, whichever says more."""
    full, bare = fit_clauses(ask, limit), fit_clauses(drop_asides(ask), limit)
    return full if len(clauses(full, SEPS)) >= len(clauses(bare, SEPS)) or len(bare) > limit else bare


def screen_name(src: Source) -> str:
    """The source's name on the screen: its short name, else its title where it fits NAME_CHARS, else its key."""
    return next(n for n in (src.short, src.title, src.key) if n and len(n) <= NAME_CHARS)


def source_block(src: Source, by_release: dict[str, Claims], out: Path) -> list[str]:
    """The source's name, its Verdict and its Ask lines, together in SOURCE_CHARS, each fitted by saying less."""
    said = lines_for(src.key, by_release, out)
    untested = _variants(f"not tested here: {src.untested}", f"not tested here: {drop_asides(src.untested)}") \
        if src.untested else []
    ask = ask_line(code_refs(said.ask), ASK_CHARS) if said.ask else "nothing to ask: every claim holds as the source says"
    parts = [[code_refs(v) for v in part] for part in (symptom_part(src.key, by_release, out), *count_parts(by_release),
                                                       untested)]  # measured as shown: references in code spans
    verdict = fit(parts, SOURCE_CHARS - len(code_refs(ask)))
    ask = ask_line(code_refs(said.ask), SOURCE_CHARS - len(verdict)) if said.ask else ask
    return [f"**{code_refs(screen_name(src))}**", f"- Verdict: {code_refs(verdict)}.", f"- Ask: {code_refs(ask)}.", ""]


def not_verified_line(current: list[dict[str, Any]]) -> str:
    """What this run could not verify: real checkpoints, CUDA, and the CPU record's stand-in streams."""
    envs = [r.get("environment") or {} for r in current]
    parts = []
    if any(str(e.get("model_id") or "").startswith("tiny-") for e in envs):
        parts.append("the real checkpoints (tiny random-weight models stand in)")
    cuda = sum(1 for _, c in all_claims(current) if c.get("verdict") == "skipped" and "cuda" in str(c.get("reason")).lower())
    if cuda and not any(e.get("cuda_available") for e in envs):
        parts.append(f"{cuda} claim(s) that need CUDA (`make gpu-check`)")
    return "**Not verified here:** " + ("; ".join(parts) if parts else "nothing declared") + "."


def repro_block(source: Source) -> list[str]:
    """The source's repro file in a python block, with what it prints; a missing file says so."""
    path = repo_root() / source.repro
    head = f"`{source.repro}` prints the transformers release, {source.repro_prints}, and one verdict line."
    if not path.is_file():
        return [head, "", f"> ⚠️ {code(source.repro)} is missing from this checkout.", ""]
    return [head, "", "```python", path.read_text().rstrip(), "```", ""]


def run_line(run: dict[str, Any], current: list[dict[str, Any]]) -> list[str]:
    if not run:
        return ["> ⚠️ **No run record** (run.json is missing): nothing below is presented as one run's. "
                "Run `make share`.", ""]
    status = run.get("status") or "unknown"
    commit = f"kit {code(str(run.get('kit_commit'))[:12])}" if run.get("kit_commit") else "kit commit unknown"
    envs = [r.get("environment") or {} for r in current]
    where = sorted({f"{e.get('device')}, {e.get('dtype')}" for e in envs if e.get("device")})
    lines = [f"Run {code(run.get('run_id'))} · {code(run.get('command', '?'))} · {RUN_STATUS.get(status, code(status))} · "
             f"{commit}{' (dirty)' if run.get('kit_dirty') else ''} · {' / '.join(where) or 'environment unknown'}", ""]
    if status != "complete":
        lines += [f"> ⚠️ This run is **{status}**: claims of unfinished notebooks are `error` (see the run record below).", ""]
    return lines


def _sources(rows: dict[str, list[dict[str, Any]]]) -> list[tuple[Source, dict[str, Claims]]]:
    """Every source with claims on some release (helpers.findings.sources() order), with its claims per release."""
    by_release = {rel: all_claims(res) for rel, res in rows.items()}
    keys = {source_key(nb, c) for claims in by_release.values() for nb, c in claims}
    return [(sources()[key], {rel: mine for rel, claims in by_release.items()
                            if (mine := [(nb, c) for nb, c in claims if source_key(nb, c) == key])})
            for key in sorted(keys, key=list(sources()).index)]  # a source none declares is refused here


def first_screen(out: Path, run: dict[str, Any], current: list[dict[str, Any]],
                 budget: int | None = None) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines before the first <details> (in `budget`, screen_chars() unless given), and the repros folded right
    below it as (summary, lines)."""
    budget = screen_chars() if budget is None else budget
    rows, releases = release_rows(out, run, current)
    lines = [*run_line(run, current), releases, ""]
    present = _sources(rows)
    for src, by_release in present:
        lines += source_block(src, by_release, out)
    lines += [not_verified_line(current), ""]
    shown = [s for s, _ in present if s.repro]
    lines += repros_line(shown)
    text = "\n".join(lines)
    if len(text) > budget:
        lines = [f"> ⚠️ The first screen is {len(text):,} characters, over its {budget:,}.", "", *lines]
    return lines, [(f"Repro, {s.short}: {s.repro}", repro_block(s)) for s in shown if len(shown) == 1]


def repros_line(shown: list[Source]) -> list[str]:
    """Where this run's repros are: folded below for a one-source run (one thread's paste), else in share.zip."""
    if not shown:
        return []
    names = ", ".join(code(Path(s.repro).name) for s in shown)
    if len(shown) == 1:
        return [f"**Repro** in `examples/repro/` (torch + transformers only; folded below): {names}.", ""]
    return [f"**Repros** (torch + transformers only) in `share.zip` and `examples/repro/`: {names}; a run of one "
            "source folds its own in, below.", ""]

