"""`make share`: the releases the paste measures, the pinned one (requirements-runtime.txt) and the newest the package
index lists (resolved when it runs; offline, the newest the kit knows, saying so), recorded in outputs/releases.json
for the first screen. The pinned release runs as the run-all; the newest through the matrix runner (run.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .envs import pinned_release
from .report import DEFAULT_RELEASES
from ..report.records import RELEASES_FILE, load_releases  # noqa: F401 - the reader beside the writer

KNOWN_NEWEST = DEFAULT_RELEASES[-1]  # the newest release the kit knows: the default matrix's last


def _index_releases() -> list[str]:
    from ..bisect.cli import pypi_releases

    return pypi_releases()


def resolve(lister: Callable[[], list[str]] = _index_releases) -> dict[str, Any]:
    """{pinned, newest, resolved}: resolved says whether the package index named the newest or the kit fell back."""
    pinned = pinned_release() or KNOWN_NEWEST
    try:
        listed = lister()
        if not listed:
            raise RuntimeError("the package index listed no transformers release")
        return {"pinned": pinned, "newest": listed[-1], "resolved": "package index"}
    except Exception as exc:  # noqa: BLE001 - offline or pip failing: the newest the kit knows, and why
        why = " ".join(str(exc).split())[:160]
        return {"pinned": pinned, "newest": KNOWN_NEWEST, "resolved": f"offline (newest the kit knows; {why})"}


def write_releases(out: Path, info: dict[str, Any]) -> Path:
    path = Path(out) / RELEASES_FILE
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path

