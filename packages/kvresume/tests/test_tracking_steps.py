"""Where a tracked write starts (kvresume.steps), each fed the case that contradicts it: the decode step's fast path
only while nothing changed since the last write, `started` reading the fingerprint layer and leaving a fitting ledger as
it is, and a ledger whose rows cannot be followed to a batch it does not divide left untracked."""
from __future__ import annotations

import copy

import pytest
import torch

from kvresume import track
from kvresume.fingerprint import LAYER_ATTR, known_layer
from kvresume.ledger import TAIL, ledger_owner, stored_ledger
from kvresume.steps import continued, rebase, started
from kvresume.testing import build
from kvresume.writes import recorded

IDS = torch.arange(10, 22).view(2, 6)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    return build("dense")


def _tracked(m: torch.nn.Module) -> object:
    with track(m), torch.no_grad():
        return m(input_ids=IDS, use_cache=True).past_key_values


def test_a_decode_step_continues_only_while_nothing_changed_since_the_last_write(dense):
    cache = _tracked(dense)
    layer = known_layer(cache)
    owner, grown = ledger_owner(cache), cache.layers[known_layer(cache)]
    tail, other = owner.__dict__[TAIL], (layer + 1) % len(cache.layers)
    assert continued(cache, 2) is tail and (tail.length, tail.layer, tail.grown) == (6, layer, grown)
    assert continued(cache, 1) is None  # other rows fed
    tail.layer = len(cache.layers)
    assert continued(cache, 2) is None  # a layer the cache does not have
    tail.layer = other
    assert continued(cache, 2) is None  # another layer than the one grown
    tail.layer, tail.grown = layer, copy.copy(grown)
    assert continued(cache, 2) is None  # the layer object was replaced
    tail.grown = grown
    owner.__dict__[LAYER_ATTR] = other
    assert continued(cache, 2) is None  # the fingerprint layer moved
    owner.__dict__[LAYER_ATTR] = layer
    cache.crop(-2)  # two slots off (5.25.0 refuses a positive length)
    assert continued(cache, 2) is None  # cropped: the keys are shorter than the ledger


def test_started_reads_the_fingerprint_layer_and_keeps_a_fitting_ledger(dense):
    cache = _tracked(dense)
    before = stored_ledger(cache)
    layer = known_layer(cache)
    assert started(cache, 2) == (6, layer, cache.layers[layer]) and stored_ledger(cache) is before
    assert started(cache, 3) is None  # the fed rows are not the cache's


def test_rows_that_cannot_be_followed_to_a_batch_the_ledger_does_not_divide_leave_the_cache_untracked(dense):
    cache = _tracked(dense)
    lay = cache.layers[known_layer(cache)]
    lay.keys = lay.keys.half()  # its fingerprints no longer compare with the recorded ones
    assert rebase(cache, 6, 3) is False and recorded(cache) is None
