"""A tracked model pickled (pickle, torch.save): the copy loads untracked in any process, answers as the original,
and records again once tracked; the original stays tracked (kvresume.pickling)."""
from __future__ import annotations

import io
import pickle

import pytest
import torch
from transformers import DynamicCache

from kvresume import ledger_of, resume, track
from kvresume.testing import build
from kvresume.tracking import is_tracked

GREEDY = dict(max_new_tokens=4, do_sample=False)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 100, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_pickled_tracked_model_loads_untracked_and_answers_alike(how):
    model = build("dense")
    track(model)
    ids = _ids(12)
    want = model.generate(ids, **GREEDY)
    if how == "pickle":
        copy = pickle.loads(pickle.dumps(model))
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        copy = torch.load(buf, weights_only=False)
    assert is_tracked(model) and not is_tracked(copy)
    cache = DynamicCache(config=copy.config)
    assert torch.equal(copy.generate(ids, past_key_values=cache, **GREEDY), want)
    assert ledger_of(cache) is None, "the loaded copy's hooks record nothing"
    track(copy)
    assert is_tracked(copy)
    cache = DynamicCache(config=copy.config)
    first = copy.generate(ids, past_key_values=cache, **GREEDY)
    assert ledger_of(cache) is not None
    whole = torch.cat([first, _ids(6, 1)], 1)
    new = GREEDY["max_new_tokens"]
    got = resume(copy, whole, cache, **GREEDY)[:, -new:]
    assert torch.equal(got, copy.generate(whole, **GREEDY)[:, -new:]), "hit equals miss"


def test_a_pickled_tracked_vision_model_encodes_with_its_own_method():
    model = build("multimodal")
    track(model)
    copy = pickle.loads(pickle.dumps(model))
    assert not is_tracked(copy)
    owner = getattr(copy, "base_model", copy)
    for name, method in vars(owner).items():  # 5.25: the tracker's encoder wrappers come back as plain methods
        if name.startswith("get_") and callable(method):
            assert getattr(method, "__self__", None) is owner, name
