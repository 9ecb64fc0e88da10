"""Kill tests for the guard's ledger checks (make mutants: packages/kvresume/kvresume/ledger_checks.py) on hand-made ledgers and calls:
each refusal's check name, whole message and `fix`, and each boundary (one slot more/less, one position off) with a
refused case and a valid twin. No model runs."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvresume import ledger_checks as lc
from kvresume.call import ResumeCall, ResumeInputError
from kvresume.ledger import attach_ledger, empty_ledger, ledger_from_tensors

T = torch.tensor


def led(ids, positions=None, mask=None):
    """A ledger from nested lists (positions default 0..slots-1, mask default all ones)."""
    return ledger_from_tensors(T(ids), None if positions is None else T(positions), None if mask is None else T(mask))


def call(ledger, n, *, fed=None, given=None, mask=None, fed_pos=None, fed_ids=None, processed=None, rows=None,
         stored=None) -> ResumeCall:
    """A ResumeCall on a stand-in cache that keeps `stored` as its stored ledger."""
    cache = SimpleNamespace()
    if stored is not None:
        attach_ledger(cache, stored)
    return ResumeCall(cache=cache, n=n, fed=fed, attention_mask=None if mask is None else torch.as_tensor(mask),
                      processed_length=processed, rows=rows, given_ids=None if given is None else torch.as_tensor(given),
                      ledger=ledger, fed_positions=None if fed_pos is None else torch.as_tensor(fed_pos),
                      fed_ids=None if fed_ids is None else torch.as_tensor(fed_ids))


def refused(check, c: ResumeCall) -> ResumeInputError:
    with pytest.raises(ResumeInputError) as info:
        check(c)
    return info.value


def same(a: torch.Tensor, b) -> bool:
    b = torch.as_tensor(b)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ledger_tokens

def test_ledger_tokens_names_the_first_differing_row_at_position_one():
    c = call(led([[10, 11, 12, 13], [20, 21, 22, 23]]), 5, fed=1,
             given=[[10, 11, 40, 41, 42], [20, 77, 42, 43, 44]])
    e = refused(lc.ledger_tokens, c)
    assert e.check == "ledger_tokens" and e.fix == {"crop": 1}
    assert str(e) == ("input_ids differ from the cached tokens at position 1 (row 1: cached 21, given 77): the cache holds "
                      "3 token(s) of another request after the common prefix (a cache reused without copy.deepcopy?); "
                      "copy.deepcopy the cache before each reuse, or crop it to the common prefix of 1 tokens "
                      "(cache.crop(1))")


def test_ledger_tokens_names_the_first_of_several_differing_rows():
    c = call(led([[1, 2, 3], [4, 5, 6], [7, 8, 9]]), 4, fed=1, given=[[1, 2, 3, 0], [4, 50, 6, 0], [7, 80, 9, 0]])
    e = refused(lc.ledger_tokens, c)
    assert "(row 1: cached 5, given 50)" in str(e) and e.fix == {"crop": 1}


def test_ledger_tokens_a_prefix_one_short_of_the_shorter_side_is_refused_its_twin_passes():
    ledger = led([[1, 2, 3, 4, 5]])
    lc.ledger_tokens(call(ledger, 3, fed=1, given=[[1, 2, 3]]))  # p == min(n, past) == n < past
    lc.ledger_tokens(call(ledger, 7, fed=2, given=[[1, 2, 3, 4, 5, 6, 7]]))  # p == min == past < n
    e = refused(lc.ledger_tokens, call(ledger, 3, fed=1, given=[[1, 2, 9]]))
    assert e.fix == {"crop": 2} and str(e).startswith("input_ids differ from the cached tokens at position 2 (row 0: "
                                                      "cached 3, given 9): the cache holds 3 token(s)")
    e = refused(lc.ledger_tokens, call(ledger, 7, fed=2, given=[[1, 2, 3, 4, 9, 6, 7]]))
    assert e.fix == {"crop": 4} and "holds 1 token(s) of another request" in str(e)


def test_ledger_tokens_reads_only_ids_generate_slices_as_a_whole_sequence():
    ledger, given = led([[1, 2, 3]]), [[1, 9, 3, 4]]
    refused(lc.ledger_tokens, call(ledger, 4, fed=1, given=given))
    lc.ledger_tokens(call(ledger, 4, fed=None, given=given))  # fed not captured
    lc.ledger_tokens(call(ledger, 4, fed=4, given=given))  # all fed: the ids are the suffix
    lc.ledger_tokens(call(ledger, 4, fed=1, given=None))  # embeddings
    lc.ledger_tokens(call(None, 4, fed=1, given=given))  # untracked


def test_ledger_tokens_the_caches_own_last_tokens_crop_with_the_cached_mask():
    c = call(led([[1, 2, 3, 4, 5]], mask=[[0, 1, 1, 1, 1]]), 2, fed=1, given=[[4, 5]])
    e = refused(lc.ledger_tokens, c)
    assert e.check == "ledger_tokens" and set(e.fix) == {"crop", "attention_mask"} and e.fix["crop"] == 3
    assert same(e.fix["attention_mask"], [[0, 1, 1, 1, 1]])
    assert str(e) == ("input_ids are the cache's last 2 token(s), cached already: generate() would process them twice; "
                      "crop the cache to 3 tokens (cache.crop(3)) with a mask of 5 columns, or pass only new tokens")


def test_ledger_tokens_one_cached_last_token():
    e = refused(lc.ledger_tokens, call(led([[1, 2, 3, 4, 5]]), 1, fed=0, given=[[5]]))
    assert e.fix["crop"] == 4 and same(e.fix["attention_mask"], [[1, 1, 1, 1, 1]])
    assert str(e) == ("input_ids are the cache's last 1 token(s), cached already: generate() would process them twice; "
                      "crop the cache to 4 tokens (cache.crop(4)) with a mask of 5 columns, or pass only new tokens")


def test_ledger_tokens_a_tail_in_one_row_only_is_new_tokens():
    e = refused(lc.ledger_tokens, call(led([[1, 2, 3], [4, 5, 6]]), 1, fed=0, given=[[3], [7]]))
    assert e.fix == {"resume": True}


def test_ledger_tokens_new_tokens_read_as_whole_name_resume_and_each_rows_next_position():
    c = call(led([[1, 2, 3], [4, 5, 6]], positions=[[0, 1, 2], [5, 6, 7]]), 2, fed=1, given=[[7, 8], [9, 9]])
    e = refused(lc.ledger_tokens, c)
    assert e.check == "ledger_tokens" and e.fix == {"resume": True}
    assert str(e) == ("input_ids do not start with the cache's tokens (position 0: cached 1, given 7), so they are the new "
                      "tokens, not the whole sequence generate() reads them as: pass the whole sequence (the cached part's "
                      "ids + these) through kvresume.resume(model, whole_ids, cache), which keeps the longest cached "
                      "common prefix and feeds the rest; only where these tokens follow all 3 cached ones (not another "
                      "request's): attention_mask with 5 columns and position_ids from [3, 8]")


# ledger_length

def test_ledger_length_refuses_a_cache_holding_every_id_one_less_passes():
    ledger = led([[1, 2, 3, 4]])
    e = refused(lc.ledger_length, call(ledger, 4, given=[[1, 2, 3, 4]]))
    assert e.check == "ledger_length" and e.fix == {"crop": 3}
    assert str(e) == ("the cache holds 4 tokens, the first 4 of them these input_ids: nothing is left to feed; crop the "
                      "cache to 3 tokens (cache.crop(3)) so generate() feeds the last one")
    e = refused(lc.ledger_length, call(ledger, 3, given=[[1, 2, 3]], mask=torch.ones(1, 3, dtype=torch.long)))
    assert e.fix == {"crop": 2} and str(e).startswith("the cache holds 4 tokens, the first 3 of them")
    lc.ledger_length(call(ledger, 5, given=[[1, 2, 3, 4, 5]]))  # one id more than cached
    lc.ledger_length(call(ledger, 4, given=[[1, 2, 3, 9]]))  # the last id differs
    lc.ledger_length(call(ledger, 4, given=None))
    lc.ledger_length(call(None, 4, given=[[1, 2, 3, 4]]))


def test_ledger_length_a_mask_wider_or_narrower_than_the_ids_is_not_a_whole_sequence():
    ledger, given = led([[1, 2, 3, 4]]), [[1, 2, 3, 4]]
    refused(lc.ledger_length, call(ledger, 4, given=given, mask=torch.ones(1, 4, dtype=torch.long)))
    lc.ledger_length(call(ledger, 4, given=given, mask=torch.ones(1, 5, dtype=torch.long)))
    lc.ledger_length(call(ledger, 4, given=given, mask=torch.ones(1, 3, dtype=torch.long)))
    lc.ledger_length(call(ledger, 4, fed=4, given=given, mask=torch.ones(1, 8, dtype=torch.long)))
    e = refused(lc.ledger_length, call(ledger, 4, fed=1, given=given, mask=torch.ones(1, 8, dtype=torch.long)))
    assert e.fix == {"crop": 3}  # sliced as a whole sequence, whatever the mask


def test_ledger_length_whole_ids_all_fed_beside_their_cached_first_tokens_are_refused():
    """generate() feeds all n ids while the cache holds the first n-1 of them: crop to 0 with n columns; each
    boundary passes: fed sliced (1 of 5), the last cached token differing, a mask of cached + ids columns, no cache."""
    ledger = led([[1, 2, 3, 4]])
    e = refused(lc.ledger_length, call(ledger, 5, fed=5, given=[[1, 2, 3, 4, 5]]))
    assert e.check == "ledger_length" and e.fix["crop"] == 0 and same(e.fix["attention_mask"], [[1, 1, 1, 1, 1]])
    assert str(e).startswith("generate() feeds all 5 input_ids beside a cache that holds the first 4 of them")
    assert "a mask of 5 columns" in str(e)
    lc.ledger_length(call(ledger, 5, fed=1, given=[[1, 2, 3, 4, 5]]))  # sliced: only the uncached one fed
    lc.ledger_length(call(ledger, 5, fed=4, given=[[1, 2, 3, 4, 5]]))  # one fewer than given: not this rule
    lc.ledger_length(call(ledger, 5, fed=5, given=[[1, 2, 3, 9, 5]]))  # the 4th differs: not the cached ones
    lc.ledger_length(call(ledger, 5, fed=5, given=[[1, 2, 3, 4, 5]], mask=torch.ones(1, 9, dtype=torch.long)))
    lc.ledger_length(call(ledger, 5, given=[[1, 2, 3, 4, 5]]))  # fed unknown (no dry run)
    e = refused(lc.ledger_length, call(led([[1]]), 2, fed=2, given=[[1, 7]]))  # one cached, its id first
    assert e.fix["crop"] == 0


# ledger_mask

PADDED = dict(ids=[[1, 2, 3], [4, 5, 6]], mask=[[0, 1, 1], [0, 0, 1]])


def test_ledger_mask_names_the_first_padding_slot_attended_and_keeps_the_new_columns_and_dtype():
    mask = T([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]).bool()
    e = refused(lc.ledger_mask, call(led(**PADDED), 2, mask=mask))
    assert e.check == "ledger_mask" and set(e.fix) == {"attention_mask"}
    assert same(e.fix["attention_mask"], T([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0]]).bool())
    assert str(e) == ("attention_mask attends to cached slot 0 of row 1, which the cache wrote as padding (mask 0): pass "
                      "the mask the cached slots were written with (zeros on padding) + the new tokens' columns")


def test_ledger_mask_as_wide_as_the_cache_is_read_one_column_less_is_not():
    e = refused(lc.ledger_mask, call(led(**PADDED), 3, mask=torch.ones(2, 3, dtype=torch.long)))
    assert same(e.fix["attention_mask"], [[0, 1, 1], [0, 0, 1]]) and "cached slot 0 of row 0" in str(e)
    e = refused(lc.ledger_mask, call(led(**PADDED), 3, mask=T([[0, 1, 1], [0, 1, 1]])))
    assert "cached slot 1 of row 1" in str(e)
    lc.ledger_mask(call(led(**PADDED), 3, mask=torch.ones(2, 2, dtype=torch.long)))


def test_ledger_mask_passes_the_written_mask_one_attending_less_and_masks_it_cannot_read():
    ledger = led(**PADDED)
    lc.ledger_mask(call(ledger, 1, mask=T([[0, 1, 1, 1], [0, 0, 1, 1]])))
    lc.ledger_mask(call(ledger, 1, mask=T([[0, 0, 1, 1], [0, 0, 0, 1]])))
    lc.ledger_mask(call(ledger, 1, mask=torch.ones(1, 4, dtype=torch.long)))  # rows != batch
    lc.ledger_mask(call(ledger, 1, mask=torch.ones(2, 1, 1, 4)))  # 4-D
    lc.ledger_mask(call(ledger, 1, mask=None))
    lc.ledger_mask(call(None, 1, mask=torch.ones(2, 4, dtype=torch.long)))


# next_positions / ledger_positions: the last message

def test_next_positions_text_and_mrope():
    assert same(lc.next_positions(led([[1, 2], [3, 4]], positions=[[0, 1], [4, 6]]), 3), [[2, 3, 4], [7, 8, 9]])
    mrope = ledger_from_tensors(T([[1, 2]]), T([[[0, 1]], [[0, 3]], [[0, 2]]]))
    assert same(lc.next_positions(mrope, 2), [[[4, 5]], [[4, 5]], [[4, 5]]])
    rows = ledger_from_tensors(T([[1, 2], [3, 4]]), T([[[0, 1], [0, 5]], [[0, 3], [0, 1]], [[0, 2], [0, 1]]]))
    assert same(lc.next_positions(rows, 2), [[[4, 5], [6, 7]]] * 3)


def test_ledger_positions_one_off_names_where_the_rows_continue():
    ledger = led([[1, 2, 3, 4, 5]])
    lc.ledger_positions(call(ledger, 1, fed_pos=[[[5]]], fed_ids=[[6]]))
    lc.ledger_positions(call(ledger, 2, fed_pos=[[[5, 9]]], fed_ids=[[6, 7]]))  # only the first fed token is read
    e = refused(lc.ledger_positions, call(ledger, 2, fed_pos=[[[6, 7]]], fed_ids=[[6, 7]]))
    assert e.check == "ledger_positions" and set(e.fix) == {"position_ids"} and same(e.fix["position_ids"], [[5, 6]])
    assert str(e) == ("the model would place the first fed token at position(s) [6], but the cache's rows continue at [5] "
                      "(their last slots were written at [4]): pass position_ids starting at [5]")


def test_ledger_positions_reads_the_smallest_mrope_row_and_answers_in_three_rows():
    mrope = ledger_from_tensors(T([[1, 2]]), T([[[0, 1]], [[0, 3]], [[0, 2]]]))  # continues at 4
    lc.ledger_positions(call(mrope, 1, fed_pos=[[[6]], [[4]], [[5]]]))
    e = refused(lc.ledger_positions, call(mrope, 2, fed_pos=[[[7, 8]], [[6, 7]], [[9, 9]]]))
    assert same(e.fix["position_ids"], [[[4, 5]], [[4, 5]], [[4, 5]]]) and "position(s) [6]" in str(e)


def test_ledger_positions_a_one_slot_cache_and_nothing_to_read():
    e = refused(lc.ledger_positions, call(led([[1]]), 1, fed_pos=[[[3]]]))
    assert same(e.fix["position_ids"], [[1]])
    lc.ledger_positions(call(led([[1]]), 1, fed_pos=torch.zeros(1, 1, 0, dtype=torch.long)))
    lc.ledger_positions(call(empty_ledger(1), 1, fed_pos=[[[3]]]))
    lc.ledger_positions(call(led([[1]]), 1, fed_pos=None))
    lc.ledger_positions(call(None, 1, fed_pos=[[[3]]]))


def test_ledger_positions_reads_the_first_attended_fed_token():
    """transformers' assisted decoding test (5.17.0): a left-padded row's pad is fed first, placed at 0 (a false alarm
    when the first fed token was read); the first token the mask attends is compared, a row of pads only is skipped."""
    ledger = led([[28, 19, 11, 95, 2, 37]], positions=[[0] * 6], mask=[[1, 0, 0, 0, 0, 0]])
    mask = [[1, 0, 0, 0, 0, 0, 0, 1]]
    lc.ledger_positions(call(ledger, 2, fed_pos=[[[0, 1]]], fed_ids=[[35, 15]], mask=mask))
    e = refused(lc.ledger_positions, call(ledger, 2, fed_pos=[[[0, 4]]], fed_ids=[[35, 15]], mask=mask))
    assert e.check == "ledger_positions" and "position(s) [4]" in str(e)
    two = led([[1, 2], [3, 4]], positions=[[0, 1], [0, 1]])
    lc.ledger_positions(call(two, 1, fed_pos=[[[2], [9]]], fed_ids=[[5], [6]], mask=[[1, 1, 1], [1, 1, 0]]))
    e = refused(lc.ledger_positions, call(two, 1, fed_pos=[[[3], [9]]], fed_ids=[[5], [6]], mask=[[1, 1, 1], [1, 1, 0]]))
    assert "position(s) [3, 2]" in str(e)


def test_ledger_positions_a_batch_mismatch_is_not_read():
    lc.ledger_positions(call(led([[1, 2]]), 1, fed_pos=[[[7], [7]]]))


# ledger_positions: a prefix the fed token continues

def test_ledger_positions_re_fed_tokens_crop_to_the_prefix_with_its_mask():
    ledger = led([[1, 2, 3, 4, 5]], mask=[[0, 1, 1, 1, 1]])
    e = refused(lc.ledger_positions, call(ledger, 3, fed_pos=[[[3, 4, 5]]], fed_ids=[[4, 5, 6]]))
    assert e.check == "ledger_positions" and set(e.fix) == {"crop", "attention_mask"} and e.fix["crop"] == 3
    assert same(e.fix["attention_mask"], [[0, 1, 1, 1, 1, 1]])
    assert str(e) == ("the first 2 fed token(s) are the cache's last 2, at the same positions (cached already): crop the "
                      "cache to 3 tokens (cache.crop(3)) with a mask of 6 columns, or pass only tokens after position 4")


def test_ledger_positions_re_fed_as_many_as_fed_and_one_more_than_fed():
    e = refused(lc.ledger_positions, call(led([[1, 2, 3, 4, 5]]), 2, fed_pos=[[[3, 4]]], fed_ids=[[4, 5]]))
    assert e.fix["crop"] == 3 and str(e).startswith("the first 2 fed token(s) are the cache's last 2")
    e = refused(lc.ledger_positions, call(led([[1, 2, 3, 5, 5]]), 1, fed_pos=[[[3]]], fed_ids=[[5]]))
    assert str(e).startswith("the first fed token's position(s) [3] continue the cache's first 3 slots, but it holds 2 more")


def test_ledger_positions_re_feeding_the_whole_cache_crops_to_nothing():
    e = refused(lc.ledger_positions, call(led([[1, 2, 3]]), 4, fed_pos=[[[0, 1, 2, 3]]], fed_ids=[[1, 2, 3, 4]]))
    assert e.fix["crop"] == 0 and same(e.fix["attention_mask"], [[1, 1, 1, 1]])
    assert str(e) == ("the first 3 fed token(s) are the cache's last 3, at the same positions (cached already): crop the "
                      "cache to 0 tokens (cache.crop(0)) with a mask of 4 columns, or pass only tokens after position 2")


def test_ledger_positions_another_requests_slots_name_eight_token_ids():
    ledger = led([list(range(1, 13))])
    e = refused(lc.ledger_positions, call(ledger, 1, fed_pos=[[[2]]], fed_ids=[[50]]))
    assert e.check == "ledger_positions" and e.fix["crop"] == 2 and same(e.fix["attention_mask"], [[1, 1, 1]])
    assert str(e) == ("the first fed token's position(s) [2] continue the cache's first 2 slots, but it holds 10 more "
                      "written at or after them (token ids [3, 4, 5, 6, 7, 8, 9, 10]): another request's tokens (a cache "
                      "reused without copy.deepcopy?); crop the cache to 2 tokens (cache.crop(2)) with a mask of 3 columns")


def test_ledger_positions_other_tokens_at_cached_positions_and_embeddings_are_another_request():
    ledger = led([[1, 2, 3, 4, 5]], mask=[[0, 1, 1, 1, 1]])
    e = refused(lc.ledger_positions, call(ledger, 3, fed_pos=[[[3, 4, 5]]], fed_ids=[[9, 9, 9]]))
    assert e.fix["crop"] == 3 and same(e.fix["attention_mask"], [[0, 1, 1, 1, 1, 1]])
    assert "holds 2 more written at or after them (token ids [4, 5])" in str(e)
    e = refused(lc.ledger_positions, call(ledger, 3, fed_pos=[[[3, 4, 5]]], fed_ids=None))  # embeddings: not a tail
    assert e.fix["crop"] == 3 and same(e.fix["attention_mask"], [[0, 1, 1, 1, 1, 1]])
    assert str(e).startswith("the first fed token's position(s) [3] continue the cache's first 3 slots, but it holds 2 "
                             "more") and str(e).endswith("with a mask of 6 columns")


def test_tail_no_ids_are_no_tail():
    ledger = led([[1, 2, 3]])
    assert lc._tail(ledger, None, 1) is False
    assert lc._tail(ledger, T([[1, 2, 3]])[:, :0]) is False
    assert lc._tail(ledger, T([[3]])) is True and lc._tail(ledger, T([[2, 3]])) is True
    assert lc._tail(ledger, T([[0, 1, 2, 3]])) is False  # more ids than cached


def test_the_fix_mask_follows_the_callers_ids_device():
    """meta stands in for an accelerator: the fix's mask is built on the device of the ids given or fed."""
    e = refused(lc.ledger_processed, call(TWELVE, 1, given=torch.zeros(1, 1, dtype=torch.long, device="meta"),
                                          processed=11))
    assert e.fix["attention_mask"].device.type == "meta" and e.fix["attention_mask"].shape == (1, 12)
    c = call(led([list(range(1, 13))]), 1, fed_pos=[[[2]]])
    c.fed_ids = torch.zeros(1, 1, dtype=torch.long, device="meta")
    e = refused(lc.ledger_positions, c)
    assert e.fix["attention_mask"].device.type == "meta" and e.fix["attention_mask"].shape == (1, 3)
    e = refused(lc.ledger_positions, call(led([list(range(1, 13))]), 1, fed_pos=[[[2]]]))  # embeddings: the CPU
    assert e.fix["attention_mask"].device.type == "cpu"


