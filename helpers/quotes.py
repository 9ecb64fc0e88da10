"""What each claim tests, in the source's own words: one registry keyed by claim id.

A `reproduces` claim quotes the sentence or table row it tests, a `refutes` claim the hypothesis it tests,
verbatim (whitespace aside; tests/test_quotes.py checks every quote against the source texts); a `beyond`
claim names the passage it extends; a `simulation` claim the passage it models and, where it holds by
construction, how; an `environment` claim quotes nothing. helpers.results attaches the entry to each claim
of a results file, and SUMMARY.md shows it beside the verdict. Two claims quoting the same text test one
statement: it is counted once. A claim whose number another claim's measurement decides (`cites`) and a value
fixed by construction (`by_construction`) are listed apart, never counted as reproduced. Each finding's declaration
(helpers.findings) holds its claims' quotes; findings.quotes() is all of them. Passages several findings quote are
named here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# The public names of the sources (each declared, with its setup, in the helpers/<package>/ask.py answering it).
CONTROL = "control"  # the Qwen3-VL resume-contract control (transformers 5.14.1)
ISSUE_48947 = "48947"  # transformers issue #48947 (hybrid offloading drift)
NEW_IMAGE = "new-image"  # Qwen3-VL multi-turn resume with a new image (QwenLM/Qwen3-VL#1685, #1412): no text quoted
SERVE = "serve"  # `transformers serve` re-prefilling every turn (its 5.17.0 code's TODO): no text quoted
ROLLBACK = "rollback"  # hybrid rollback and continuation (transformers #49036, PR #45513, 5.25.0's cache rewrite): no text quoted

ROLES = {"reproduces": "states", "refutes": "hypothesis", "beyond": "extends", "simulation": "models",
         "environment": "machine"}


@dataclass(frozen=True)
class Quote:
    """A claim's source passage: `text` verbatim from source `source`; `role` how the claim uses it."""

    source: str
    text: str
    role: str
    by_construction: str = ""  # a simulation: what makes it hold whatever the hardware does
    not_decided: str = ""  # a fact of the quoted text this kit cannot decide here, and why
    answers: str = ""  # the source the claim answers where it is not the one quoted (a beyond claim of another thread)
    # the claim whose measurement decides this one too (the same call or number): the count takes it once, there
    cites: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v}


def passage(source: str, role: str, text: str, **extra: str) -> Quote:
    """A quote with its text's whitespace collapsed."""
    return Quote(source, " ".join(text.split()), role, **extra)


IDENTITY_15 = "Across the 15 valid original-versus-rebuilt first-step comparisons, the logits were also exactly identical."
SLICED = "The only unprocessed token had been sliced away before the model forward pass."
LENGTHS_35168 = ("Issue #35168 reported that layer-dependent cache lengths behaved differently between FlashAttention 2 "
                 "and SDPA/eager paths.")
VALIDATION = ("detect a non-empty cache combined with a short suffix and an attention mask that covers only that suffix, "
              "then raise a useful error or warning instead of silently slicing to an empty input.")
HYBRID = "- sliding/hybrid caches;"
IDENTITY = "- original cache versus identity-rebuilt cache;"
ENGINES = ("In-forward methods, patched attention implementations, and inference engines that own their resume state may "
           "cross a different boundary.")


def normalized(text: str) -> str:
    """Whitespace collapsed: how quotes are compared with the source texts."""
    return " ".join(str(text).split())
