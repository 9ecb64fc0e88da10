"""The row/slot decision functions, each fed a case that contradicts it: fingerprint matching (bits, NaN, a missing
row), the fingerprint layer (not a sliding one), prefix lengths (embedding slots), a stale prefix vs a ledger merely
shorter than the cache, the by-count fallback of a ledger without fingerprints, and a fold of embeddings."""
from __future__ import annotations

import copy

import torch

from kvresume import kv_cache_from_tensors, ledger_of, track
from kvresume.fingerprint import match, print_layer
from kvresume.ledger import UNKNOWN, Ledger, joined, stale_prefix, stored_ledger
from kvresume.row_checks import prefix_lengths
from kvresume.testing import build
from kvresume.writes import Write


def test_match_is_bitwise_and_reports_what_no_row_holds():
    recorded = torch.tensor([[[1.0, float("nan")], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]])  # [L=2, S=2, W=2]
    now = torch.stack([recorded[1], recorded[0], torch.tensor([[4.0, 5.0], [6.0, 7.5]])])  # rows 1, 0, half of 1
    index, found = match(now, recorded)
    assert index.tolist() == [[1, 1], [0, 0], [1, 0]]
    assert found.tolist() == [[True, True], [True, True], [True, False]]  # NaN equals itself; 7.5 is no row's
    assert not match(torch.tensor([[[0.0, -0.0]]]), torch.tensor([[[0.0, 0.0]]]))[1].all()  # -0.0: other bits


def test_the_fingerprint_layer_is_the_last_full_attention_one():
    m = build("sliding")
    with torch.no_grad():
        cache = m(input_ids=torch.arange(10, 30).view(1, -1), use_cache=True).past_key_values
    i = print_layer(cache)
    assert i == 3 and not getattr(cache.layers[i], "is_sliding", False)
    assert getattr(cache.layers[2], "is_sliding", False)  # the last layer with keys overall would be wrong here


def test_prefix_lengths_count_embedding_slots_and_stop_at_the_first_difference():
    led = Ledger(torch.tensor([[5, UNKNOWN, 7, 8], [5, 6, 9, 8]]), torch.zeros(1, 2, 4, dtype=torch.long),
                 torch.ones(2, 4, dtype=torch.long))
    assert prefix_lengths(led, torch.tensor([[5, 6, 7, 8, 1]])).tolist() == [[4], [2]]


def test_a_ledger_shorter_than_the_cache_is_untracked_not_stale():
    m = build("dense")
    ids = torch.arange(10, 22).view(1, -1)
    tracker = track(m)
    with torch.no_grad():
        cache = m(input_ids=ids, use_cache=True).past_key_values
    tracker.remove()
    longer = copy.deepcopy(cache)
    with torch.no_grad():
        m(input_ids=torch.tensor([[40, 41]]), past_key_values=longer)  # untracked, after the tracked slots
    assert ledger_of(longer) is None and stale_prefix(longer) is None
    changed = copy.deepcopy(cache)
    changed.layers[-1].keys[0, 0, 5, 0] += 1  # slot 5 edited by hand
    assert ledger_of(changed) is None and stale_prefix(changed) == (5, 12, 0)


def test_a_ledger_without_fingerprints_is_trusted_by_count_and_adopts_them_on_a_tracked_write():
    m = build("dense")
    ids = torch.arange(10, 22).view(1, -1)
    with torch.no_grad():
        pairs = [(l.keys, l.values) for l in m(input_ids=ids, use_cache=True).past_key_values.layers]
    cache = kv_cache_from_tensors(pairs, m.config, token_ids=ids)
    assert stored_ledger(cache).prints is None and ledger_of(cache).token_ids.equal(ids)
    twice = copy.deepcopy(cache)
    twice.batch_repeat_interleave(2)
    assert ledger_of(twice).batch == 2  # by count: a multiple of the rows repeats them
    with track(m), torch.no_grad():
        m(input_ids=torch.tensor([[50]]), past_key_values=cache, attention_mask=torch.ones(1, 13, dtype=torch.long))
    assert stored_ledger(cache).prints is not None and ledger_of(cache).token_ids[0, -1] == 50


def test_a_write_of_embeddings_without_positions_folds_to_unknown_ids_at_its_cache_positions():
    prints = torch.randn(2, 3, 8)
    writes = [Write(torch.tensor([[3, 4], [5, 6]]), torch.tensor([[0, 1], [0, 1]]), None, prints[:, :2], 3, None, 0, 2,
                    2), Write(None, None, None, prints[:, 2:3], 3, None, 2, 2, 1)]  # embeddings, no positions
    mixed = joined(writes)
    assert mixed.token_ids[:, 2].tolist() == [UNKNOWN, UNKNOWN] and mixed.positions[0, :, 2].tolist() == [2, 2]
    assert mixed.mask.tolist() == [[1, 1, 1]] * 2 and torch.equal(mixed.prints, prints)


def test_a_reset_cache_is_not_read_as_its_ledger():
    m = build("dense")
    with track(m), torch.no_grad():
        cache = m(input_ids=torch.arange(10, 22).view(1, -1), use_cache=True).past_key_values
    assert ledger_of(cache) is not None
    cache.reset()  # keys zeroed in place (5.17.0 keeps the length; 5.25.0 reports 0: an empty ledger)
    led = ledger_of(cache)
    assert led is None or led.length == 0
