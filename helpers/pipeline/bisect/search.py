"""The search behind `make bisect`: the change points of a per-release value, with as few runs as it can.

`find_changes(releases, probe)` evaluates the first and the last release, then halves every span whose
ends disagree until the two ends are adjacent among the releases that could be installed. A span whose
ends agree is not searched (a change and its reversal inside it is not seen; the report says so). A
release that cannot be installed is skipped, recorded with its reason, and the search continues with
its neighbours. A monotonic value costs 2 + ceil(log2(n - 1)) probes at most; every change point is found
when the value changes several times at releases the halving reaches.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass
class Probe:
    """One release's value, or why it has none (not installable, notebook failed, interrupted)."""

    release: str
    value: Any = None
    ok: bool = True
    reason: str = ""
    seconds: float = 0.0


@dataclass
class Search:
    """Every release probed (in release order), the change points (last agreeing, first differing), skips."""

    releases: list[str]
    probes: dict[str, Probe] = field(default_factory=dict)
    changes: list[tuple[str, str]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def runs(self) -> int:
        """Notebook runs made (releases that could not be installed ran nothing)."""
        return sum(1 for p in self.probes.values() if p.ok or p.reason.startswith("notebook"))

    def tried(self) -> list[Probe]:
        return [self.probes[r] for r in self.releases if r in self.probes]


def same(a: Any, b: Any) -> bool:
    """Two recorded values are the same value (JSON identity, key order ignored)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


class Interrupted(Exception):
    """Raised by a probe when the user stopped the bisect."""


def _value(search: Search, index: int, probe: Callable[[str], Probe]) -> Probe:
    """The probe of release `index`, run once (a release without a value is recorded as skipped)."""
    release = search.releases[index]
    if release not in search.probes:
        search.probes[release] = result = probe(release)
        if not result.ok:
            search.skipped[release] = result.reason
    return search.probes[release]


def _end(search: Search, indices: list[int], probe: Callable[[str], Probe]) -> int | None:
    """The first index in `indices` whose release has a value (probing in that order)."""
    return next((i for i in indices if _value(search, i, probe).ok), None)


def _halve(search: Search, lo: int, hi: int, probe: Callable[[str], Probe]) -> None:
    """Change points between lo and hi (both with values)."""
    if same(search.probes[search.releases[lo]].value, search.probes[search.releases[hi]].value):
        return
    while True:
        inner = [i for i in range(lo + 1, hi) if search.releases[i] not in search.skipped]
        if not inner:
            search.changes.append((search.releases[lo], search.releases[hi]))
            return
        mid = inner[(len(inner) - 1) // 2]  # the middle (the lower one of two)
        if _value(search, mid, probe).ok:
            break
    _halve(search, lo, mid, probe)
    _halve(search, mid, hi, probe)


def find_changes(releases: Sequence[str], probe: Callable[[str], Probe]) -> Search:
    """Every change point of probe(release).value over `releases` (in order); stops cleanly on Interrupted."""
    search = Search(list(releases))
    try:
        lo = _end(search, list(range(len(releases))), probe)
        hi = _end(search, list(range(len(releases) - 1, lo, -1)), probe) if lo is not None else None
        if lo is not None and hi is not None:
            _halve(search, lo, hi, probe)
    except Interrupted:
        search.interrupted = True
    search.changes.sort(key=lambda c: search.releases.index(c[0]))
    return search
