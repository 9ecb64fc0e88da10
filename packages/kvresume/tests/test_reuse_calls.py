"""resume()'s call, each part fed the case that contradicts it: generate()'s arguments after the kept slots (suffix,
mask, positions, the model's rope_deltas; an encoder-decoder's whole decoder sequence), the suffix's positions from
a text ledger, an M-RoPE ledger and a new image, the record on the output, and resume() itself: the given mask, the
tokenizer and messages that explain a break, an untracked cache or other rows left to the guard, and an
encoder-decoder call without its decoder ids."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvresume import compat, resume, track
from kvresume import testing as T
from kvresume.ledger import Ledger, ledger_from_tensors, ledger_of
from kvresume.prefix import ResumeRecord, record_of
from kvresume.reuse import _arguments, _positions, _with_record

IDS = torch.arange(10, 22).view(1, -1)
LONGER = torch.cat([IDS, torch.tensor([[30, 31, 32]])], 1)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    return T.build("dense")


@pytest.fixture(scope="module")
def vl() -> torch.nn.Module:
    return T.build("multimodal")


def tracked(m: torch.nn.Module, ids: torch.Tensor = IDS) -> DynamicCache:
    with track(m), torch.no_grad():
        return m(input_ids=ids, use_cache=True).past_key_values


class Words:
    """A tokenizer whose text is the ids as words."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)


def test_the_arguments_feed_the_suffix_after_the_kept_slots_with_their_mask_and_positions(dense):
    kept = ledger_from_tensors(IDS).first(8)
    given = torch.ones(1, 15, dtype=torch.bool)
    given[0, 10] = False
    stale = {"attention_mask": torch.zeros(1, 3), "position_ids": torch.zeros(1, 3), "max_new_tokens": 2}
    inputs, kwargs = _arguments(dense, LONGER, LONGER, kept, given, stale, False)
    assert inputs.equal(LONGER[:, 8:]) and set(kwargs) == {"attention_mask", "position_ids", "max_new_tokens"}
    assert kwargs["attention_mask"].dtype == torch.bool and kwargs["attention_mask"].equal(given)
    assert kwargs["position_ids"].tolist() == [[8, 9, 1, 10, 11, 12, 13]]  # the padded slot at 1, the rest counting on
    inputs, kwargs = _arguments(dense, LONGER, LONGER, kept, None, {}, False)
    assert kwargs["attention_mask"].equal(torch.ones(1, 15, dtype=torch.long)) and kwargs["position_ids"].tolist() == [
        list(range(8, 15))]
    inputs, kwargs = _arguments(dense, LONGER, LONGER, kept.first(0), None, {"position_ids": torch.zeros(1, 3)}, False)
    assert inputs.equal(LONGER) and set(kwargs) == {"attention_mask"}  # nothing kept: generate() counts from 0


def test_an_encoder_decoder_is_fed_its_encoder_ids_and_the_whole_decoder_sequence():
    bart = T.build("bart")
    enc = torch.tensor([[5, 6, 7, 8]])
    kept = ledger_from_tensors(IDS[:, :4])
    mask = torch.ones(1, 6, dtype=torch.long)
    inputs, kwargs = _arguments(bart, enc, IDS[:, :6], kept, mask, {"max_new_tokens": 1}, True)
    assert inputs is enc and kwargs["decoder_input_ids"].equal(IDS[:, :6]) and kwargs["decoder_attention_mask"].equal(mask)
    assert set(kwargs) == {"decoder_input_ids", "decoder_attention_mask", "max_new_tokens"}


def test_a_text_turn_after_an_image_puts_back_the_ledger_s_rope_deltas(vl, dense):
    pos = torch.arange(12).view(1, 1, -1).expand(3, 1, 12).clone()
    pos[1:, :, 3:] += 5  # an M-RoPE ledger whose last slot sits at 16 in rows 1-2
    kept = Ledger(IDS.clone(), pos, torch.ones_like(IDS), rope_deltas=torch.tensor([[4]]))
    compat.set_rope_state(vl, torch.tensor([[-9]]))
    inputs, kwargs = _arguments(vl, LONGER, LONGER, kept, None, {}, False)
    assert inputs.equal(LONGER[:, 12:]) and compat.get_rope_state(vl).tolist() == [[4]]
    assert kwargs["position_ids"].tolist() == [[[17, 18, 19]]] * 3  # every row on from the largest: 16 + 1
    compat.set_rope_state(vl, torch.tensor([[-9]]))
    _arguments(vl, LONGER, LONGER, Ledger(IDS.clone(), pos, torch.ones_like(IDS)), None, {}, False)
    assert compat.get_rope_state(vl).tolist() == [[-9]]  # no deltas recorded: the model's own left alone
    text = ledger_from_tensors(IDS)
    text.rope_deltas = torch.tensor([[4]])
    _arguments(dense, LONGER, LONGER, text, None, {}, False)  # a model without rope_deltas: none set
    assert compat.rope_state_owner(dense) is None


