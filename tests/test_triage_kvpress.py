"""Notebook 06 on kvpress itself (0.5.5, requirements-nodeps.txt): its KnormPress (slots kept by score, per head) and
StreamingLLMPress (the first and the last slots) on the tiny Qwen3-VL, applied as its README does
(examples/kvpress_real.py). Each gives the cache the kit's line-for-line rebuild gives (examples/kvpress_presses.py),
and 06 names an eviction whose order is harmless and the positions cause, as on the rebuilds."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from test_triage_order import assert_eviction_with_positions_cause

from helpers import continuation
from helpers.triage import rebuilds
from helpers.triage import run as triage_run
from kvresume import compat

REAL = ("examples/kvpress_real.py:knorm", "examples/kvpress_real.py:streaming_llm")


@pytest.fixture(scope="module", autouse=True)
def _attention_takes_past_key_values(bundle) -> None:
    """kvpress 0.5.5's hook reads the attention layer's kwargs["past_key_values"]; from 5.24.0 layers get `cache`."""
    if compat.cache_kwarg(bundle.model) != "past_key_values":
        pytest.skip("kvpress 0.5.5 reads the attention layer's kwargs['past_key_values']: this release passes `cache`")


@pytest.mark.parametrize("name", ["knorm", "streaming_llm"])
def test_the_real_press_writes_the_rebuilds_cache(bundle, prompt, name):
    compat.set_rope_state(bundle.model, None)
    real = rebuilds.load(f"examples/kvpress_real.py:{name}")(None, bundle.model, prompt)
    cache = continuation.prefill(bundle.model, prompt)[1]
    rebuilt = rebuilds.load(f"examples/kvpress_presses.py:{name}")(copy.deepcopy(cache), None, None)
    for a, b, whole in zip(*(compat.cache_layers(c) for c in (real, rebuilt, cache))):
        assert a.keys.shape[-2] == b.keys.shape[-2] < whole.keys.shape[-2], "kvpress kept fewer slots than it was given"
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), "the same slots in the same order"


@pytest.fixture(scope="module")
def measured(bundle, prompt) -> dict[str, Any]:
    compat.set_rope_state(bundle.model, None)
    base = triage_run.prepare(bundle, prompt)
    specs = {"identity": rebuilds.load("identity"), **{rebuilds.label(s): rebuilds.load(s) for s in REAL}}
    verdicts = triage_run.triage_all(base, triage_run.apply_all(base, specs))
    return {"base": base, **{k: r.verdict for k, r in verdicts.items()}}


@pytest.mark.parametrize("spec", REAL)
def test_06_names_the_eviction_and_its_positions_cause_on_kvpress(measured, spec):
    assert_eviction_with_positions_cause(measured[rebuilds.label(spec)], measured["base"].floor)