# prefix_before

def test_prefix_before_a_prefix_the_position_continues():
    ledger = led([[1, 2, 3, 4, 5]])
    assert lc.prefix_before(ledger, T([3])) == 3
    assert lc.prefix_before(ledger, T([1])) == 1
    assert lc.prefix_before(ledger, T([5])) is None  # all slots before it: no prefix
    assert lc.prefix_before(ledger, T([9])) is None


def test_prefix_before_slots_not_a_prefix_or_not_continued():
    assert lc.prefix_before(led([[1, 2, 3, 4, 5]], positions=[[0, 1, 5, 2, 3]]), T([3])) is None
    assert lc.prefix_before(led([[1, 2, 3, 4, 5]], positions=[[0, 1, 2, 10, 11]]), T([5])) is None
    assert lc.prefix_before(led([[1, 2, 3, 4, 5]], positions=[[0, 1, 2, 10, 11]]), T([3])) == 3


def test_prefix_before_keep_zero_continues_where_slot_zero_sits():
    ledger = led([[1, 2, 3]], positions=[[5, 6, 7]])
    assert lc.prefix_before(ledger, T([5])) == 0
    assert lc.prefix_before(ledger, T([4])) is None
    assert lc.prefix_before(led([[1, 2, 3], [1, 2, 3]], positions=[[5, 6, 7], [5, 6, 7]]), T([5, 5])) == 0
    assert lc.prefix_before(led([[1, 2, 3], [1, 2, 3]], positions=[[5, 6, 7], [2, 6, 7]]), T([5, 2])) == 0
    mrope = ledger_from_tensors(T([[1, 2]]), T([[[5, 6]], [[4, 6]], [[6, 6]]]))
    assert lc.prefix_before(mrope, T([4])) == 0


