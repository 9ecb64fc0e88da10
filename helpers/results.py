"""The results contract: every notebook writes outputs/results/<stem>.json with its claims.

Verdicts are computed here from measurements (`decide`), never typed in a notebook. The file is
written at the start (every claim `error`: not reached) and after every decision, so a notebook
that stops early still leaves an honest file behind.
"""
from __future__ import annotations

import json
import math
import platform
import sys
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import torch
import transformers

from .findings import quotes_of
from .pipeline.paths import output_dir
from .pipeline.run.record import run_stamp

# What each claim is, and the two verdicts a decision can give it (holds, does not hold):
# reproduces  - the source states it; the kit reproduces it or fails to (the only kind counted as "reproduced");
# refutes     - a hypothesis the source puts forward, tested; the claim's statement is the counter-statement the
#               kit measures, so holding means the hypothesis is refuted;
# beyond      - a control or finding the source proposed but did not run, or the kit's own;
# simulation  - a model of the hardware or of a race, run on this machine (labelled as such wherever shown);
# environment - a fact about the machine, never a finding.
KINDS: dict[str, tuple[str, str]] = {
    "reproduces": ("reproduced", "not_reproduced"),
    "refutes": ("refuted", "not_refuted"),
    "beyond": ("holds", "fails"),
    "simulation": ("holds", "fails"),
    "environment": ("holds", "fails"),
}
UNDECIDED = ("skipped", "error")
DECIDED = tuple(dict.fromkeys(v for pair in KINDS.values() for v in pair))
VERDICTS = DECIDED + UNDECIDED


def verdict_for(kind: str, holds: bool) -> str:
    """The verdict word of a decided claim of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown claim kind {kind!r}; valid: {sorted(KINDS)}")
    return KINDS[kind][0 if holds else 1]


@dataclass
class Claim:
    id: str
    statement: str
    verdict: str = "error"
    reason: str = "not reached: the notebook stopped before deciding this claim"
    evidence: dict[str, Any] = field(default_factory=dict)
    # one of KINDS: reproduces, refutes, beyond, simulation, environment (see above)
    kind: str = "reproduces"
    # The one or two values the verdict was computed from ({name: value}), and the source report's
    # value for the same quantity where it gives one ({name: value}); shown side by side in SUMMARY.md.
    deciding: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    # Short sentences shown under the claim's row: what a count counts, a value fixed by construction,
    # a fact of the source the tiny model does not show.
    notes: list[str] = field(default_factory=list)
    # The source passage the claim tests (helpers.quotes: source, verbatim text, role; {} where none is registered).
    quote: dict[str, Any] = field(default_factory=dict)


def to_jsonable(value: Any) -> Any:
    """Tensors, numpy scalars, tuples and NaNs turned into plain JSON values."""
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return to_jsonable(value.item())
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas' "no value" (a comparison that did not run)
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def environment(bundle: Any | None = None, **extra: Any) -> dict[str, Any]:
    """Versions, device and model identity that produced a run."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cuda_available": torch.cuda.is_available(),
        "device": "cpu",
        "device_name": platform.processor() or platform.machine(),
        "dtype": None,
        "attn_implementation": None,
        "model_id": None,
        "model_revision": None,
        "seed": None,
    }
    if bundle is not None:
        env.update(bundle.environment())
    env.update(extra)
    return to_jsonable(env)


