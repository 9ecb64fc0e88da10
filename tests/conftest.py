"""Shared fixtures: the tiny model and its prompt are built once per test worker."""
from __future__ import annotations

import os

# Set before torch is imported (OpenMP reads it once): waiting OpenMP threads sleep instead of spinning, so two
# test workers on two cores do not steal each other's cores (thread count and numbers unchanged; the runner's
# kernels get the same, helpers.pipeline.run.batch.CHILD_ENV).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from helpers import continuation, inputs, models  # noqa: E402


@pytest.fixture(scope="session")
def bundle() -> models.ModelBundle:
    return models.load(models.TINY_VL)


@pytest.fixture(scope="session")
def prompt(bundle: models.ModelBundle) -> inputs.Prompt:
    return inputs.build_prompt(bundle)


@pytest.fixture()
def prefix_cache(bundle: models.ModelBundle, prompt: inputs.Prompt):
    """A fresh cache of prompt[:-1] (prefill also resets the model-side rope state)."""
    from kvresume import compat

    compat.set_rope_state(bundle.model, None)
    return continuation.prefill(bundle.model, prompt)[1]


@pytest.fixture(scope="module")
def tiny() -> models.ModelBundle:
    """The tiny hybrid (linear + full attention) of notebook 05."""
    return models.load(models.TINY_HYBRID)


@pytest.fixture(scope="module")
def ids(tiny: models.ModelBundle):
    """The report's input shape scaled down: random ids, batch 2, 8 tokens."""
    from helpers.offload import loops

    return loops.random_ids(tiny.model, batch_size=2, seq_len=8, seed=0)
