"""`make share`: the releases the paste measures, the pinned one (requirements-runtime.txt) and the newest the package
index lists (resolved when it runs; offline, the newest the kit knows, saying so), recorded in outputs/releases.json
for the first screen. The pinned release runs as the run-all; the newest through the matrix runner (run.py); then
`make bisect` (helpers.pipeline.bisect) of each source's key claim (each finding's `bisect`, helpers.findings) whose verdict differs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .envs import pinned_release
from .report import DEFAULT_RELEASES
from ..report.records import RELEASES_FILE, load_results  # releases.json: read by report.first_screen

KNOWN_NEWEST = DEFAULT_RELEASES[-1]  # the newest release the kit knows: the default matrix's last


def resolve(lister: Callable[[], list[str]] | None = None) -> dict[str, Any]:
    """{pinned, newest, resolved, listed}: resolved says whether the package index (`lister`, default
    bisect.cli.pypi_releases) named the newest or the kit fell back; listed: every release it offers ([] offline)."""
    from ..bisect.cli import pypi_releases

    pinned = pinned_release() or KNOWN_NEWEST
    try:
        listed = (lister or pypi_releases)()
        if not listed:
            raise RuntimeError("the package index listed no transformers release")
        return {"pinned": pinned, "newest": listed[-1], "resolved": "package index", "listed": listed}
    except Exception as exc:  # noqa: BLE001 - offline or pip failing: the newest the kit knows, and why
        why = " ".join(str(exc).split())[:160]
        return {"pinned": pinned, "newest": KNOWN_NEWEST, "resolved": f"offline (newest the kit knows; {why})",
                "listed": []}


def _verdict(results: Path, prefix: str, claim: str) -> str | None:
    """The claim's verdict in the results of the notebook whose name starts with `prefix`, None where it has none."""
    claims = [c for data in load_results(results) if data["notebook"].startswith(prefix)
              for c in data.get("claims") or []]
    return next((c.get("verdict") for c in claims if c.get("id") == claim), None)


def changed(out: Path, info: dict[str, Any]) -> list[tuple[str, str]]:
    """The key claims (each finding's `bisect`, helpers.findings) whose verdict differs between the pinned run and the newest release's."""
    from ...findings import bisect_claims

    newest = Path(out) / "matrix" / str(info["newest"])
    return [(nb, claim) for nb, claim in bisect_claims()
            if None not in (a := _verdict(Path(out), nb, claim), b := _verdict(newest, nb, claim)) and a != b]


def bisect_changed(out: Path, info: dict[str, Any], log=print) -> list[Path]:
    """`make bisect` of each changed key claim between the pinned and the newest release (needs the index's list)."""
    from ..bisect import cli as bisect_cli
    from ..report.asks import bisect_record
    from ..run.execute import select

    todo = changed(out, info)
    if todo and not info.get("listed"):
        log(f"share: not bisecting {', '.join(c for _, c in todo)}: the package index could not be read")
        return []
    written = []
    for nb, claim in todo:
        done = bisect_record(Path(out), nb, claim)
        if done.get("good") == info["pinned"] and done.get("bad") == info["newest"]:
            log(f"share: {claim}: kept the complete `make bisect` record of {info['pinned']}..{info['newest']}")
            continue
        releases = bisect_cli.span(info["listed"], info["pinned"], info["newest"])
        log(f"share: {claim} differs between {info['pinned']} and {info['newest']}: bisecting {len(releases)} releases")
        _, md = bisect_cli.run(select([nb])[0], claim, None, releases, info["pinned"], info["newest"],
                               out=Path(out) / "bisect", log=log)
        written.append(md)
    return written


def write_releases(out: Path, info: dict[str, Any]) -> Path:
    path = Path(out) / RELEASES_FILE
    path.write_text(json.dumps({k: v for k, v in info.items() if k != "listed"}, indent=2) + "\n")
    return path

