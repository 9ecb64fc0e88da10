"""Notebook start-up: declare the claims, write the results file, load the model, show the environment."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import pandas as pd
from transformers.utils import logging as hf_logging

from .models import ModelBundle, load, public_model_id
from .results import Results, environment


def start(notebook: str, claims: dict[str, str], model_id: str, revision: str | None = None,
          dtype: str = "float32", attn_implementation: str = "sdpa", device: str = "cpu", seed: int = 0,
          trust_remote_code: bool = False, environment_checks: tuple[str, ...] = (),
          kinds: dict[str, str] | None = None) -> tuple[Results, ModelBundle]:
    """Results file first (so a failed load is recorded), then the model; returns (results, bundle).

    `environment_checks`: claim ids that state facts about the machine, not findings of a source;
    `kinds`: {claim id: kind} for the others (helpers.results.KINDS; undeclared: reproduces).
    """
    entered = time.time()
    res = begin(notebook, claims, model_id, revision, dtype, attn_implementation, device, seed, environment_checks, kinds)
    built = time.time()
    try:
        bundle = load(model_id, revision, dtype, attn_implementation, device, seed, trust_remote_code)
    except Exception as exc:
        for claim_id in claims:
            res.fail(claim_id, exc)
        raise
    res.env = environment(bundle)
    res.write()
    # tell the runner (KVKIT_TIMINGS_FILE, set only by it) when start-up began and what the model cost
    timings = {"entered": entered, "results_s": built - entered, "model_build_s": time.time() - built}
    if path := os.environ.get("KVKIT_TIMINGS_FILE"):
        with contextlib.suppress(OSError):  # timings are a benchmark aid, never a reason to fail a notebook
            Path(path).write_text(json.dumps({k: round(v, 3) for k, v in timings.items()}))
    return res, bundle


def begin(notebook: str, claims: dict[str, str], model_id: str, revision: str | None = None, dtype: str = "float32",
          attn_implementation: str = "sdpa", device: str = "cpu", seed: int = 0,
          environment_checks: tuple[str, ...] = (), kinds: dict[str, str] | None = None) -> Results:
    """The results file of a notebook whose model runs elsewhere (a server): its claims and parameters, written."""
    res = Results(notebook, claims, environment(model_id=public_model_id(model_id), model_revision=revision, dtype=dtype,
                                                attn_implementation=attn_implementation, device=device, seed=seed),
                  environment_checks=environment_checks, kinds=kinds)
    capture_warnings(res)
    res.write()
    return res


def show_environment(res: Results) -> Any:
    """The environment block as a one-column DataFrame."""
    return pd.DataFrame({"value": res.env}).rename_axis("environment")


# transformers' fallback warnings ("`causal_conv1d_fn` is falling back to the torch implementation ...") go to
# its logger's stderr handler and would print as red blocks in the shared cells; session.start captures them
# into the results file instead (listed once in SUMMARY.md's and the HTML's environment sections).
FALLBACK = re.compile(r"fall(?:ing|s)? back|fallback|fast path is not available", re.IGNORECASE)


class WarningCapture(logging.Filter):
    """A filter on transformers' logger and handlers: fallback warnings are recorded in the results, not printed."""

    def __init__(self) -> None:
        super().__init__("transformers")
        self.results: Results | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.results is None or record.levelno < logging.WARNING or not record.name.startswith("transformers"):
            return True
        if not FALLBACK.search(message):
            return True
        self.results.warn(message)
        return False


_CAPTURE = WarningCapture()


def capture_warnings(res: Results | None) -> WarningCapture:
    """Install the capture once (on transformers' root logger and its handlers) and point it at `res` (None: the
    warnings print as before)."""
    root = hf_logging.get_logger()  # the library's root logger, "transformers"
    for target in (root, *root.handlers):
        if _CAPTURE not in target.filters:
            target.addFilter(_CAPTURE)
    _CAPTURE.results = res
    return _CAPTURE
