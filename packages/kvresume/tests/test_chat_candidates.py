"""Candidate generation (prompt lookup, an assistant model) beside a filled cache, as a chat server calls it: on 5.17.0
generate() feeds the suffix with only its own mask columns (0.57-0.61 off): refused by fed_mask_narrow, whose fix
(resume) restores; on 5.25.0 the same call is right and passes. The whole ids beside the cache: wrong on both (the
prompt re-fed), refused, and the refusal's fix restores."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from kvresume import ResumeInputError, check_resume_inputs, resume, testing as T, track
from kvresume.compat import generate_cache_kwarg
from kvresume.prefix import record_of
from kvresume.reuse import apply_fix

NEW = 3


def _setup() -> tuple[torch.nn.Module, torch.Tensor, DynamicCache]:
    m = T.build("dense")
    track(m)
    p = T.prompt("dense")["input_ids"]
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=p, **{T.cache_kw(m): cache}, use_cache=True)
    return m, torch.cat([p, p[:, :6]], 1), cache


def _same(out: object, ref: object) -> float:
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    diff = float((out.logits[-1] - ref.logits[-1]).abs().max())
    assert diff <= T.floor("dense")
    return diff


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant"])
def test_candidates_suffix_and_whole(mode: str) -> None:
    m, whole, cache = _setup()
    extra = {"prompt_lookup_num_tokens": 3} if mode == "prompt_lookup" else {"assistant_model": T.build("assistant")}
    cfg = T.config(max_new_tokens=NEW)
    ref = m.generate(whole, generation_config=cfg)
    name = generate_cache_kwarg(m)
    suffix = {"attention_mask": torch.ones_like(whole), "generation_config": cfg, **extra}
    plain = m.generate(whole[:, 24:], **{name: copy.deepcopy(cache)}, **suffix)
    right = float((plain.logits[-1] - ref.logits[-1]).abs().max()) <= T.floor("dense") and \
        torch.equal(plain.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    try:
        check_resume_inputs(m, whole[:, 24:], **{name: cache}, **suffix)
        refused = None
    except ResumeInputError as exc:
        refused = exc
    assert (refused is None) == right  # refused exactly where it is wrong (5.17.0), passed where right (5.25.0)
    if refused is not None:
        assert refused.check == "fed_mask_narrow" and refused.fix == {"resume": True}
        out = resume(m, whole, copy.deepcopy(cache), generation_config=cfg, **extra)
        _same(out, ref)
        assert record_of(out).reused == 0
    with pytest.raises(ResumeInputError) as err:  # the whole ids beside the cache: the prompt re-fed
        check_resume_inputs(m, whole, **{name: cache}, generation_config=cfg, **extra)
    fixed, kw = apply_fix(err.value.fix, cache, {"input_ids": whole, "generation_config": cfg, **extra})
    _same(m.generate(**kw, **{name: fixed}), ref)


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant"])
def test_whole_ids_on_a_model_whose_positions_follow_the_cache_position(mode: str) -> None:
    """BartForCausalLM (learned positions from the cache position, no rotary for the positions check to read): the
    whole ids beside the cache with candidate generation feed the cached prompt again (0.62 off measured on both
    releases); refused by ledger_length for that cause, its fix restores, resume() equals the no-cache run."""
    import transformers

    torch.manual_seed(0)
    m = transformers.BartForCausalLM(T.bart_config()).eval()
    track(m)
    p = T.prompt("dense")["input_ids"]
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=p, **{T.cache_kw(m): cache}, use_cache=True)
    whole = torch.cat([p, p[:, :6]], 1)
    torch.manual_seed(1)
    extra = {"prompt_lookup_num_tokens": 3} if mode == "prompt_lookup" else \
        {"assistant_model": transformers.BartForCausalLM(T.bart_config()).eval()}
    cfg, name = T.config(max_new_tokens=NEW), generate_cache_kwarg(m)
    ref = m.generate(whole, generation_config=cfg, **extra)
    plain = m.generate(whole, **{name: copy.deepcopy(cache)}, generation_config=cfg, **extra)
    assert float((plain.logits[-1] - ref.logits[-1]).abs().max()) > 100 * T.floor("dense")  # the prompt re-fed
    with pytest.raises(ResumeInputError) as err:
        check_resume_inputs(m, whole, **{name: cache}, generation_config=cfg, **extra)
    assert err.value.check == "ledger_length" and "feeds all 30 input_ids" in str(err.value)
    fixed, kw = apply_fix(err.value.fix, cache, {"input_ids": whole, "generation_config": cfg, **extra})
    _same(m.generate(**kw, **{name: fixed}), ref)
    _same(resume(m, whole, copy.deepcopy(cache), generation_config=cfg, **extra), ref)
