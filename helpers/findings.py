"""The findings, one per notebook, each declared once beside its code (helpers/<package>/finding.py) and found here
by discovery: every list the kit keeps per notebook derives from them (quotes, the notebook's source, the Ask
writers, bisect's claims and functions, the deciding modules' mutation scope and decisions registry, the runner's estimates, README's notebook table).
A declaration missing a piece is refused by name when it is built; tests/test_findings.py checks they are complete.
Adding one (its files, its fields, `make generate`): docs/adding-a-finding.md."""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from .quotes import ROLES

ROOTS: list[tuple[Path, str]] = [(Path(__file__).resolve().parent, "helpers")]  # (folder, its dotted package)
KINDS = {role: kind for kind, role in ROLES.items()}  # a claim's kind, from the role of its quote


class DeclarationError(ValueError):
    """A finding's declaration lacks a piece or names something it does not hold."""


@dataclass(frozen=True)
class Decisions:
    """A module deciding claims: the functions mutation testing mutates, the test file whose CASES feed every
    decision a holding and a contradicting case, the further tests mutmut runs, and the decisions not named decide_*."""

    module: str  # its path from the repository root
    mutate: tuple[str, ...]
    kill: str
    tests: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.module and self.mutate and self.kill):
            raise DeclarationError(f"decisions {self.module or '?'}: a module, the functions to mutate and a kill file")

    @property
    def dotted(self) -> str:
        return self.module[:-3].replace("/", ".").removesuffix(".__init__")


@dataclass(frozen=True)
class Finding:
    """One notebook's finding: every fact the kit's lists need of it (no field may be left empty)."""

    stem: str  # the notebook's file name without .ipynb
    title: str
    source: str  # the key of the source it answers (helpers.pipeline.report.sources.SOURCES)
    claims: dict[str, Any]  # claim id -> its helpers.quotes.Quote (its role gives the claim's kind)
    ask: Callable[..., Any]  # the Ask writer of its source (helpers.pipeline.report.asks)
    bisect: str  # the claim `make bisect` (and `make share`) follows
    functions: tuple[str, ...]  # the transformers functions whose diff can move its values ("name|focus word")
    repro: str  # its plain-transformers repro under examples/repro/
    decisions: tuple[Decisions, ...]
    estimate_s: float  # the runner's expected seconds where no earlier run timed it
    summary: str  # README's one-paragraph finding
    models: str  # README: its default models
    needs: str  # README: what it needs (CPU, CUDA)

    def __post_init__(self) -> None:
        missing = [f.name for f in fields(self) if getattr(self, f.name) in ("", (), {}, None, 0)]
        if missing:
            raise DeclarationError(f"finding {self.stem or '?'}: no {', '.join(missing)}")
        if self.bisect not in self.claims:
            raise DeclarationError(f"finding {self.stem}: bisect claim {self.bisect} is not one of its claims")
        if len({cid.split(".", 1)[0] for cid in self.claims}) != 1:
            raise DeclarationError(f"finding {self.stem}: claim ids need one prefix")

    @property
    def number(self) -> str:
        return self.stem.split("_", 1)[0]

    @property
    def prefix(self) -> str:
        return next(iter(self.claims)).split(".", 1)[0]

    def kinds(self) -> dict[str, str]:
        return {cid: KINDS[q.role] for cid, q in self.claims.items()}


def _modules(folder: Path, package: str) -> list[str]:
    """The declaration modules under one root: <package>/finding.py."""
    return sorted(f"{package}.{p.parent.name}.finding" for p in folder.glob("*/finding.py"))


@functools.lru_cache(maxsize=1)
def found() -> tuple[Finding, ...]:
    """Every declared finding, in notebook order (each declaration module's FINDING)."""
    out = [importlib.import_module(name).FINDING for folder, pkg in ROOTS for name in _modules(folder, pkg)]
    return tuple(sorted(out, key=lambda f: f.stem))


def reset() -> None:
    """Forget what was found (after ROOTS changed)."""
    found.cache_clear()


def of(notebook: str | Path) -> Finding:
    """The finding of a notebook, by its stem's number ('05_hybrid...' or a path); KeyError naming what to add."""
    number = Path(str(notebook)).stem.split("_", 1)[0]
    for f in found():
        if f.number == number:
            return f
    raise KeyError(f"no finding declares notebook {notebook}: add helpers/<package>/finding.py (see helpers/findings.py)")


def quotes() -> dict[str, Any]:
    return {cid: q for f in found() for cid, q in f.claims.items()}


def quote_for(claim_id: str) -> dict[str, Any]:
    """The declared quote of a claim as a plain dict ({} for a claim without one)."""
    entry = quotes().get(claim_id)
    return entry.as_dict() if entry else {}


def writer(source: str) -> Callable[..., Any]:
    """The Ask writer of a source (KeyError where no finding declares it)."""
    for f in found():
        if f.source == source:
            return f.ask
    raise KeyError(f"source {source} has no Ask writer: no finding declares it")


def bisect_claims() -> tuple[tuple[str, str], ...]:
    return tuple((f.number, f.bisect) for f in found())


def decisions() -> list[Decisions]:
    return [d for f in found() for d in f.decisions]


def expected_claims() -> dict[str, set[str]]:
    return {f.stem: set(f.claims) for f in found()}


def prefixes() -> dict[str, str]:
    return {f.prefix: f.stem for f in found()}


def decision_functions(d: Decisions) -> list[str]:
    """A deciding module's decisions: its decide_* functions and the others it names."""
    module = importlib.import_module(d.dotted)
    return sorted({n for n in dir(module) if n.startswith("decide_")} | set(d.also))
