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

import torch

from .pipeline.paths import output_dir
from .pipeline.record import run_stamp

VERDICTS = ("reproduced", "not_reproduced", "skipped", "error")


@dataclass
class Claim:
    id: str
    statement: str
    verdict: str = "error"
    reason: str = "not reached: the notebook stopped before deciding this claim"
    evidence: dict[str, Any] = field(default_factory=dict)
    # "finding" (a claim of a source report) or "environment_check" (a fact about the machine: never
    # counted with the findings, never "reproduced" in a summary's tally).
    kind: str = "finding"
    # The one or two values the verdict was computed from ({name: value}), and the source report's
    # value for the same quantity where it gives one ({name: value}); shown side by side in SUMMARY.md.
    deciding: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)


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
    import transformers

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
                 path: Path | None = None, environment_checks: tuple[str, ...] = ()) -> None:
        self.notebook = notebook
        self.env = env or environment()
        self.claims = {cid: Claim(cid, text, kind="environment_check" if cid in environment_checks else "finding")
                       for cid, text in claims.items()}
        self.extra: dict[str, Any] = {}
        self.run = run_stamp()  # the runner's run id (nulls when run by hand): see helpers/pipeline/record.py
        self.path = path or output_dir("results") / f"{notebook}.json"
        self.write()

    def _claim(self, claim_id: str) -> Claim:
        if claim_id not in self.claims:
            raise KeyError(f"unknown claim {claim_id!r}; declared: {sorted(self.claims)}")
        return self.claims[claim_id]

    def decide(self, claim_id: str, holds: bool, evidence: dict[str, Any], why: str = "",
               deciding: dict[str, Any] | None = None, source: dict[str, Any] | None = None) -> str:
        """Record a measured claim: reproduced if `holds`, else not_reproduced, with its evidence.

        `deciding`: the one or two values the verdict was computed from; `source`: the source report's
        value for the same quantity, where it gives one.
        """
        claim = self._claim(claim_id)
        claim.verdict = "reproduced" if bool(holds) else "not_reproduced"
        claim.reason = why or ("the measurement matches the statement" if holds else "the measurement contradicts the statement")
        claim.evidence = to_jsonable(evidence)
        claim.deciding = to_jsonable(deciding or {})
        claim.source = to_jsonable(source or {})
        self.write()
        return claim.verdict

    def skip(self, claim_id: str, reason: str, evidence: dict[str, Any] | None = None) -> str:
        """Record a claim that cannot be measured in this environment (for example: no CUDA)."""
        claim = self._claim(claim_id)
        claim.verdict, claim.reason, claim.evidence = "skipped", reason, to_jsonable(evidence or {})
        self.write()
        return claim.verdict

    def fail(self, claim_id: str, exc: BaseException) -> str:
        """Record that an unexpected exception prevented deciding a claim."""
        claim = self._claim(claim_id)
        claim.verdict = "error"
        claim.reason = f"{type(exc).__name__}: {exc}"[:500]
        claim.evidence = {"traceback": traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]}
        self.write()
        return claim.verdict

    @contextmanager
    def guard(self, *claim_ids: str) -> Iterator[None]:
        """Run a measurement; an unexpected exception marks these claims `error` and is shown, not raised."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - recorded, printed, and the notebook goes on
            for cid in claim_ids:
                if self.claims[cid].verdict not in ("reproduced", "not_reproduced", "skipped"):
                    self.fail(cid, exc)
            print(f"[error] {', '.join(claim_ids)} not decided: {type(exc).__name__}: {exc}", file=sys.stderr)

    def add(self, key: str, value: Any) -> None:
        """Attach a measured table or series (anything the notebook shows) to the results file."""
        self.extra[key] = to_jsonable(value)
        self.write()

    def as_dict(self) -> dict[str, Any]:
        return {
            "notebook": self.notebook,
            "run": self.run,
            "environment": self.env,
            "claims": [asdict(c) for c in self.claims.values()],
            "measurements": self.extra,
        }

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")  # replaced whole: a stop never leaves half a file
        tmp.write_text(json.dumps(self.as_dict(), indent=2, sort_keys=False) + "\n")
        tmp.replace(self.path)
        return self.path

    def table(self) -> Any:
        """The claims as a pandas DataFrame, for the notebook's verdict cell."""
        import pandas as pd

        return pd.DataFrame([{"claim": c.id, "verdict": c.verdict, "reason": c.reason} for c in self.claims.values()])


def load(path: str | Path) -> dict[str, Any]:
    """Read a results file back."""
    return json.loads(Path(path).read_text())