def test_prefix_before_a_row_holding_more_slots_before_the_position_is_no_prefix():
    """Row 1 re-wrote position 2 (4 slots before position 3): the first 3 slots continue at 3 in both rows, but row 1
    holds a 4th slot written before the fed position."""
    ledger = led([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]], positions=[[0, 1, 2, 3, 4], [0, 1, 2, 2, 9]])
    assert lc.prefix_before(ledger, T([3, 3])) is None
    assert lc.prefix_before(led([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]], positions=[[0, 1, 2, 3, 4], [0, 1, 2, 8, 9]]),
                            T([3, 3])) == 3


def test_prefix_before_rows_and_mrope():
    two = led([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])
    assert lc.prefix_before(two, T([3, 3])) == 3
    assert lc.prefix_before(two, T([3, 4])) is None  # row 1 continues 4 slots
    mrope = ledger_from_tensors(T([[1, 2, 3]]), T([[[0, 1, 2]], [[0, 3, 4]], [[0, 1, 2]]]))
    assert lc.prefix_before(mrope, T([1])) == 1
    assert lc.prefix_before(mrope, T([4])) == 2  # slot 1 sits at 3 in its largest row
    assert lc.prefix_before(mrope, T([3])) is None


# cropped_before (through ledger_positions)

STORED = led([[1, 2, 3, 4, 5, 6]])