def test_the_suffix_s_positions_from_a_text_ledger_and_an_m_rope_one(dense):
    kept = ledger_from_tensors(IDS[:, :5], torch.tensor([[0, 1, 2, 7, 8]]))
    assert _positions(dense, kept, LONGER[:, 5:8], torch.ones(1, 3, dtype=torch.long), {}).tolist() == [[9, 10, 11]]
    three = Ledger(IDS[:, :5], torch.tensor([[[0, 1, 2, 3, 4]], [[0, 1, 2, 3, 9]], [[0, 1, 2, 3, 6]]]), torch.ones(1, 5))
    assert _positions(dense, three, LONGER[:, 5:7], torch.ones(1, 2), {}).tolist() == [[[10, 11]]] * 3


def test_a_new_image_s_positions_are_the_whole_conversation_s(vl):
    p = T.prompt("multimodal")
    owner = compat.rope_state_owner(vl)
    whole, _ = owner.get_rope_index(p["input_ids"], mm_token_type_ids=p["mm_token_type_ids"],
                                    image_grid_thw=p["image_grid_thw"], attention_mask=p["attention_mask"])
    kept = Ledger(p["input_ids"][:, :5], whole[..., :5].clone(), torch.ones(1, 5, dtype=torch.long))
    suffix = p["input_ids"][:, 5:]
    kwargs = {"image_grid_thw": p["image_grid_thw"], "mm_token_type_ids": p["mm_token_type_ids"][:, 5:]}
    got = _positions(vl, kept, suffix, torch.ones_like(suffix), kwargs)
    assert got.equal(whole[..., 5:])
    assert not _positions(vl, kept, suffix, torch.ones_like(suffix), {}).equal(whole[..., 5:])  # text positions: wrong


def test_the_record_goes_on_the_output_and_the_cache_it_wrote(dense):
    record = ResumeRecord(12, 8, 7, "differs", "d")
    cache = tracked(dense)
    out = dense.generate(LONGER, max_new_tokens=1, return_dict_in_generate=True, pad_token_id=0)
    assert _with_record(out, cache, record) is out and record_of(out) is record
    assert record_of(out.past_key_values) is record and record_of(cache) is None
    plain = torch.ones(1, 2)
    assert _with_record(plain, cache, record) is plain and record_of(cache) is record  # a tensor output: the cache


def test_resume_reads_the_given_mask_and_explains_an_edit_from_the_tokenizer_and_messages(dense):
    edited = LONGER.clone()
    edited[0, 6] = 99
    out = resume(dense, edited, tracked(dense), max_new_tokens=1, tokenizer=Words(), pad_token_id=0,
                 messages=[{"role": "user", "content": "99 17 18"}], return_dict_in_generate=True)
    assert record_of(out) == ResumeRecord(12, 6, 9, "edit", "message 0 was edited: text differs at character 18 "
                                                            "('16 17 18 19 20 21' -> '99 17 18 19 20 21 30')")
    mask = torch.ones(1, 15, dtype=torch.long)
    mask[0, 4] = 0
    out = resume(dense, LONGER, tracked(dense), attention_mask=mask, max_new_tokens=1, pad_token_id=0,
                 return_dict_in_generate=True)
    assert (record_of(out).reason, record_of(out).reused, record_of(out).fed) == ("mask", 4, 11)
    ref = dense.generate(LONGER, attention_mask=mask, max_new_tokens=1, pad_token_id=0)
    assert out.sequences[:, -1:].equal(ref[:, -1:]) and out.sequences.shape[-1] == 11 + 1  # the fed tokens + 1 new


def test_an_untracked_cache_or_other_rows_are_left_to_the_guarded_generate(dense):
    with torch.no_grad():
        untracked = dense(input_ids=IDS, use_cache=True).past_key_values
    out = resume(dense, LONGER, untracked, max_new_tokens=2, pad_token_id=0)
    assert out.equal(dense.generate(LONGER, max_new_tokens=2, pad_token_id=0)) and untracked.get_seq_length() == 16
    assert ledger_of(untracked) is None and record_of(out) is None
    two = LONGER.repeat(2, 1)
    cache = tracked(dense)
    with pytest.raises(Exception) as err:
        resume(dense, two, cache, max_new_tokens=1, pad_token_id=0)
    assert "ResumeInputError" in type(err.value).__name__ and cache.get_seq_length() == 12


def test_an_encoder_decoder_resume_needs_the_whole_decoder_sequence():
    bart = T.build("bart")
    enc = torch.tensor([[5, 6, 7, 8]])
    with track(bart), torch.no_grad():
        out = bart.generate(enc, max_new_tokens=3, return_dict_in_generate=True, use_cache=True)
    with pytest.raises(ValueError, match=r"^resume\(\) on an encoder-decoder takes the decoder's whole sequence as "
                                         r"decoder_input_ids$"):
        resume(bart, enc, out.past_key_values, max_new_tokens=1)