class Results:
    """Claims of one notebook run, persisted after every change."""

    def __init__(self, notebook: str, claims: dict[str, str], env: dict[str, Any] | None = None,
                 path: Path | None = None, environment_checks: tuple[str, ...] = (),
                 kinds: dict[str, str] | None = None) -> None:
        """`kinds`: {claim id: kind} (KINDS); a claim in `environment_checks` is of kind environment."""
        self.notebook = notebook
        self.env = env or environment()
        kinds = {**{cid: "environment" for cid in environment_checks}, **(kinds or {})}
        unknown = sorted(set(kinds) - set(claims))
        if unknown:
            raise KeyError(f"kinds given for undeclared claims {unknown}")
        quotes = quotes_of(notebook)  # its own declaration only: a notebook loads no other finding
        self.claims = {cid: Claim(cid, text, kind=kinds.get(cid, "reproduces"), quote=quotes.get(cid, {}))
                       for cid, text in claims.items()}
        for claim in self.claims.values():
            verdict_for(claim.kind, True)  # pragma: no mutate (only the kind is checked here); an unknown kind is refused before any measurement
        self.extra: dict[str, Any] = {}
        self.warnings: list[str] = []  # transformers warnings captured by helpers.session, kept out of the cells
        self.run = run_stamp()  # the runner's run id (nulls when run by hand): see helpers/pipeline/run/record.py
        self.path = path or output_dir("results") / f"{notebook}.json"
        self.write()

    def _set(self, claim_id: str, **fields: Any) -> str:
        """Set fields of a declared claim, write the file, return its verdict."""
        if claim_id not in self.claims:
            raise KeyError(f"unknown claim {claim_id!r}; declared: {sorted(self.claims)}")
        claim = self.claims[claim_id]
        for name, value in fields.items():
            setattr(claim, name, value)
        self.write()
        return claim.verdict

    def decide(self, claim_id: str, holds: bool, evidence: dict[str, Any], why: str = "",
               deciding: dict[str, Any] | None = None, source: dict[str, Any] | None = None,
               notes: list[str] | tuple[str, ...] = ()) -> str:
        """Record a measured claim: its kind's verdict for `holds` (reproduced/not_reproduced for a source's
        statement, refuted/not_refuted for a hypothesis, holds/fails otherwise), with its evidence.

        `deciding`: the one or two values the verdict was computed from; `source`: the source report's
        value for the same quantity, where it gives one.
        """
        kind = self.claims[claim_id].kind if claim_id in self.claims else "reproduces"  # an unknown id: refused by _set
        return self._set(claim_id, verdict=verdict_for(kind, bool(holds)),
                         reason=why or ("the measurement matches the statement" if holds else
                                        "the measurement contradicts the statement"),
                         evidence=to_jsonable(evidence), deciding=to_jsonable(deciding or {}),
                         source=to_jsonable(source or {}), notes=[str(n) for n in notes])

    def record(self, claim_id: str, decision: Any) -> str:
        """decide() from a helpers.compare.Decision: its verdict, evidence, deciding and source values and notes."""
        return self.decide(claim_id, decision.holds, decision.evidence, decision.why, deciding=decision.deciding,
                           source=decision.source, notes=getattr(decision, "notes", ()))

    def warn(self, message: str) -> None:
        """Record one captured warning (once), for the environment sections of SUMMARY.md and the HTML."""
        text = " ".join(str(message).split())
        if text and text not in self.warnings:
            self.warnings.append(text)
            self.write()

    def skip(self, claim_id: str, reason: str, evidence: dict[str, Any] | None = None) -> str:
        """Record a claim that cannot be measured in this environment (for example: no CUDA)."""
        return self._set(claim_id, verdict="skipped", reason=reason, evidence=to_jsonable(evidence or {}))

    def fail(self, claim_id: str, exc: BaseException) -> str:
        """Record that an unexpected exception prevented deciding a claim."""
        return self._set(claim_id, verdict="error", reason=f"{type(exc).__name__}: {exc}"[:500],
                         evidence={"traceback": traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]})

    @contextmanager
    def guard(self, *claim_ids: str) -> Iterator[None]:
        """Run a measurement; an unexpected exception marks these claims `error` and is shown, not raised."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - recorded, printed, and the notebook goes on
            for cid in claim_ids:
                if self.claims[cid].verdict not in DECIDED + ("skipped",):
                    self.fail(cid, exc)
            print(f"[error] {', '.join(claim_ids)} not decided: {type(exc).__name__}: {exc}", file=sys.stderr)

    def add(self, key: str, value: Any) -> None:
        """Attach a measured table or series (anything the notebook shows) to the results file."""
        self.extra[key] = to_jsonable(value)
        self.write()

    def as_dict(self) -> dict[str, Any]:
        """The results file's content."""
        return {
            "notebook": self.notebook,
            "run": self.run,
            "environment": self.env,
            "claims": [asdict(c) for c in self.claims.values()],
            "measurements": self.extra,
            "warnings": self.warnings,
        }

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")  # replaced whole: a stop never leaves half a file
        tmp.write_text(json.dumps(self.as_dict(), indent=2, sort_keys=False) + "\n")
        tmp.replace(self.path)
        return self.path

    def table(self) -> Any:
        """The claims as a pandas DataFrame, for the notebook's verdict cell."""
        return pd.DataFrame([{"claim": c.id, "kind": c.kind, "verdict": c.verdict, "reason": c.reason}
                             for c in self.claims.values()])


def load(path: str | Path) -> dict[str, Any]:
    """Read a results file back."""
    return json.loads(Path(path).read_text())
