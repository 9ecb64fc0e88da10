"""kvresume.pool's decisions at their boundaries, fast (a few generate() calls of 3 tokens on a tiny model, each equal
to the model's own generate()): what the pool keeps under its token and byte budgets (exactly at a budget, one
over, one cache alone over it, a cache it cannot follow), which pooled cache a call resumes (the longest prefix of
the same identity, the first of equal ones, none), a shared prefix exactly at `min_share` of the prompt and one token
under it, a branch, the pool switched off, and a guard's refusal re-prefilled with its check named. The long chats:
test_pool.py (`make test`)."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvresume import compat
from kvresume import pool as pool_mod
from kvresume.call import refuse
from kvresume.ledger import ledger_of, without_ledger
from kvresume.pool import Pool, identity
from kvresume.testing import build

GREEDY = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build("llama")


@pytest.fixture
def pool(model) -> Pool:
    return Pool(model)  # (tracks the model: the caches below get ledgers)


def plain(model, x=None, **kw) -> torch.Tensor:
    with torch.no_grad():
        return type(model).generate(model, x, **{**GREEDY, **kw})


@torch.no_grad()
def prefill(model, x: torch.Tensor, rows: int = 1):
    cache = DynamicCache(config=compat.text_config(model.config))
    x = x.repeat(rows, 1)
    model(x, attention_mask=torch.ones_like(x), past_key_values=cache, use_cache=True)
    return cache


def tensor_bytes(cache) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def test_the_token_budget_keeps_exactly_its_tokens_evicts_the_oldest_and_a_lone_cache_over_it(pool, model):
    me, c10, c12 = identity(model), prefill(model, ids(10, 1)), prefill(model, ids(12, 2))
    assert pool_mod._length(c10) == 10 and pool_mod._length(without_ledger(c10)) == 0
    pool.max_tokens = 22
    pool._keep(me, c10)
    pool._keep(me, c12)
    assert list(pool.entries) == [1, 2] and pool.held == 22 and not pool.over()  # exactly the budget: both kept
    pool.max_tokens = 21
    pool._keep(me, prefill(model, ids(11, 3)))  # 33 > 21: the oldest go first, the newest (11) stays
    assert list(pool.entries) == [3] and pool.held == 11
    pool.max_tokens = 10
    pool._keep(me, prefill(model, ids(11, 4)))  # alone and over: nothing kept
    assert pool.entries == {} and pool.held == 0
    pool._keep(me, without_ledger(c10))  # a cache the pool cannot follow is not kept
    assert pool.entries == {} and pool._next == 4


def test_the_byte_budget_keeps_exactly_its_bytes(pool, model):
    me, cache = identity(model), prefill(model, ids(10, 1))
    size = tensor_bytes(cache)
    assert pool_mod._bytes(cache) == size and size > 0
    pool.max_bytes = size
    pool._keep(me, cache)
    assert pool.held_bytes == size and not pool.over() and len(pool.entries) == 1
    pool.max_bytes = size - 1
    assert pool.over()
    pool.max_bytes, pool.max_tokens = None, 10
    assert not pool.over()  # no byte budget: the tokens alone, exactly at theirs
    pool.max_tokens = 9
    assert pool.over()


def test_the_best_cache_is_the_longest_prefix_of_the_same_identity_the_first_of_equals(pool, model):
    me, x = identity(model), ids(12, 5)
    short, first, second = prefill(model, x[:, :6]), prefill(model, x[:, :10]), prefill(model, x[:, :10])
    other_weights = prefill(model, x)  # the whole prefix, but kept under another identity
    two_rows = prefill(model, x, rows=2)  # several rows: not a pooled chat
    for who, cache in ((me, short), (me, first), (me, second), ("other", other_weights), (me, two_rows)):
        pool._next += 1
        pool.entries[pool._next] = (who, cache)
    key, cache, common = pool._best(torch.cat([x, ids(2, 6)], 1), me)
    assert (key, common) == (2, 10) and cache is first
    assert list(pool.entries) == [1, 3, 4, 5, 2]  # the one resumed is the most recently used
    assert pool._best(ids(8, 7), me) == (None, None, 0)  # no cache shares a token
    assert pool._best(x, "nobody")[0] is None


def test_a_chat_turn_new_then_extended_then_branched_each_equal_to_generate(pool, model):
    seen = []
    pool.on_record = seen.append
    x = ids(20)
    got = pool.generate(x, **GREEDY)
    assert torch.equal(got, plain(model, x))
    assert (pool.last.prompt, pool.last.reused, pool.last.fed, pool.last.reason) == (20, 0, 20, "new")
    assert pool.last.detail == "no pooled cache shares a prefix" and pool.held == 22 and seen == [pool.last]
    y = torch.cat([got, ids(2, 1)], 1)  # 25 tokens, the 22 cached first
    got = pool.generate(input_ids=y, **GREEDY)
    assert torch.equal(got, plain(model, y))
    assert (pool.last.reused, pool.last.fed, pool.last.reason) == (22, 3, "extends")
    assert len(pool.entries) == 1 and pool.held == 27  # the extended cache replaces the one it extends
    assert torch.equal(pool.generate(x, **GREEDY), plain(model, x))  # a branch: the longer path stays pooled
    assert pool.last.reused == 19 and sorted(pool_mod._length(c) for _, c in pool.entries.values()) == [22, 27]
    assert len(seen) == 3 and "reused" in pool.last.line()


@pytest.mark.parametrize("shared, reused", [(5, 5), (4, 0)])  # 5 of 20: exactly min_share; 4: one under
def test_a_shared_prefix_exactly_at_min_share_is_resumed_one_under_is_not(pool, model, shared, reused):
    x = ids(20)
    pool.generate(x, **GREEDY)
    y = torch.cat([x[:, :shared], ids(20 - shared, 99) % 1000 + 1000], 1)  # ids(20) draws under 1000 here: apart
    assert ledger_of(pool.entries[1][1]).common_prefix(y) == shared
    assert torch.equal(pool.generate(y, **GREEDY), plain(model, y))
    assert pool.last.reused == reused
    if not reused:
        assert pool.last.reason == "new" and pool.last.detail == (
            "the longest pooled prefix (4 tokens) is under 25% of the prompt: re-prefilled")


def test_off_and_calls_without_one_row_of_ids_are_the_models_own_generate(model):
    off = Pool(model, enabled=False)
    x = ids(12)
    assert torch.equal(off.generate(x, **GREEDY), plain(model, x))
    assert (off.last.reason, off.last.detail, off.last.reused, off.last.fed) == ("re-prefilled", "the pool is off", 0, 12)
    assert off.entries == {}
    on = Pool(model)
    embeds = model.get_input_embeddings()(x)
    assert torch.equal(on.generate(inputs_embeds=embeds, **GREEDY), plain(model, inputs_embeds=embeds))
    assert (on.last.prompt, on.last.detail) == (0, "not one row of input ids") and on.entries == {}


def test_a_guards_refusal_is_re_prefilled_with_its_check_and_the_first_line_of_its_cause(pool, model, monkeypatch):
    def refused(*_a, **_k):
        raise refuse("ledger_tokens", "the cache holds other tokens\nsecond line")

    monkeypatch.setattr(pool_mod, "resume", refused)
    x = ids(12)
    assert torch.equal(pool.generate(x, **GREEDY), plain(model, x))
    assert pool.last.reason == "re-prefilled" and pool.entries == {}
    assert pool.last.detail == "the guard refused the resume (ledger_tokens): the cache holds other tokens"
