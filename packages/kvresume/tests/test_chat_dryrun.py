"""The guard's dry run copies no cache: after check_resume_inputs the cache and its ledger are bitwise unchanged, on
every family (dense, sliding past its window, hybrid with linear states, multimodal, static), refused or passed."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import StaticCache

from kvresume import ResumeInputError, check_resume_inputs, testing as T, track
from kvresume.compat import generate_cache_kwarg, text_config
from kvresume.layers import cache_state_equal
from kvresume.ledger import stored_ledger


def _prefilled(kind: str, static: bool = False) -> tuple[torch.nn.Module, dict, object]:
    m = T.build(kind)
    track(m)
    p = T.prompt(kind)
    cut = {k: (v[:, :-1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v) for k, v in p.items()}
    if static:
        cache = StaticCache(config=text_config(m.config), max_cache_len=64)
        with torch.no_grad():
            m(**cut, **{T.cache_kw(m): cache}, use_cache=True)
        return m, p, cache
    return m, p, T.prefix_cache(m, p)


def _same(a: object, b: object) -> bool:
    la, lb = stored_ledger(a), stored_ledger(b)
    ledgers = (la is None and lb is None) or (la is not None and lb is not None and all(
        torch.equal(getattr(la, f), getattr(lb, f)) for f in ("token_ids", "positions", "mask")))
    slid = [getattr(x, "cumulative_length", None) for x in a.layers] == [getattr(x, "cumulative_length", None) for x in b.layers]
    return cache_state_equal(a, b) and ledgers and slid


@pytest.mark.parametrize("kind,static", [("dense", False), ("sliding", False), ("hybrid", False),
                                         ("multimodal", False), ("dense", True)])
@pytest.mark.parametrize("whole", [True, False])
def test_dry_run_leaves_cache_bitwise(kind: str, static: bool, whole: bool) -> None:
    m, p, cache = _prefilled(kind, static)
    before = copy.deepcopy(cache)
    ids = p["input_ids"] if whole else p["input_ids"][:, -1:]
    kwargs = {k: v for k, v in p.items() if k != "input_ids"}
    if kind == "multimodal" and not whole:  # the last text token alone: the image is cached already
        kwargs = {"attention_mask": p["attention_mask"]}
    try:
        check_resume_inputs(m, ids, **{generate_cache_kwarg(m): cache}, **kwargs)
    except ResumeInputError:
        pass
    except ValueError:  # generate()'s own error before the model (a suffix beside the whole image): nothing ran
        pass
    assert _same(before, cache)
