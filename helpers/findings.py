"""The findings, one per notebook, each declared once beside its code (helpers/<package>/finding.py) and found here
by discovery, as are the sources they answer (helpers/<package>/ask.py: the source's entry and its Ask writer): every
list the kit keeps per notebook or source derives from them (quotes, the notebook's source, the Ask writers, bisect's
claims and functions, the deciding modules' mutation scope and decisions registry, the runner's estimates, README's
notebook table, the first screen's budget). A notebook loads its own declaration only (`of`). A declaration missing a
piece is refused by name when it is built; tests/test_findings.py checks they are complete.
Adding one (its files, its fields, `make generate`): docs/adding-a-finding.md."""
from __future__ import annotations

import ast
import functools
import importlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from .quotes import ROLES

ROOTS: list[tuple[Path, str]] = [(Path(__file__).resolve().parent, "helpers")]  # (folder, its dotted package)
KINDS = {role: kind for kind, role in ROLES.items()}  # a claim's kind, from the role of its quote
# The transformers functions whose change can move a finding's values, where several findings name them.
# "name|word": a long function of which only the diff hunks that mention `word` are kept.
GENERATE = ("transformers.generation.utils.GenerationMixin.generate|attention_mask",
            "transformers.generation.utils.GenerationMixin._prefill|mask",
            "transformers.generation.utils.GenerationMixin.prepare_inputs_for_generation",
            "transformers.generation.utils.GenerationMixin._prepare_attention_mask_for_generation",
            "transformers.generation.utils.GenerationMixin._prepare_cache_for_generation",
            "transformers.generation.utils.GenerationMixin._update_model_kwargs_for_generation")
QWEN3_VL = "transformers.models.qwen3_vl.modeling_qwen3_vl"


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
    source: str  # the key of the source it answers (a SOURCE of some helpers/<package>/ask.py)
    claims: dict[str, Any]  # claim id -> its helpers.quotes.Quote (its role gives the claim's kind)
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


@dataclass(frozen=True)
class Source:
    """One source the kit answers: its public name, its setup and what this kit cannot test of it."""

    key: str
    title: str
    setup: dict[str, str] = field(default_factory=dict)  # release, dtype, device, model (the source's own words)
    not_tested: str = ""
    # The first screen's plain-transformers repro: a file under examples/repro/ (torch and transformers only) and what
    # it prints beside the source's number.
    repro: str = ""
    repro_prints: str = ""
    short: str = ""  # the name on the first screen
    untested: str = ""  # the first screen's words for what is not tested here and why, where no count says it


def _modules(name: str) -> list[tuple[str, Path]]:
    """(dotted name, file) of every helpers/<package>/<name>.py under the roots."""
    return sorted((f"{pkg}.{p.parent.name}.{name}", p) for folder, pkg in ROOTS for p in folder.glob(f"*/{name}.py"))


@functools.lru_cache(maxsize=1)
def found() -> tuple[Finding, ...]:
    """Every declared finding, in notebook order (each declaration module's FINDING)."""
    return tuple(sorted((importlib.import_module(name).FINDING for name, _ in _modules("finding")), key=lambda f: f.stem))


@functools.lru_cache(maxsize=1)
def _asks() -> dict[str, Any]:
    """Each source's key -> the module declaring it (its SOURCE and `ask`), in the order of the first notebook
    answering it."""
    first = {}
    for f in found():
        first.setdefault(f.source, f.stem)
    mods = [importlib.import_module(name) for name, _ in _modules("ask")]
    return {m.SOURCE.key: m for m in sorted(mods, key=lambda m: first.get(m.SOURCE.key, "~"))}


@functools.lru_cache(maxsize=1)
def sources() -> dict[str, Source]:
    """Every declared source by key, in the order of the first notebook answering it."""
    return {key: m.SOURCE for key, m in _asks().items()}


def writer(source: str) -> Callable[..., Any]:
    """The Ask writer of a source (KeyError where no helpers/<package>/ask.py declares it)."""
    if source not in _asks():
        raise KeyError(f"source {source} has no Ask writer: no helpers/<package>/ask.py declares it")
    return _asks()[source].ask


def reset() -> None:
    """Forget what was found (after ROOTS changed)."""
    for cached in (found, _asks, sources, _declaring):
        cached.cache_clear()


@functools.lru_cache(maxsize=None)
def _declaring(number: str) -> str | None:
    """The declaration module of a notebook number, read from the files' `stem=` (nothing is imported)."""
    for name, path in _modules("finding"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "stem" and isinstance(node.value, ast.Constant) \
                    and str(node.value.value).split("_", 1)[0] == number:
                return name
    return None


def of(notebook: str | Path) -> Finding:
    """The finding of a notebook, by its stem's number ('05_hybrid...' or a path), importing its declaration alone;
    KeyError naming what to add."""
    name = _declaring(Path(str(notebook)).stem.split("_", 1)[0])
    if name is None:
        raise KeyError(f"no finding declares notebook {notebook}: add helpers/<package>/finding.py (see helpers/findings.py)")
    return importlib.import_module(name).FINDING


def quotes_of(notebook: str) -> dict[str, dict[str, Any]]:
    """A notebook's declared quotes as plain dicts ({} for a notebook no finding declares)."""
    try:
        return {cid: q.as_dict() for cid, q in of(notebook).claims.items()}
    except KeyError:
        return {}


def quotes() -> dict[str, Any]:
    return {cid: q for f in found() for cid, q in f.claims.items()}


def quote_for(claim_id: str) -> dict[str, Any]:
    """The declared quote of a claim as a plain dict ({} for a claim without one)."""
    entry = quotes().get(claim_id)
    return entry.as_dict() if entry else {}


def bisect_claims() -> tuple[tuple[str, str], ...]:
    return tuple((f.number, f.bisect) for f in found())


def decisions() -> list[Decisions]:
    return [d for f in found() for d in f.decisions]


def prefixes() -> dict[str, str]:
    return {f.prefix: f.stem for f in found()}


def decision_functions(d: Decisions) -> list[str]:
    """A deciding module's decisions: its decide_* functions and the others it names."""
    module = importlib.import_module(d.dotted)
    return sorted({n for n in dir(module) if n.startswith("decide_")} | set(d.also))
