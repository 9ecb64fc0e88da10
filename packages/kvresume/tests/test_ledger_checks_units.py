"""The ledger checks' boundaries on hand-made ledgers (no model runs): where a row continues beside a mask that hides
its last cached slots (ended early), at and one short of the cached width; the rows generate() repeats
(num_return_sequences) read against the expanded cache; the position_ids a refusal fits to a padded fed row."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvresume import ledger_checks as lc
from kvresume.call import ResumeCall, ResumeInputError
from kvresume.ledger import empty_ledger, ledger_from_tensors

T = torch.tensor


def led(ids, positions=None, mask=None):
    return ledger_from_tensors(T(ids), None if positions is None else T(positions), None if mask is None else T(mask))


def call(ledger, n, *, fed=None, given=None, mask=None, fed_pos=None, fed_ids=None) -> ResumeCall:
    return ResumeCall(cache=SimpleNamespace(), n=n, fed=fed, attention_mask=None if mask is None else T(mask),
                      given_ids=None if given is None else T(given), ledger=ledger,
                      fed_positions=None if fed_pos is None else T(fed_pos), fed_ids=None if fed_ids is None else T(fed_ids))


def refused(check, c: ResumeCall) -> ResumeInputError:
    with pytest.raises(ResumeInputError) as info:
        check(c)
    return info.value


def same(a: torch.Tensor, b) -> bool:
    b = torch.as_tensor(b)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


TWO = led([[1, 2, 3], [4, 5, 6]])  # both rows continue at 3


# attended_next: where each row continues beside the mask given

def test_a_row_whose_last_slot_the_mask_hides_continues_after_its_last_attended_slot():
    assert same(lc.attended_next(TWO, T([[1, 1, 1, 1], [1, 1, 0, 1]])), [3, 2])
    assert same(lc.attended_next(TWO, T([[1, 1, 1, 1], [1, 0, 1, 1]])), [3, 3])  # a hole before an attended slot


def test_a_mask_exactly_as_wide_as_the_cache_is_read_one_column_short_is_not():
    assert same(lc.attended_next(TWO, T([[1, 1, 1], [1, 0, 0]])), [3, 1])
    assert same(lc.attended_next(TWO, T([[1, 1], [1, 0]])), [3, 3])


def test_a_row_attending_only_slot_zero_continues_at_one_a_row_attending_none_at_the_ledgers():
    assert same(lc.attended_next(TWO, T([[1, 0, 0, 1], [0, 0, 0, 1]])), [1, 3])


def test_slots_written_as_padding_do_not_count_as_attended():
    padded = led([[1, 2, 3], [4, 5, 6]], mask=[[1, 1, 1], [1, 1, 0]])
    assert same(lc.attended_next(padded, T([[1, 1, 1, 1], [1, 1, 1, 1]])), [3, 2])


def test_masks_of_other_rows_or_shapes_leave_the_ledgers_next_positions():
    assert same(lc.attended_next(TWO, None), [3, 3])
    assert same(lc.attended_next(TWO, T([[1, 1, 0, 1]])), [3, 3])  # one row for two
    assert same(lc.attended_next(TWO, T([[1, 1, 0, 1]] * 3)), [3, 3])  # three rows for two
    assert same(lc.attended_next(TWO, T([[[[1, 1, 1, 1]]], [[[1, 1, 0, 1]]]])), [3, 3])  # a 4-D mask
    assert same(lc.attended_next(TWO, T([[[1, 1, 1, 1]], [[1, 1, 0, 1]]])), [3, 3])  # a 3-D mask


# next_positions: the position_ids a refusal passes

def test_next_positions_count_each_rows_attended_fed_tokens_from_start_padding_at_one():
    ledger = led([[1, 2], [3, 4]])
    got = lc.next_positions(ledger, 3, T([5, 7]), T([[1, 1, 1], [0, 1, 1]]))
    assert same(got, [[5, 6, 7], [1, 7, 8]])
    assert same(lc.next_positions(ledger, 2, T([5, 7])), [[5, 6], [7, 8]])  # from start, not the ledger's 2


def test_next_positions_of_an_mrope_ledger_ignore_the_fed_mask():
    mrope = ledger_from_tensors(T([[1, 2], [3, 4]]), T([[[0, 1], [0, 1]]] * 3))
    got = lc.next_positions(mrope, 2, None, T([[0, 1], [1, 1]]))
    assert same(got, [[[2, 3], [2, 3]]] * 3)


# ledger_positions beside a mask that hides a row's last slots

def test_a_row_that_ended_early_is_told_its_attended_count_and_each_fed_rows_positions():
    mask = [[1, 1, 1, 1, 1], [1, 1, 0, 0, 1]]  # row 1: its last cached slot and its first fed token hidden
    c = call(TWO, 2, fed_pos=[[[9, 9], [9, 9]]], fed_ids=[[7, 8], [7, 8]], mask=mask)
    e = refused(lc.ledger_positions, c)
    assert e.check == "ledger_positions" and set(e.fix) == {"position_ids"}
    assert same(e.fix["position_ids"], [[3, 4], [1, 2]])
    assert str(e) == ("the model would place the first fed token at position(s) [9, 9], but the cache's rows continue at "
                      "[3, 2] (their last attended slots were written at [2, 1]; the slots the mask hides after them "
                      "are not counted): pass position_ids starting at [3, 2] (each row's attended tokens counted on "
                      "from there)")
    lc.ledger_positions(call(TWO, 2, fed_pos=[[[3, 4], [1, 2]]], fed_ids=[[7, 8], [7, 8]], mask=mask))


def test_a_mask_as_wide_as_the_fed_tokens_fits_the_fix_to_it():
    e = refused(lc.ledger_positions, call(led([[1]]), 1, fed_pos=[[[3]]], fed_ids=[[2]], mask=[[1]]))
    assert same(e.fix["position_ids"], [[1]])
    assert str(e) == ("the model would place the first fed token at position(s) [3], but the cache's rows continue at [1] "
                      "(their last slots were written at [0]): pass position_ids starting at [1] (each row's attended "
                      "tokens counted on from there)")


# the rows generate() repeats (num_return_sequences=2): read against the expanded cache

REPEATED = led([[1, 2], [1, 2], [3, 4], [3, 4]])


def test_ids_repeated_per_cache_row_continue_it():
    lc.ledger_tokens(call(REPEATED, 3, fed=1, given=[[1, 2, 5], [3, 4, 6]]))
    lc.ledger_length(call(REPEATED, 3, fed=1, given=[[1, 2, 5], [3, 4, 6]]))


def test_repeated_ids_that_differ_name_the_expanded_row():
    e = refused(lc.ledger_tokens, call(REPEATED, 3, fed=1, given=[[1, 2, 5], [3, 9, 6]]))
    assert e.fix == {"crop": 1} and "(row 2: cached 4, given 9)" in str(e)


def test_repeated_ids_all_cached_are_refused_as_nothing_to_feed():
    e = refused(lc.ledger_length, call(REPEATED, 2, fed=1, given=[[1, 2], [3, 4]]))
    assert e.check == "ledger_length" and e.fix == {"crop": 1}


# ledger_length: nothing cached is nothing fed twice

def test_an_empty_cache_beside_all_ids_fed_passes():
    lc.ledger_length(call(empty_ledger(1), 3, fed=3, given=[[1, 2, 3]]))
    e = refused(lc.ledger_length, call(led([[1]]), 3, fed=3, given=[[1, 2, 3]]))  # one cached: refused
    assert e.fix["crop"] == 0