def test_ledger_positions_names_the_tokens_a_crop_removed():
    e = refused(lc.ledger_positions, call(STORED.first(4), 1, fed_pos=[[[6]]], fed_ids=[[7]], stored=STORED))
    assert e.check == "ledger_positions" and e.fix == {"resume": True}
    assert str(e) == ("the first fed token is at position(s) [6], but the cache was cropped to 4 tokens and continues at "
                      "[4]: the 2 cropped token(s) [5, 6] between are not in it; feed them before these (the whole "
                      "sequence through kvresume.resume(model, whole_ids, cache), which re-feeds what the cache lacks)")
    e = refused(lc.ledger_positions, call(STORED.first(4), 1, fed_pos=[[[5]]], fed_ids=[[7]], stored=STORED))
    assert e.fix == {"resume": True} and "the 1 cropped token(s) [5] between" in str(e)


def test_cropped_before_no_crop_explains_it():
    want = "pass position_ids starting at"
    e = refused(lc.ledger_positions, call(STORED.first(4), 1, fed_pos=[[[7]]], stored=STORED))  # past the stored slots
    assert want in str(e) and same(e.fix["position_ids"], [[4]])
    e = refused(lc.ledger_positions, call(STORED, 1, fed_pos=[[[8]]], stored=STORED))  # nothing cropped
    assert want in str(e)
    e = refused(lc.ledger_positions, call(STORED.first(4), 1, fed_pos=[[[6]]]))  # no stored ledger
    assert want in str(e)
    rows = STORED.first(4).rows(T([0, 0]))
    e = refused(lc.ledger_positions, call(rows, 1, fed_pos=[[[6], [6]]], stored=STORED))  # rows it cannot map
    assert want in str(e) and same(e.fix["position_ids"], [[4], [4]])


