"""resume()'s parts, each fed the case that contradicts it: a crop at, below and past the held tokens (the stored
ledger trimmed with it), a re-prefill's fresh cache per cache class (a StaticCache reset in place and its marks
dropped), a cache that cannot be cropped, the candidate-generation arguments, and apply_fix's every field."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig, StaticCache

from kvresume import ledger_of, track
from kvresume.ledger import Ledger, ledger_from_tensors, stored_ledger
from kvresume.linear_checks import ATTR as LINEAR_MARKS
from kvresume.prefix import ResumeRecord
from kvresume.reuse import _candidates, apply_fix, crop_to, cropped, fresh, plan
from kvresume.testing import build

IDS = torch.arange(10, 22).view(1, -1)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    return build("dense")


def tracked(m: torch.nn.Module, ids: torch.Tensor = IDS) -> DynamicCache:
    with track(m), torch.no_grad():
        return m(input_ids=ids, use_cache=True).past_key_values


def test_a_crop_below_the_held_tokens_trims_the_stored_ledger_and_at_them_changes_nothing(dense):
    cache = tracked(dense)
    assert crop_to(cache, 12) is cache and cache.get_seq_length() == 12 and stored_ledger(cache).length == 12
    assert crop_to(cache, 8) is cache and cache.get_seq_length() == 8
    assert stored_ledger(cache).length == 8 and stored_ledger(cache).token_ids.equal(IDS[:, :8])
    assert ledger_of(cache).token_ids.equal(IDS[:, :8])
    untracked = dense(input_ids=IDS, use_cache=True).past_key_values
    assert crop_to(untracked, 5).get_seq_length() == 5 and stored_ledger(untracked) is None


def test_cropped_keeps_the_cache_where_it_can_and_re_prefills_where_it_cannot(dense):
    cache = tracked(dense)
    assert cropped(dense, cache, 12) == (cache, 12, "") and cropped(dense, cache, 13) == (cache, 13, "")
    assert cropped(dense, cache, 5) == (cache, 5, "") and cache.get_seq_length() == 5
    sliding = build("sliding")
    with torch.no_grad():
        past_window = sliding(input_ids=torch.arange(10, 50).view(1, -1), use_cache=True).past_key_values
    out, keep, why = cropped(sliding, past_window, 10)
    assert type(out) is DynamicCache and out is not past_window and out.get_seq_length() == 0 and keep == 0
    assert [type(l).__name__ for l in out.layers] == [type(l).__name__ for l in past_window.layers]
    assert why.startswith("the cache cannot be cropped to 10 tokens (RuntimeError: `crop` was called") and \
        why.endswith("); re-prefilled")


def test_a_fresh_cache_is_empty_and_of_the_cache_s_own_kind(dense):
    cache = tracked(dense)
    new = fresh(dense, cache)
    assert type(new) is DynamicCache and new is not cache and new.get_seq_length() == 0 and cache.get_seq_length() == 12
    enc_dec = fresh(build("bart"), EncoderDecoderCache(DynamicCache(), DynamicCache()))
    assert type(enc_dec) is EncoderDecoderCache
    assert type(enc_dec.self_attention_cache) is DynamicCache and type(enc_dec.cross_attention_cache) is DynamicCache
    assert enc_dec.self_attention_cache is not enc_dec.cross_attention_cache


def test_a_static_cache_is_reset_in_place_without_its_ledger_or_linear_marks(dense):
    static = StaticCache(config=dense.config, max_cache_len=32)
    with track(dense), torch.no_grad():
        dense(input_ids=IDS, past_key_values=static, use_cache=True)
    static.__dict__[LINEAR_MARKS] = "marks"
    assert stored_ledger(static) is not None and static.get_seq_length() == 12
    assert fresh(dense, static) is static
    assert static.get_seq_length() == 0 and "kv_ledger" not in static.__dict__ and LINEAR_MARKS not in static.__dict__


def test_candidates_are_named_from_the_call_or_its_generation_config(dense):
    assert _candidates({}) is None and _candidates({"generation_config": GenerationConfig()}) is None
    assert _candidates({"assistant_model": dense}) == "assistant_model"
    assert _candidates({"prompt_lookup_num_tokens": 3, "generation_config": GenerationConfig()}) == "prompt_lookup_num_tokens"
    assert _candidates({"generation_config": GenerationConfig(prompt_lookup_num_tokens=3)}) == "prompt_lookup_num_tokens"
    assert _candidates({"assistant_early_exit": 2}) == "assistant_early_exit"
    assert _candidates({"prompt_lookup_num_tokens": None, "max_new_tokens": 3}) is None


def test_apply_fix_crops_a_copy_unless_told_and_replaces_each_named_argument(dense):
    cache = tracked(dense)
    kwargs = {"input_ids": IDS[:, -1:], "attention_mask": torch.ones(1, 13, dtype=torch.long), "max_new_tokens": 2}
    out, args = apply_fix({"crop": 8}, cache, kwargs)
    assert out is not cache and out.get_seq_length() == 8 and cache.get_seq_length() == 12 and args == kwargs
    assert args is not kwargs and stored_ledger(out).length == 8
    same, _ = apply_fix({"crop": 9}, cache, kwargs, copy_cache=False)
    assert same is cache and cache.get_seq_length() == 9
    assert apply_fix({"crop": None}, cache, kwargs, copy_cache=False)[0].get_seq_length() == 9
    other = tracked(dense, IDS[:, :4])
    rebuilt, _ = apply_fix({"cache": other}, cache, kwargs)
    assert rebuilt is not other and rebuilt.get_seq_length() == 4
    fixed = {name: torch.full((1, 3), i) for i, name in
             enumerate(("attention_mask", "position_ids", "decoder_attention_mask", "decoder_input_ids"))}
    _, args = apply_fix(fixed, cache, kwargs)
    assert all(args[k] is v for k, v in fixed.items()) and args["max_new_tokens"] == 2 and args["input_ids"] is kwargs["input_ids"]


def test_apply_fix_s_call_replaces_the_arguments_keeping_the_generation_config(dense):
    cache = tracked(dense)
    config = GenerationConfig(max_new_tokens=1)
    mask = torch.ones(1, 12, dtype=torch.long)
    _, args = apply_fix({"call": (IDS, {"attention_mask": mask}), "position_ids": torch.arange(12).view(1, -1)}, cache,
                        {"input_ids": IDS[:, -1:], "generation_config": config, "max_new_tokens": 2})
    assert set(args) == {"generation_config", "input_ids", "attention_mask", "position_ids"}
    assert args["generation_config"] is config and args["input_ids"] is IDS and args["attention_mask"] is mask
    assert copy.deepcopy(args["position_ids"]).equal(torch.arange(12).view(1, -1))


# --- plan: how much is reused and why not more, on hand-made ledgers ------------------------------------------------

CACHED = ledger_from_tensors(IDS)  # 12 slots at positions 0..11, all attended
LONGER = torch.cat([IDS, torch.tensor([[30, 31, 32]])], 1)


class Words:
    """A tokenizer whose text is the ids as words (explain() decodes both sides)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)


