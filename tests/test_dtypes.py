"""End-to-end: notebooks 02-04 reach the default's verdicts in half precision and with eager attention.

The noise floors are measured per run (helpers.compare.noise_floor), so one decision rule has to hold in
every dtype: float16 + eager for 02-04 (both parameters in one run each, to keep `make test` short) and
bfloat16 for 04, where the smallest claimed effect sits closest to the floor (~1.7x the threshold).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.results import verdict_for
from tinyfacts import NOT_ON_TINY  # tests/ is on sys.path

from helpers.pipeline.run import batch
from helpers.pipeline.paths import repo_root

NOTEBOOKS = repo_root() / "notebooks"
HALF_EAGER = {"dtype": "float16", "attn_implementation": "eager"}
BF16 = {"dtype": "bfloat16"}
RUNS = [("02_mask_position_matrix", HALF_EAGER), ("03_rope_deltas_perturbation", HALF_EAGER),
        ("04_token_boundary_double_processing", HALF_EAGER), ("04_token_boundary_double_processing", BF16)]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Each parameter set's notebooks as one recorded run (one warm process each); {parameters' id: output dir}."""
    out = {}
    for params in (HALF_EAGER, BF16):
        key = "-".join(params.values())
        out[key] = tmp_path_factory.mktemp(key)
        os.environ["KVKIT_OUTPUT_DIR"] = str(out[key])
        try:
            results = batch.run_all(params, paths=[NOTEBOOKS / f"{s}.ipynb" for s, p in RUNS if p is params])
        finally:
            del os.environ["KVKIT_OUTPUT_DIR"]
        assert all(r.ok for r in results), [(r.notebook, r.error) for r in results if not r.ok]
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("stem,params", RUNS, ids=[f"{s[:2]}-{'-'.join(p.values())}" for s, p in RUNS])
def test_same_verdicts_in_every_dtype(outputs: dict[str, Path], stem: str, params: dict):
    data = json.loads((outputs["-".join(params.values())] / "results" / f"{stem}.json").read_text())
    assert {k: data["environment"][k] for k in params} == params
    for claim in data["claims"]:
        if claim["id"] in NOT_ON_TINY:  # a tiny random model decides it by chance: a rate, not a verdict
            assert claim["verdict"] == "skipped" and "by chance" in claim["reason"], claim["id"]
            continue
        assert claim["verdict"] == verdict_for(claim["kind"], True), (claim["id"], claim["reason"], claim["deciding"])
        if "noise_threshold" in claim["evidence"]:
            assert claim["evidence"]["noise_dtype"] == params["dtype"]
