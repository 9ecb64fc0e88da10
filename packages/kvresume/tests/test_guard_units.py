"""kvresume.guard's parts on stand-ins (no model runs): the positions a model without a rotary embedding is checked
with (given, else the cache positions of what is fed; the decoder's for an encoder-decoder), and which checks a single
forward call gets (those on its arguments, then those on its positions where it is given them)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from kvresume import guard

T = torch.tensor


def model(enc_dec=False):
    return SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=enc_dec))


def call(enc_dec=False, rows=2, f=3, held=(5, 7)):
    return SimpleNamespace(model=model(enc_dec), given_rows=rows, f=f, lengths=held)


def test_without_positions_given_the_cache_positions_of_what_is_fed():
    got = guard.cache_positions(call(), {})
    assert got.shape == (1, 2, 3) and torch.equal(got, T([[[5, 6, 7], [5, 6, 7]]]))
    assert torch.equal(guard.cache_positions(call(rows=1, f=1, held=(0, 4)), {}), T([[[0]]]))


def test_positions_given_are_read_as_rows_the_decoders_for_an_encoder_decoder():
    given = T([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert torch.equal(guard.cache_positions(call(), {"position_ids": given}), T([[[2, 3, 4], [6, 7, 8]]]))
    dec = {"position_ids": given, "decoder_position_ids": T([[9, 9, 9]])}
    assert torch.equal(guard.cache_positions(call(enc_dec=True), dec), T([[[9, 9, 9], [9, 9, 9]]]))
    assert torch.equal(guard.cache_positions(call(enc_dec=True), {"position_ids": given})[0, 0], T([5, 6, 7]))
    assert torch.equal(guard.cache_positions(call(), {"position_ids": [1, 2, 3]})[0, 0], T([5, 6, 7]))  # not a tensor


@pytest.fixture
def checked(monkeypatch):
    seen = []
    monkeypatch.setattr(guard, "run_checks", lambda c, positions=None: seen.append(
        (c, positions, None if c is None or c.fed_positions is None else c.fed_positions.clone())))
    return seen


def test_a_forward_call_is_checked_on_its_arguments_then_on_the_positions_it_is_given(checked):
    ids, cache = T([[1, 2], [3, 4]]), DynamicCache()
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    guard.check_forward_call(m, {"input_ids": ids, "past_key_values": cache, "position_ids": T([[4, 5], [6, 7]])})
    (first, p1, _), (second, p2, fed) = checked
    assert first is second and first.cache is cache and first.model is m and (p1, p2) == (False, True)
    assert torch.equal(fed, T([[[4, 5], [6, 7]]]))


def test_a_forward_call_without_positions_or_without_a_cache_gets_its_argument_checks_only(checked):
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "past_key_values": DynamicCache()})
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "position_ids": T([[0, 1]])})
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "past_key_values": DynamicCache(), "position_ids": [0, 1]})
    guard.check_forward_call(m, {"input_ids": T([[]]).long(), "past_key_values": DynamicCache(),
                                 "position_ids": T([[]]).long()})  # nothing fed
    assert [p for _, p, _ in checked] == [False] * 4 and checked[1][0] is None


def test_an_encoder_decoders_forward_call_is_checked_on_the_decoders_positions(checked):
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
    guard.check_forward_call(m, {"input_ids": T([[1, 2, 3]]), "decoder_input_ids": T([[7]]), "cache": DynamicCache(),
                                 "position_ids": T([[0, 1, 2]]), "decoder_position_ids": T([[4]])})
    assert [p for _, p, _ in checked] == [False, True] and torch.equal(checked[1][2], T([[[4]]]))
    checked.clear()
    guard.check_forward_call(m, {"decoder_input_ids": T([[7]]), "cache": DynamicCache(), "position_ids": T([[0]])})
    assert [p for _, p, _ in checked] == [False]
