"""`make bisect NB=05 CLAIM=offload.prefetch_reads_unordered_copy` (or `KEY=first_call_attention_mask`,
`GOOD=5.14.1 BAD=5.25.0`): the first release where a claim's verdict or a recorded value differs from
GOOD's, found by halving the releases pip lists between GOOD and BAD (search), running only the
named notebook, each release in its `.venv-tf/<release>` environment (envs.ensure_env: built on demand,
reused after). Then the unified diff, between the adjacent releases, of the transformers functions the
notebook names (source). Output: outputs/bisect/<notebook>-<claim or key>.md and .json.

Bad arguments are refused before any install, in one line that says what is valid. Ctrl-C stops the
running notebook; the report says the bisect was interrupted and keeps what it measured (exit 130).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from . import report as bisect_report
from . import upstream_code
from .search import Interrupted, Probe, Search, find_changes
from ...findings import of
from ..releases.envs import child_env
from ..releases.facts import notebook_facts
from ..releases.report import DEFAULT_RELEASES
from ..paths import output_dir, repo_root

DEFAULT_GOOD, DEFAULT_BAD = DEFAULT_RELEASES[0], DEFAULT_RELEASES[-1]  # the matrix's first and last release


class Refused(Exception):
    """A bad argument, found before anything is installed or run."""


def pypi_releases() -> list[str]:
    """Every final transformers release the package index offers (`pip index versions`), oldest first."""
    from packaging.version import Version

    res = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "index", "versions",
                          "transformers"], capture_output=True, text=True, timeout=120)
    found = re.search(r"Available versions:\s*(.+)", res.stdout)
    if res.returncode != 0 or not found:
        raise Refused(f"pip could not list transformers releases: {(res.stderr or res.stdout).strip()[-200:]}")
    versions = [Version(v.strip()) for v in found.group(1).split(",") if v.strip()]
    return [str(v) for v in sorted(v for v in versions if not v.is_prerelease and not v.is_devrelease)]


def span(releases: Sequence[str], good: str, bad: str) -> list[str]:
    """The releases from GOOD to BAD inclusive, in version order; Refused unless both are listed and GOOD < BAD."""
    from packaging.version import InvalidVersion, Version

    for name, value in (("GOOD", good), ("BAD", bad)):
        try:
            Version(value)
        except InvalidVersion:
            raise Refused(f"{name}={value!r} is not a version; valid: {releases[0]} … {releases[-1]}") from None
        if value not in releases:
            raise Refused(f"{name}={value} is not a listed release; valid: {', '.join(releases[-12:])} (and older)")
    if Version(good) >= Version(bad):
        raise Refused(f"GOOD={good} must be older than BAD={bad}")
    return [r for r in releases if Version(good) <= Version(r) <= Version(bad)]


def check_target(notebook: Path, claim: str | None, key: str | None) -> None:
    """Refused unless exactly one of claim and key is given, a claim the notebook declares or a value name."""
    if bool(claim) == bool(key):
        raise Refused("give exactly one of CLAIM=<claim id> (a verdict) or KEY=<recorded value name>")
    if claim:
        ids = list(of(notebook).claims)
        if claim not in ids:
            raise Refused(f"CLAIM={claim} is not a claim of {notebook.stem}; valid: {', '.join(ids)}")
    elif not re.fullmatch(r"[\w.\[\]]+", key or ""):
        raise Refused(f"KEY={key!r} is not a value name (letters, digits, _ and .; e.g. first_call_attention_mask)")


def value_of(data: dict[str, Any], claim: str | None, key: str | None) -> tuple[bool, Any, str]:
    """(found, value, why not) from one results file: a claim's verdict, or every recorded path ending in KEY."""
    if claim:
        found = next((c for c in data.get("claims", []) if c.get("id") == claim), None)
        return (True, found.get("verdict"), "") if found else (False, None, f"claim {claim} not in the results")
    facts = notebook_facts(data)
    hits = {k: v for k, v in facts.items() if k == key or k.endswith("." + key)}
    if not hits:
        return False, None, f"no recorded value named {key}"
    values = list(hits.values())
    return True, values[0] if all(json.dumps(v, default=str) == json.dumps(values[0], default=str) for v in values) \
        else hits, ""


