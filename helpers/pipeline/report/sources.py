"""A source's setup beside this run's, and which source a notebook answers: its finding's; each source is declared
beside the finding that answers it (helpers/<package>/ask.py, found by helpers.findings.sources)."""
from __future__ import annotations

from typing import Any

from ...findings import Source, of, sources


def source_of(notebook: str) -> Source:
    """The source a notebook's finding answers (01_identity... -> the control); KeyError for an undeclared one."""
    return sources()[of(notebook).source]


def kind_of(claim: dict[str, Any]) -> str:
    """A claim's kind ('reproduces' where none is recorded)."""
    return claim.get("kind") or "reproduces"


def run_setup(envs: list[dict[str, Any]]) -> dict[str, str]:
    """This run's release, dtype, device and model over the notebooks of one source (values joined when they differ)."""
    def values(key: str) -> str:
        return ", ".join(dict.fromkeys("?" if env.get(key) in (None, "") else str(env[key]) for env in envs)) or "?"

    model = values("model_id")
    if any(str(env.get("model_id") or "").startswith("tiny-") for env in envs):
        model += " (tiny, random weights)"
    device = values("device")
    if not any(env.get("cuda_available") for env in envs):
        device += " (no CUDA)"
    return {"release": values("transformers"), "dtype": values("dtype"), "device": device, "model": model}


def setup_rows(source: Source, envs: list[dict[str, Any]]) -> tuple[list[tuple[str, str, str, str]], str]:
    """(rows of what, source, this run, same?) and one sentence stating the gap."""
    pairs = [(key, source.setup.get(key, "?"), ours) for key, ours in run_setup(envs).items()]
    rows = [(key, theirs, ours, "same" if theirs.split(" ")[0] == ours.split(" ")[0] else "differs")
            for key, theirs, ours in pairs]
    gaps = [f"{key} {ours} instead of {theirs}" for key, theirs, ours, same in rows if same == "differs"]
    gap = ("Gap: " + "; ".join(gaps) + ". Raw max |diff| is not comparable across it; top-1, top-5 "
           "overlap, cosine, ratios and the pass/fail pattern are.") if gaps else \
        "No gap in release, dtype, device or model."
    return rows, gap
