"""Kill tests for how the ledger checks fit a refusal's fix to the call (kvresume.ledger_checks._refuse and what it
reads): an encoder-decoder's mask key and whole decoder ids, a cache that cannot be cropped (a sliding layer at, one
short of and one past its window; layers without crop; linear layers without recorded states), the stuck-positions
refusal, the first attended fed token, and a default device other than the CPU. No model runs."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvresume import ledger_checks as lc
from kvresume.call import ResumeCall, ResumeInputError
from kvresume.ledger import Ledger, ledger_from_tensors

T = torch.tensor
ENC_DEC = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
DECODER_ONLY = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
TWELVE = ledger_from_tensors(T([list(range(1, 13))]), mask=T([[0] + [1] * 11]))
RESUME = ("pass the whole sequence through kvresume.resume(model, whole_ids, cache), which re-prefills it")


def led(ids: list, positions: list | None = None, mask: list | None = None) -> Ledger:
    """A ledger from nested lists (positions default 0..slots-1, mask default all ones)."""
    return ledger_from_tensors(T(ids), None if positions is None else T(positions), None if mask is None else T(mask))


def call(ledger: Ledger, n: int, *, cache: Any = None, model: Any = None, fed: int | None = None, given: Any = None,
         mask: Any = None, fed_pos: Any = None, fed_ids: Any = None, processed: int | None = None) -> ResumeCall:
    """A ResumeCall on `cache` (a stand-in without layers where None) for `model`."""
    return ResumeCall(cache=SimpleNamespace() if cache is None else cache, n=n, fed=fed, model=model,
                      attention_mask=None if mask is None else torch.as_tensor(mask), processed_length=processed,
                      given_ids=None if given is None else torch.as_tensor(given), ledger=ledger,
                      fed_positions=None if fed_pos is None else torch.as_tensor(fed_pos),
                      fed_ids=None if fed_ids is None else torch.as_tensor(fed_ids))


def refused(check: Any, c: ResumeCall) -> ResumeInputError:
    """The refusal `check` raises on `c`."""
    with pytest.raises(ResumeInputError) as info:
        check(c)
    return info.value


def same(a: Any, b: Any) -> bool:
    """Equal values, dtype and shape."""
    b = torch.as_tensor(b)
    return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


class Sliding:
    """A stand-in sliding-window layer holding `length` tokens (`record_past`: it keeps states past its window)."""

    def __init__(self, window: int, length: int, record_past: bool = False) -> None:
        self.sliding_window, self.length, self.record_past = window, length, record_past

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens: int) -> None:
        """Present: a crop of this layer is what can_crop judges."""


class Linear(Sliding):
    """A stand-in linear-attention layer: conv states kept, none set yet."""

    def __init__(self, record_past: bool = False) -> None:
        super().__init__(None, 0, record_past)  # type: ignore[arg-type]
        self.conv_states: dict[int, torch.Tensor | None] = {0: None}


class NoCrop:
    """A stand-in layer without crop (5.17.0's StaticLayer)."""

    def get_seq_length(self) -> int:
        return 4


class SlidingCache:
    """A stand-in cache of these layers."""

    def __init__(self, *layers: Any) -> None:
        self.layers = list(layers)


# an encoder-decoder: the mask key and the whole decoder ids

def test_an_encoder_decoders_mask_fix_is_its_decoder_attention_mask():
    ledger = led([[1, 2, 3], [4, 5, 6]], mask=[[0, 1, 1], [0, 0, 1]])
    c = call(ledger, 1, model=ENC_DEC, mask=T([[0, 1, 1, 1], [1, 1, 1, 1]]))
    e = refused(lc.ledger_mask, c)
    assert set(e.fix) == {"decoder_attention_mask"}
    assert same(e.fix["decoder_attention_mask"], [[0, 1, 1, 1], [0, 0, 1, 1]])
    e = refused(lc.ledger_mask, call(ledger, 1, model=DECODER_ONLY, mask=T([[0, 1, 1, 1], [1, 1, 1, 1]])))
    assert set(e.fix) == {"attention_mask"} and same(e.fix["attention_mask"], [[0, 1, 1, 1], [0, 0, 1, 1]])


def test_an_encoder_decoders_crop_from_embeddings_names_the_decoder_mask_in_its_message():
    c = call(led([[1, 2, 3, 4, 5]], mask=[[0, 1, 1, 1, 1]]), 3, model=ENC_DEC, fed_pos=[[[3, 4, 5]]])
    e = refused(lc.ledger_positions, c)
    assert set(e.fix) == {"crop", "decoder_attention_mask"} and e.fix["crop"] == 3
    assert same(e.fix["decoder_attention_mask"], [[0, 1, 1, 1, 1, 1]])
    assert str(e) == ("the first fed token's position(s) [3] continue the cache's first 3 slots, but it holds 2 more "
                      "written at or after them (token ids [4, 5]): another request's tokens (a cache reused without "
                      "copy.deepcopy?); crop the cache to 3 tokens (cache.crop(3)) with a decoder_attention_mask of "
                      "6 columns")


def test_an_encoder_decoders_crop_passes_the_cached_part_and_the_suffix_as_the_whole_decoder_ids():
    e = refused(lc.ledger_processed, call(TWELVE, 2, model=ENC_DEC, given=[[50, 51]], processed=11))
    assert set(e.fix) == {"crop", "decoder_attention_mask", "decoder_input_ids"} and e.fix["crop"] == 11
    assert same(e.fix["decoder_input_ids"], [list(range(1, 12)) + [50, 51]])
    assert same(e.fix["decoder_attention_mask"], [[1] * 13])
    assert str(e) == ("11 tokens were processed but the cache holds 12: its last 1 slot(s) (token ids [12]) came "
                      "after them (re-fed, or another request's); crop the cache to 11 tokens (cache.crop(11)) with a "
                      "decoder_attention_mask of 13 columns (an encoder-decoder: generate() prepends the start token "
                      "to decoder ids that lack it, so pass the whole decoder sequence, 13 tokens, with a "
                      "decoder_attention_mask of ones)")
    e = refused(lc.ledger_processed, call(TWELVE, 2, model=DECODER_ONLY, given=[[50, 51]], processed=11))
    assert set(e.fix) == {"crop", "attention_mask"} and not str(e).endswith("of ones)")


def test_an_encoder_decoders_whole_ids_that_start_with_the_crop_are_passed_as_they_are():
    e = refused(lc.ledger_tokens, call(led([[1, 2, 3, 4]]), 5, model=ENC_DEC, fed=1, given=[[1, 2, 9, 9, 9]]))
    assert e.fix["crop"] == 2 and same(e.fix["decoder_input_ids"], [[1, 2, 9, 9, 9]])
    assert same(e.fix["decoder_attention_mask"], [[1] * 5]) and "the whole decoder sequence, 5 tokens," in str(e)


def test_ids_no_longer_than_the_crop_are_a_suffix_even_where_they_equal_its_tokens():
    e = refused(lc.ledger_processed, call(TWELVE, 2, model=ENC_DEC, given=[[1, 2]], processed=2))
    assert same(e.fix["decoder_input_ids"], [[1, 2, 1, 2]]) and "the whole decoder sequence, 4 tokens," in str(e)
    e = refused(lc.ledger_processed, call(TWELVE, 3, model=ENC_DEC, given=[[1, 2, 50]], processed=2))
    assert same(e.fix["decoder_input_ids"], [[1, 2, 50]])  # one longer, starting with the crop's tokens: whole
    e = refused(lc.ledger_processed, call(TWELVE, 3, model=ENC_DEC, given=[[1, 50, 51]], processed=2))
    assert same(e.fix["decoder_input_ids"], [[1, 2, 1, 50, 51]])  # longer, but not starting with them: a suffix


def test_an_encoder_decoders_batch_gets_whole_ids_per_row():
    ledger = led([[1, 2, 3], [4, 5, 6]])
    e = refused(lc.ledger_processed, call(ledger, 1, model=ENC_DEC, given=[[7], [8]], processed=2))
    assert same(e.fix["decoder_input_ids"], [[1, 2, 7], [4, 5, 8]]) and "sequence, 3 tokens," in str(e)


def test_an_encoder_decoders_whole_decoder_ids_follow_the_given_ids_device():
    """meta stands in for an accelerator: the cached part is moved to the ids' device before the suffix joins it."""
    given = torch.zeros(1, 1, dtype=torch.long, device="meta")
    e = refused(lc.ledger_processed, call(TWELVE, 1, model=ENC_DEC, given=given, processed=11))
    whole, mask = e.fix["decoder_input_ids"], e.fix["decoder_attention_mask"]
    assert whole.device.type == mask.device.type == "meta" and whole.shape == mask.shape == (1, 12)


# a cache that cannot be cropped: the crop becomes a re-prefill through resume()

def processed_refusal(cache: Any, model: Any = None) -> ResumeInputError:
    """ledger_processed's crop refusal (crop to 11 of 12 cached) on `cache`."""
    return refused(lc.ledger_processed, call(TWELVE, 1, cache=cache, model=model, given=[[50]], processed=11))


CROP_MESSAGE = ("11 tokens were processed but the cache holds 12: its last 1 slot(s) (token ids [12]) came after "
                "them (re-fed, or another request's); crop the cache to 11 tokens (cache.crop(11)) with a mask of 12 "
                "columns")


def test_a_sliding_layer_one_short_of_its_window_is_cropped():
    e = processed_refusal(SlidingCache(Sliding(4, 3)))
    assert set(e.fix) == {"crop", "attention_mask"} and e.fix["crop"] == 11 and str(e) == CROP_MESSAGE


@pytest.mark.parametrize("length", [4, 5])
def test_a_sliding_layer_holding_its_window_or_more_is_re_prefilled(length: int):
    e = processed_refusal(SlidingCache(Sliding(8, 2), Sliding(4, length)))
    assert e.fix == {"resume": True}
    assert str(e) == (f"{CROP_MESSAGE}. This cache cannot be cropped (SlidingCache, a sliding layer past its window): "
                      f"{RESUME}")


def test_the_releases_sliding_layer_is_cropped_one_short_of_its_window_and_re_prefilled_at_it():
    """The stand-in's attributes are the installed release's: DynamicSlidingWindowLayer written 3, then 4 tokens."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    layer, kv = DynamicSlidingWindowLayer(sliding_window=4), torch.zeros(1, 1, 3, 2)
    layer.update(kv, kv)
    assert processed_refusal(SlidingCache(layer)).fix["crop"] == 11
    layer.update(kv[:, :, :1], kv[:, :, :1])  # a single token more: the window is full
    assert processed_refusal(SlidingCache(layer)).fix == {"resume": True}


def test_a_sliding_layer_recording_its_past_is_cropped_past_its_window():
    e = processed_refusal(SlidingCache(Sliding(4, 5, record_past=True)))
    assert e.fix["crop"] == 11 and str(e) == CROP_MESSAGE


def test_a_linear_layer_with_no_state_set_is_re_prefilled_unless_it_records_its_past():
    assert processed_refusal(SlidingCache(Linear())).fix == {"resume": True}
    assert processed_refusal(SlidingCache(Linear(record_past=True))).fix["crop"] == 11


def test_layers_without_crop_are_re_prefilled_and_named():
    e = processed_refusal(SlidingCache(Sliding(8, 2), NoCrop()))
    assert e.fix == {"resume": True}
    assert str(e) == f"{CROP_MESSAGE}. This cache cannot be cropped (SlidingCache: its layers have no crop): {RESUME}"


def test_an_encoder_decoders_crop_on_a_cache_that_cannot_crop_is_only_a_resume():
    e = processed_refusal(SlidingCache(NoCrop()), ENC_DEC)
    assert e.fix == {"resume": True} and str(e).endswith(f"(SlidingCache: its layers have no crop): {RESUME}")


def test_a_fix_without_a_crop_stays_on_a_cache_that_cannot_crop():
    ledger = led([[1, 2, 3], [4, 5, 6]], mask=[[0, 1, 1], [0, 0, 1]])
    e = refused(lc.ledger_mask, call(ledger, 1, cache=SlidingCache(NoCrop()), mask=torch.ones(2, 4, dtype=torch.long)))
    assert set(e.fix) == {"attention_mask"} and "cannot be cropped" not in str(e)
    e = refused(lc.ledger_positions, call(led([[1, 2]]), 1, cache=SlidingCache(NoCrop()), fed_pos=[[[5]]]))
    assert set(e.fix) == {"position_ids"} and same(e.fix["position_ids"], [[2]])


# ledger_positions: slots written at stuck positions

def test_slots_written_at_stuck_positions_are_re_fed_through_resume():
    ledger = led([[1, 2, 3, 4, 5, 6, 7, 8]], positions=[[0, 1, 2, 3, 3, 4, 5, 6]])
    e = refused(lc.ledger_positions, call(ledger, 1, fed_pos=[[[7]]], fed_ids=[[9]]))  # continues the last slot
    assert e.check == "ledger_positions" and e.fix == {"resume": True}
    assert str(e) == ("the cache's slots from 4 were written at stuck positions (row 0: [2, 3, 3, 4, 5]), not after "
                      "the slots before them: continuing them keeps the wrong keys; re-feed the tokens from slot 4 "
                      "(the whole sequence through kvresume.resume(model, whole_ids, cache), which keeps the 4 slots "
                      "written right)")


def test_a_stuck_second_slot_shows_the_positions_from_slot_zero():
    e = refused(lc.ledger_positions, call(led([[1, 2, 3]], positions=[[0, 0, 1]]), 1, fed_pos=[[[2]]]))
    assert e.fix == {"resume": True} and str(e).startswith("the cache's slots from 1 were written at stuck positions "
                                                           "(row 0: [0, 0, 1]), not after")


def test_positions_rising_in_every_row_are_not_stuck():
    ledger = led([[1, 2, 3], [4, 5, 6]], positions=[[0, 1, 2], [0, 2, 4]])
    lc.ledger_positions(call(ledger, 1, fed_pos=[[[3], [5]]]))


# first_attended: -1 for a row the mask attends nowhere

def test_first_attended_gives_minus_one_for_a_row_of_padding_only():
    fed = T([[[4, 5], [7, 8]]])
    assert same(lc.first_attended(fed, T([[1, 1, 0, 0], [1, 1, 0, 1]])), [-1, 8])
    assert same(lc.first_attended(fed, None), [4, 7])


# the CPU whatever the default device (torch.set_default_device("cuda") in the caller's session)

def test_first_attended_and_the_fix_masks_stay_on_the_callers_device_under_another_default_device():
    fed = T([[[4, 5], [7, 8]]])
    tail = call(led([[1, 2, 3, 4, 5]], mask=[[0, 1, 1, 1, 1]]), 2, fed=1, given=[[4, 5]])
    refed = call(led([[1, 2, 3, 4, 5]]), 3, fed_pos=[[[3, 4, 5]]], fed_ids=[[4, 5, 6]])
    with torch.device("meta"):
        got = lc.first_attended(fed, None)
        tail_fix, refed_fix = refused(lc.ledger_tokens, tail).fix, refused(lc.ledger_positions, refed).fix
    assert same(got, [4, 7])
    assert tail_fix["crop"] == 3 and same(tail_fix["attention_mask"], [[0, 1, 1, 1, 1]])
    assert refed_fix["crop"] == 3 and same(refed_fix["attention_mask"], [[1, 1, 1, 1, 1, 1]])