def stuck(at: int) -> Ledger:
    """CACHED written at a stuck position from slot `at` on."""
    pos = torch.arange(12).clamp(max=at - 1).view(1, -1)
    return ledger_from_tensors(IDS, pos)


def test_plan_extends_when_every_cached_token_is_reused():
    assert plan(CACHED, LONGER, None) == ResumeRecord(12, 12, 0, "extends", "all 12 cached tokens reused")


def test_plan_regenerates_ids_the_cache_holds_keeping_one_token_to_feed():
    assert plan(CACHED, IDS[:, :8], None) == \
        ResumeRecord(12, 7, 0, "regenerate", "the ids are the cache's first 8 tokens: re-fed from token 7")
    assert plan(CACHED, IDS, None) == \
        ResumeRecord(12, 11, 0, "regenerate", "the ids are the cache's first 12 tokens: re-fed from token 11")


def test_plan_stops_at_a_mask_bit_that_differs_or_a_stuck_position_naming_which():
    mask = torch.ones(1, 15, dtype=torch.long)
    mask[0, 4] = 0
    assert plan(CACHED, LONGER, mask) == ResumeRecord(
        12, 4, 0, "mask", "the given mask differs from the cached slots' at token 4 (padding): re-fed")
    assert plan(stuck(6), LONGER, None) == ResumeRecord(
        12, 6, 0, "misplaced", "cached slots from 6 were written at stuck positions: re-fed")
    assert plan(stuck(8), LONGER, mask).reason == "mask"  # the mask breaks first, before the stuck slots


def test_plan_explains_a_differing_token_with_the_tokenizer_and_messages_given():
    edited = LONGER.clone()
    edited[0, 6] = 99
    assert plan(CACHED, edited, None) == ResumeRecord(
        12, 6, 0, "differs", "the ids differ from the cached ones at token 6 (no tokenizer given to say why)")
    record = plan(CACHED, edited, None, Words())
    assert (record.reason, record.reused) == ("template", 6) and "earlier text changed at character 18 ('16 " in record.detail
    record = plan(CACHED, edited, None, Words(), [{"role": "user", "content": "99 17 18"}])
    assert record == ResumeRecord(12, 6, 0, "edit", "message 0 was edited: text differs at character 18 "
                                                    "('16 17 18 19 20 21' -> '99 17 18 19 20 21 30')")


def test_a_cache_whose_layers_cannot_crop_is_reset_in_place_too(dense):
    from types import SimpleNamespace

    class Uncroppable(DynamicCache):
        """A cache whose layers have no crop (an older release's static layers)."""

    cache = Uncroppable()
    cache.layers = [SimpleNamespace(get_seq_length=lambda: 0)]
    cache.reset = lambda: cache.__dict__.setdefault("was_reset", True)
    cache.__dict__["kv_ledger"] = "ledger"
    assert fresh(dense, cache) is cache and cache.__dict__.get("was_reset") and "kv_ledger" not in cache.__dict__