def test_cropped_before_every_row_must_be_past_its_next_position():
    stored = led([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]], positions=[[0, 1, 2, 3, 3], [0, 1, 2, 3, 4]])
    c = call(stored.first(4), 1, fed_pos=[[[4], [5]]], stored=stored)
    assert lc.cropped_before(c, c.ledger, T([4, 5])) == []
    assert lc.cropped_before(c, c.ledger, T([5, 5])) == []
    moved = led([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]], positions=[[0, 1, 2, 3, 4], [0, 1, 2, 3, 5]])
    c = call(moved.first(4), 1, stored=moved)
    assert lc.cropped_before(c, c.ledger, T([5, 6])) == [5]


def test_cropped_before_a_stored_ledger_of_another_batch_is_not_read():
    stored = led([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    c = call(STORED.first(4), 1, stored=stored)
    assert lc.cropped_before(c, c.ledger, T([6])) == []


# ledger_processed

TWELVE = led([list(range(1, 13))], mask=[[0] + [1] * 11])


def test_ledger_processed_more_than_cached_names_resume():
    e = refused(lc.ledger_processed, call(TWELVE, 1, given=[[50]], processed=13))
    assert e.check == "ledger_processed" and e.fix == {"resume": True}
    assert str(e) == ("13 tokens were processed but the cache holds 12 (the ledger's tokens): the 1 token(s) between are not "
                      "in it; feed them before these (the whole sequence through kvresume.resume(model, whole_ids, "
                      "cache))")


def test_ledger_processed_one_less_than_cached_crops_with_the_cached_mask():
    e = refused(lc.ledger_processed, call(TWELVE, 1, given=[[50]], processed=11))
    assert e.check == "ledger_processed" and set(e.fix) == {"crop", "attention_mask"} and e.fix["crop"] == 11
    assert same(e.fix["attention_mask"], [[0] + [1] * 11])
    assert str(e) == ("11 tokens were processed but the cache holds 12: its last 1 slot(s) (token ids [12]) came after "
                      "them (re-fed, or another request's); crop the cache to 11 tokens (cache.crop(11)) with a mask of "
                      "12 columns")


def test_ledger_processed_names_eight_later_token_ids_and_the_fed_count():
    e = refused(lc.ledger_processed, call(TWELVE, 5, fed=3, given=[[50, 51, 52, 53, 54]], processed=2))
    assert e.fix["crop"] == 2 and same(e.fix["attention_mask"], [[0, 1, 1, 1, 1]])
    assert str(e) == ("2 tokens were processed but the cache holds 12: its last 10 slot(s) (token ids [3, 4, 5, 6, 7, 8, 9, "
                      "10]) came after them (re-fed, or another request's); crop the cache to 2 tokens (cache.crop(2)) "
                      "with a mask of 5 columns")


def test_ledger_processed_passes_the_cached_count_and_calls_it_cannot_read():
    lc.ledger_processed(call(TWELVE, 1, given=[[50]], processed=12))
    lc.ledger_processed(call(TWELVE, 1, given=[[50]], processed=None))
    lc.ledger_processed(call(TWELVE, 1, given=[[50]], processed=11, rows=T([11])))  # per-row counts
    lc.ledger_processed(call(TWELVE, 1, given=None, processed=11))
    lc.ledger_processed(call(None, 1, given=[[50]], processed=11))
