"""resume() and the guard on the text calls a chat server makes: each resume equals the no-cache greedy run (tokens
equal, last logits within the floor) with its reused-token count asserted; each refusal names the cause and its fix,
applied, restores."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers.cache_utils import StaticLayer

from kvresume import ResumeInputError, check_resume_inputs, resume, testing as T
from kvresume.reuse import apply_fix

from chat_common import NEW, assert_same, cache_kw, cfg, prefill, record, reference, tracked


STATIC_CROPS = hasattr(StaticLayer, "crop")  # 5.25.0 gives static layers a crop; 5.17.0 has none


def _prompt(kind: str = "dense") -> torch.Tensor:
    return T.prompt(kind)["input_ids"]


def _more(k: int, seed: int = 5) -> torch.Tensor:
    return torch.randint(10, 2038, (1, k), generator=torch.Generator().manual_seed(seed))


def test_a_next_turn_reuses_the_whole_cache() -> None:
    m, p = tracked("dense"), _prompt()
    whole = torch.cat([p, _more(6)], 1)
    out = resume(m, whole, prefill(m, p), generation_config=cfg())
    assert_same(out, reference(m, whole), "dense")
    assert (record(out).reused, record(out).fed, record(out).reason) == (24, 6, "extends")


def test_left_padded_batch_kept_prefix_inside_padding() -> None:
    m = tracked("dense")
    a, b = _more(10, 1), _more(4, 2)
    ids1 = torch.cat([a, torch.cat([torch.zeros(1, 6, dtype=torch.long), b], 1)])
    mask1 = torch.cat([torch.ones(1, 10), torch.cat([torch.zeros(1, 6), torch.ones(1, 4)], 1)]).long()
    cache = prefill(m, ids1, mask1)
    ids2 = torch.cat([torch.cat([a[:, :3], _more(9, 3)], 1), torch.cat([ids1[1:], _more(2, 4)], 1)])
    mask2 = torch.cat([mask1, torch.ones(2, 2, dtype=torch.long)], 1)
    out = resume(m, ids2, cache, attention_mask=mask2, generation_config=cfg())
    assert_same(out, reference(m, ids2, mask2), "dense")
    assert record(out).reused == 3  # column 3 differs in row 0; it ends inside row 1's padding


@pytest.mark.parametrize("which", ["prompt_lookup", "assistant"])
def test_candidate_generation_reuses_where_the_release_feeds_it_right(which: str) -> None:
    """Prompt lookup / assisted decoding beside a cache: the plain suffix call (full mask, positions) is exact on
    5.25.0 and wrong on 5.17.0 (its first call's mask narrowed to the ids: 0.31 off). The guard refuses it exactly
    where it is wrong; resume() reuses the whole cache where it is right and re-prefills (reason assisted) where not."""
    m, p = tracked("dense"), _prompt()
    whole = torch.cat([p, p[:, :6]], 1)  # repeated text: prompt lookup finds candidates
    extra = {"assistant_model": T.build("assistant")} if which == "assistant" else {"prompt_lookup_num_tokens": 3}
    ref = reference(m, whole, **extra)
    plain = dict(attention_mask=torch.ones_like(whole), position_ids=torch.arange(24, 30).view(1, -1),
                 generation_config=cfg(), **extra)
    got = m.generate(whole[:, 24:], **{cache_kw(m): prefill(m, p)}, **plain)
    exact = torch.equal(got.sequences[:, -NEW:], ref.sequences[:, -NEW:]) and \
        float((got.logits[-1] - ref.logits[-1]).abs().max()) <= T.floor("dense")
    try:
        check_resume_inputs(m, whole[:, 24:], **{cache_kw(m): prefill(m, p)}, **plain)
        refused = False
    except ResumeInputError:
        refused = True
    assert refused != exact
    out = resume(m, whole, prefill(m, p), generation_config=cfg(), **extra)
    assert_same(out, ref, "dense")
    assert (record(out).reused, record(out).reason) == ((24, "extends") if exact else (0, "assisted"))


def test_regenerate_plain_generate_is_wrong_once_the_answer_differs_and_is_refused() -> None:
    """ids = the prompt, the cache also holds the old answer: plain generate() re-feeds ids[3:] and its mask of 24
    columns makes step 2 attend the OLD answer's slot 24 instead of the new token: right only where the new answer
    equals the old (greedy); sampled, its step-2 logits are off (0.03-0.13 measured). Refused; the fix restores."""
    m, p = tracked("dense"), _prompt()
    cache = prefill(m, torch.cat([p, _more(3)], 1))  # prompt + an old answer (not the greedy one)
    ref = reference(m, p)
    plain = m.generate(p, generation_config=cfg(), **{cache_kw(m): copy.deepcopy(cache)})
    assert float((plain.logits[1] - ref.logits[1]).abs().max()) > 1e-3  # silently wrong from step 2
    with pytest.raises(ResumeInputError) as err:
        check_resume_inputs(m, p, **{cache_kw(m): copy.deepcopy(cache)}, generation_config=cfg())
    assert err.value.check == "ledger_length"
    fixed, kw = apply_fix(err.value.fix, cache, {"input_ids": p, "generation_config": cfg()})
    assert_same(m.generate(**kw, **{cache_kw(m): fixed}), ref, "dense")
    out = resume(m, p, cache, generation_config=cfg())
    assert_same(out, ref, "dense")
    assert (record(out).reused, record(out).reason) == (23, "regenerate")


def _stuck(m: torch.nn.Module, p: torch.Tensor) -> object:
    """A cache of p whose last 4 slots were written at one stuck position (20)."""
    cache = prefill(m, p[:, :20])
    with torch.no_grad():
        m(input_ids=p[:, 20:], position_ids=torch.full((1, 4), 20), **{cache_kw(m): cache}, use_cache=True)
    return cache


def test_stuck_positions_refused_and_re_fed() -> None:
    m, p = tracked("dense"), _prompt()
    whole = torch.cat([p, _more(4)], 1)
    ref = reference(m, whole)
    cache = _stuck(m, p)
    with pytest.raises(ResumeInputError) as err:
        check_resume_inputs(m, whole[:, 24:], attention_mask=torch.ones_like(whole),
                            **{cache_kw(m): cache}, generation_config=cfg())
    assert err.value.check == "ledger_positions" and "stuck" in str(err.value) and err.value.fix == {"resume": True}
    out = resume(m, whole, cache, generation_config=cfg())  # the fix: the whole sequence through resume
    assert_same(out, ref, "dense")
    assert (record(out).reused, record(out).reason) == (21, "misplaced")


@pytest.mark.parametrize("static", [False, True])
def test_uncroppable_cache_re_prefills_an_edit_and_refuses_by_name(static: bool) -> None:
    kind = "dense" if static else "sliding"
    m, p = tracked(kind), _prompt(kind)
    cache = prefill(m, p[:, :-1], static=static)
    edited = p.clone()
    edited[0, 12] = 7
    ref = reference(m, edited)
    with pytest.raises(ResumeInputError) as err:
        check_resume_inputs(m, edited, **{cache_kw(m): cache}, generation_config=cfg())
    if static and STATIC_CROPS:  # 5.25: a StaticLayer crops (its cumulative_length, in place): the crop fix restores
        assert err.value.fix == {"crop": 12}
        fixed, kw = apply_fix(err.value.fix, cache, {"input_ids": edited, "generation_config": cfg()})
        assert_same(m.generate(**kw, **{cache_kw(m): fixed}), ref, kind)
    else:
        assert err.value.fix == {"resume": True} and "cannot be cropped" in str(err.value)
    out = resume(m, edited, cache, generation_config=cfg())
    assert_same(out, ref, kind)
    if static and STATIC_CROPS:
        assert (record(out).reused, record(out).reason) == (12, "differs")
    else:
        assert record(out).reused == 0 and "cannot be cropped" in record(out).detail


@pytest.mark.parametrize("static", [False, True])
def test_uncroppable_cache_extends_in_place(static: bool) -> None:
    kind = "dense" if static else "sliding"
    m, p = tracked(kind), _prompt(kind)
    cache = prefill(m, p[:, :-1], static=static)
    out = resume(m, p, cache, generation_config=cfg())
    assert_same(out, reference(m, p), kind)
    assert record(out).reused == p.shape[1] - 1


@pytest.mark.e2e  # a multi-step run: in `make test`, not test-fast
def test_static_cache_reused_over_turns_then_edited() -> None:
    m, p = tracked("dense"), _prompt()
    cache = prefill(m, p[:, :-1], static=True)
    out = resume(m, p, cache, generation_config=cfg())
    turn2 = torch.cat([p, out.sequences[:, -3:], _more(5)], 1)
    out2 = resume(m, turn2, cache, generation_config=cfg())
    assert_same(out2, reference(m, turn2), "dense")
    assert record(out2).reused == p.shape[1] + 2  # the prompt and the answer's first 2 tokens (the 3rd was not fed)
    edited = turn2.clone()
    edited[0, 5] = 9
    out3 = resume(m, edited, cache, generation_config=cfg())
    assert_same(out3, reference(m, edited), "dense")
    assert record(out3).reused == (5 if STATIC_CROPS else 0)  # 5.17: re-prefilled (reset in place); 5.25: cropped


@pytest.mark.e2e  # a multi-step run: in `make test`, not test-fast
def test_encoder_decoder_resume_and_cached_already_fix() -> None:
    """BART: resume() keeps the decoder's cached prefix; the "cached already" refusal's fix sets
    decoder_attention_mask (not attention_mask, the encoder's) and, applied, restores."""
    m = tracked("bart")
    enc = T.prompt("bart")["input_ids"]
    bart = T.config(max_new_tokens=NEW, min_new_tokens=NEW)  # the tiny model's first greedy token is EOS
    first = m.generate(enc, generation_config=T.config(max_new_tokens=6, min_new_tokens=6), **{cache_kw(m): _edc()})
    cache = first.past_key_values if hasattr(first, "past_key_values") else first.cache
    dec = torch.cat([first.sequences, _more(3)], 1)
    ref = m.generate(enc, decoder_input_ids=dec, generation_config=bart)
    out = resume(m, enc, copy.deepcopy(cache), decoder_input_ids=dec, generation_config=bart)
    assert_same(out, ref, "bart")
    assert (record(out).reused, record(out).reason) == (first.sequences.shape[1] - 1, "extends")
    from kvresume import ledger_of
    cached = ledger_of(cache).token_ids
    assert cached.shape[1] == first.sequences.shape[1] - 1 == 6
    with pytest.raises(ResumeInputError) as err:  # the cache's last 2 tokens passed again: cached already
        check_resume_inputs(m, enc, decoder_input_ids=cached[:, -2:], **{cache_kw(m): cache}, generation_config=bart)
    assert "decoder_attention_mask" in err.value.fix and "attention_mask" not in err.value.fix
    fixed, kw = apply_fix(err.value.fix, cache, {"decoder_input_ids": cached[:, -2:], "generation_config": bart})
    got = m.generate(enc, **kw, **{cache_kw(m): fixed})
    assert_same(got, m.generate(enc, decoder_input_ids=cached, generation_config=bart), "bart")


def _edc() -> object:
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), DynamicCache())