def test_a_plain_tensor_output_leaves_the_record_on_the_cache(dense):
    cache = tracked(dense)
    out = resume(dense, LONGER, cache, max_new_tokens=1, pad_token_id=0)
    assert isinstance(out, torch.Tensor) and record_of(cache) == ResumeRecord(12, 12, 3, "extends", "all 12 cached tokens reused")


def test_candidate_generation_this_release_feeds_wrongly_is_re_prefilled_and_says_so(dense):
    whole = torch.cat([LONGER, LONGER[:, :6]], 1)  # repeated text: prompt lookup finds candidates
    args = dict(max_new_tokens=3, pad_token_id=0, prompt_lookup_num_tokens=3)
    ref = dense.generate(whole, **args)
    out = resume(dense, whole, tracked(dense, LONGER), **args)
    record = record_of(out)
    assert out[:, -3:].equal(ref[:, -3:])
    if record.reason == "extends":  # a release that feeds it right reuses the whole cache
        assert (record.reused, record.fed) == (15, 6)
        return
    assert (record.cached, record.reused, record.fed, record.reason) == (15, 0, 21, "assisted")
    assert record.detail.startswith("prompt_lookup_num_tokens: this release's generate() cannot continue a cache with "
                                    "it (") and record.detail.endswith("); re-prefilled")


def test_a_second_image_turn_reuses_turn_one_and_a_replaced_image_ends_the_prefix_before_it(vl):
    tracker = track(vl)
    try:
        turns = T.both_turns()
        args = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
        extra = {k: v for k, v in turns.items() if k != "input_ids"}
        vl.model.rope_deltas = None
        ref = vl.generate(**turns, **args)
        with torch.no_grad():
            cache = T.first_turn_cache(vl)
        out = resume(vl, turns["input_ids"], cache, **extra, **args)
        assert out[:, -2:].equal(ref[:, -2:]) and record_of(out).reused == 82
        rows = int(T.prompt("multimodal")["image_grid_thw"].prod())
        other = dict(extra, pixel_values=torch.cat([torch.randn(rows, turns["pixel_values"].shape[1]),
                                                    turns["pixel_values"][rows:]]))
        with torch.no_grad():
            cache = T.first_turn_cache(vl)
        out = resume(vl, turns["input_ids"], cache, **other, **args)
        first_placeholder = int((turns["input_ids"][0] == T.IMAGE_TOKEN).nonzero()[0])
        assert (record_of(out).reason, record_of(out).reused) == ("image", first_placeholder)
        vl.model.rope_deltas = None
        assert out[:, -2:].equal(vl.generate(turns["input_ids"], **other, **args)[:, -2:])
    finally:
        tracker.remove()


def test_an_encoder_decoder_resume_reads_the_decoder_mask_and_resets_the_cross_attention():
    from transformers import EncoderDecoderCache

    bart = T.build("bart")
    enc = T.prompt("bart")["input_ids"]
    with track(bart), torch.no_grad():
        first = bart.generate(enc, generation_config=T.config(max_new_tokens=6, min_new_tokens=6),
                              past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()))
    dec = torch.cat([first.sequences, torch.tensor([[40, 41, 42]])], 1)
    mask = torch.ones_like(dec)
    mask[0, 2] = 0
    config = T.config(max_new_tokens=2, min_new_tokens=2)
    out = resume(bart, enc, first.past_key_values, decoder_input_ids=dec, decoder_attention_mask=mask,
                 generation_config=config)
    assert (record_of(out).reason, record_of(out).reused, record_of(out).fed) == ("mask", 2, 8)
    ref = bart.generate(enc, decoder_input_ids=dec, decoder_attention_mask=mask, generation_config=config)
    assert out.sequences[:, -2:].equal(ref.sequences[:, -2:])


def test_an_encoder_decoder_resume_keeps_the_encoder_s_padding_mask():
    """The encoder's attention_mask reaches generate() (dropped, the padded encoder tokens were attended: 6e-3 off)."""
    from transformers import EncoderDecoderCache

    bart = T.build("bart")
    enc, emask = torch.tensor([[1, 1, 5, 6, 7, 8]]), torch.tensor([[0, 0, 1, 1, 1, 1]])  # left padding
    with track(bart), torch.no_grad():
        first = bart.generate(enc, attention_mask=emask, generation_config=T.config(max_new_tokens=6, min_new_tokens=6),
                              past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()))
    dec = torch.cat([first.sequences, torch.tensor([[40, 41]])], 1)
    config = T.config(max_new_tokens=2, min_new_tokens=2)
    ref = bart.generate(enc, attention_mask=emask, decoder_input_ids=dec, generation_config=config)
    out = resume(bart, enc, first.past_key_values, attention_mask=emask, decoder_input_ids=dec, generation_config=config)
    assert (record_of(out).reason, record_of(out).reused) == ("extends", 6)
    assert out.sequences[:, -2:].equal(ref.sequences[:, -2:])
    T.assert_close(out.logits[0], ref.logits[0], "bart")
    _, kwargs = _arguments(bart, enc, dec, ledger_from_tensors(dec[:, :6]), None, {"attention_mask": emask}, True)
    assert kwargs["attention_mask"] is emask