class Bisect:
    """One bisect: the probe that runs the notebook on a release, and the envs it used (for the diff)."""

    def __init__(self, notebook: Path, claim: str | None, key: str | None, out: Path, log=print) -> None:
        self.notebook, self.claim, self.key, self.out, self.log = notebook, claim, key, out, log
        self.pythons: dict[str, str] = {}
        self.stop: Any = None

    def _check_stop(self) -> None:
        """Raise Interrupted once Ctrl-C (or a termination signal) has been received."""
        if self.stop is not None and self.stop.signum is not None:
            raise Interrupted()

    def probe(self, release: str) -> Probe:
        """Install (or reuse) the release's environment, run the notebook there, read the value."""
        from ..releases.envs import ensure_env
        from ..releases.run import run_all_under

        self._check_stop()
        self.log(f"[bisect] transformers {release}: preparing environment", flush=True)
        env = ensure_env(release, self.log)
        self._check_stop()
        if not env.ok:
            self.log(f"[bisect] transformers {release}: not installable: {env.reason}", flush=True)
            return Probe(release, ok=False, reason=f"not installable: {env.reason}", seconds=env.seconds)
        self.pythons[release] = env.python
        dest = self.out / "runs" / self.notebook.stem / release
        rc, seconds = run_all_under(env, dest, ["--notebooks", self.notebook.stem, "--no-report"], quiet=True)
        self._check_stop()
        try:
            data = json.loads((dest / "results" / f"{self.notebook.stem}.json").read_text())
        except (OSError, ValueError):
            return Probe(release, ok=False, reason=f"notebook wrote no results (run-all exit {rc})", seconds=seconds)
        found, value, why = value_of(data, self.claim, self.key)
        self.log(f"[bisect] transformers {release}: {value if found else why} ({seconds:.0f}s)", flush=True)
        return Probe(release, value, found, "" if found else f"notebook ran but {why}", seconds)

    def diffs(self, search: Search) -> dict[str, dict[str, dict[str, Any]]]:
        """The relevant functions' diff for every change point."""
        names, focus = upstream_code.split_focus(upstream_code.relevant(self.notebook.stem))
        out = {}
        for a, b in search.changes:
            if a in self.pythons and b in self.pythons:
                read = {r: upstream_code.read_sources(self.pythons[r], names, child_env(self.out), str(repo_root()))
                        for r in (a, b)}
                out[f"{a}..{b}"] = upstream_code.diff_sources(read[a], read[b], a, b, focus=focus)
        return out


def run(notebook: Path, claim: str | None, key: str | None, releases: list[str], good: str, bad: str,
        out: Path | None = None, log=print) -> tuple[dict[str, Any], Path]:
    """The bisect, its diffs and both report files; returns (data, markdown path)."""
    from ..run.procs import Stop

    out = Path(out) if out else output_dir("bisect")
    job = Bisect(notebook, claim, key, out, log)
    what = f"claim `{claim}`" if claim else f"value `{key}`"
    start = time.perf_counter()
    with Stop(forward=True) as stop:
        job.stop = stop
        search = find_changes(releases, job.probe)
        diffs = {} if search.interrupted else job.diffs(search)
    meta = {"notebook": notebook.stem, "claim": claim, "key": key, "what": what, "good": good, "bad": bad,
            "seconds": round(time.perf_counter() - start, 1)}
    data = bisect_report.to_json(search, meta, diffs)
    data["summary"] = bisect_report.summary(search, what)
    md, _ = bisect_report.write(out, f"{notebook.stem.split('_', 1)[0]}-{claim or key}", data)
    return data, md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkit bisect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebook", required=False, default="")
    parser.add_argument("--claim", default=None)
    parser.add_argument("--key", default=None)
    parser.add_argument("--good", default=DEFAULT_GOOD)
    parser.add_argument("--bad", default=DEFAULT_BAD)
    parser.add_argument("--releases", nargs="*", default=None, help="instead of asking pip (tests, offline)")
    args = parser.parse_args(argv)
    from ..run.execute import notebooks, select

    try:
        try:
            [notebook] = select([args.notebook])  # NB= left out selects every notebook: not one
        except (SystemExit, ValueError):
            raise Refused(f"NB={args.notebook} names no single notebook; valid: "
                          + ", ".join(nb.stem[:2] for nb in notebooks())) from None
        check_target(notebook, args.claim, args.key)
        releases = span(args.releases or pypi_releases(), args.good, args.bad)
    except Refused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    print(f"bisect {notebook.stem} {args.claim or args.key}: {len(releases)} releases {releases[0]} … {releases[-1]}",
          flush=True)
    data, md = run(notebook, args.claim, args.key, releases, args.good, args.bad)
    for line in data["summary"]:
        print(line)
    print(f"{data['notebook_runs']} notebook run(s) in {data['seconds']:.0f}s; {md.relative_to(repo_root()) if md.is_relative_to(repo_root()) else md}")
    if data["status"] == "interrupted":
        print("interrupted: the report keeps the releases measured so far", file=sys.stderr)
        return 130
    return 0

