"""A cache whose every attention layer slides (no full-attention layer to fingerprint): the ledger checks the slots
the window still shows and is read only where every row still holds its own recorded tokens there; rows reordered
(beams, a selection) make it untracked, never read as if it matched. A tracked generate() past the window is read."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

from kvresume import guarded_generate, ledger_of, track
from kvresume.compat import generate_cache_kwarg
from kvresume.fingerprint import print_layer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, num_hidden_layers=2, use_sliding_window=True,
                                   sliding_window=8, max_window_layers=0, layer_types=["sliding_attention"] * 2,
                                   max_position_embeddings=4096)
    m = transformers.Qwen3ForCausalLM(cfg).eval()
    tracker = track(m)
    yield m
    tracker.remove()


def run(m, ids, **extra):
    with torch.no_grad():
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0,
                          return_dict_in_generate=True, **extra)


def test_a_generation_past_the_window_is_read(model):
    ids = torch.randint(10, 2000, (2, 12), generator=torch.Generator().manual_seed(0))
    out = run(model, ids)
    cache = out.past_key_values
    assert getattr(cache.layers[print_layer(cache)], "is_sliding", False) and cache.layers[-1].keys.shape[-2] < 17
    assert torch.equal(ledger_of(cache).token_ids, out.sequences[:, :-1])


def test_reordered_rows_are_untracked_not_misread(model):
    ids = torch.randint(10, 2000, (2, 12), generator=torch.Generator().manual_seed(1))
    out = run(model, ids)
    moved = copy.deepcopy(out.past_key_values)
    moved.reorder_cache(torch.tensor([1, 0]))
    assert ledger_of(moved) is None
    whole = torch.cat([out.sequences[:, :-1], out.sequences[:, -1:]], 1)  # the ids not reordered: silently wrong
    with torch.no_grad():  # untracked now: the guard makes no ledger claim (it passes, as without track())
        guarded_generate(model, whole, attention_mask=torch.ones_like(whole), max_new_tokens=1, pad_token_id=0,
                         **{generate_cache_kwarg(model): moved})
    beams = run(model, ids[:1], num_beams=3)  # the rows' histories reordered before the window: not followed
    assert ledger_of(beams.past_key_values) is None


def test_rows_holding_the_same_tokens_in_their_first_slots_are_read_each_as_its_own(model):
    """Two rows that start alike (a system prompt) hold equal fingerprints there: each row is compared with its own."""
    ids = torch.randint(10, 2000, (2, 6), generator=torch.Generator().manual_seed(2))
    ids[1, :3] = ids[0, :3]
    out = run(model, ids)  # 11 slots held, the window shows 8: two shared slots among them
    assert torch.equal(ledger_of(out.past_key_values).token_ids, out.sequences[:, :-1])
    moved = copy.deepcopy(out.past_key_values)
    moved.reorder_cache(torch.tensor([1, 0]))  # the rows swapped: their later slots differ, so untracked
    assert ledger_of(moved) is None
