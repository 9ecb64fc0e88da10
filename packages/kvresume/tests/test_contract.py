"""The resume contract as tests: documented usage equals the full computation (and the guard stays silent on it);
misuse raises a clear error under the guard, and plain generate() is expected to raise too (xfail until it does).
Nothing here depends on the release it runs on. Needs kvresume (torch, transformers) and pytest only.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from kvresume.guard import guarded_generate
from kvresume.testing import (assert_close, both_turns, build, cache_kw, first_turn_cache, full_logits,
                             model, prefix_cache, prompt, rebuild_update, second_turn_kwargs,
                             second_turn_positions, step, text_positions)

TEXT = ["dense", "llama"]
SHOULD_RAISE = "generate() should raise here"


def both_ways(m: torch.nn.Module, inputs: Any, cache: Any, fields: dict[str, Any] | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain generate()'s first-step logits, guarded_generate's): the guard must pass and change nothing."""
    plain = step(m, inputs, cache, fields=fields, **kwargs)
    guarded = step(m, inputs, cache, generate=guarded_generate, fields=fields, **kwargs)
    assert torch.equal(plain, guarded), "guarded_generate changed generate()'s result"
    return plain, guarded


def ones(n: int, batch: int = 1) -> torch.Tensor:
    return torch.ones(batch, n, dtype=torch.long)


# --- documented usage: equals the full computation, the guard silent --------------------------------------------

@pytest.mark.parametrize("kind", TEXT + ["multimodal", "sliding", "hybrid"])
def test_suffix_with_full_mask(kind):
    m, p = model(kind), prompt(kind)
    got, _ = both_ways(m, None, prefix_cache(m, p), input_ids=p["input_ids"][:, -1:], attention_mask=p["attention_mask"])
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_suffix_with_mask_and_positions(kind):
    m, p = model(kind), prompt(kind)
    n = p["input_ids"].shape[1]
    got, _ = both_ways(m, None, prefix_cache(m, p), input_ids=p["input_ids"][:, -1:], attention_mask=p["attention_mask"],
                       position_ids=text_positions(m, n - 1))
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_returned_sequences_and_cache(kind):
    m, p = model(kind), prompt(kind)
    first = m.generate(p["input_ids"][:, :16], max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                       pad_token_id=0)
    seqs = first.sequences
    cache = getattr(first, "cache", None) or first.past_key_values
    got, _ = both_ways(m, seqs, cache, attention_mask=ones(seqs.shape[1]))
    assert_close(got, full_logits(m, {"input_ids": seqs}), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_multi_token_suffix(kind):
    m, p = model(kind), prompt(kind)
    ids = p["input_ids"]
    cache = prefix_cache(m, {"input_ids": ids[:, :-3], "attention_mask": ones(ids.shape[1] - 3)})  # prefix_cache cuts one
    got, _ = both_ways(m, ids[:, -4:], cache, attention_mask=ones(ids.shape[1]))
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_inputs_embeds_with_cache(kind):
    m, p = model(kind), prompt(kind)
    embeds = m.get_input_embeddings()(p["input_ids"]).detach()
    got, _ = both_ways(m, None, prefix_cache(m, p), inputs_embeds=embeds, attention_mask=p["attention_mask"])
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_positional_inputs(kind):
    m, p = model(kind), prompt(kind)
    got, _ = both_ways(m, p["input_ids"][:, -1:], prefix_cache(m, p), attention_mask=p["attention_mask"])
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_beam_search_from_a_cache(kind):
    m, p = model(kind), prompt(kind)
    cache = copy.deepcopy(prefix_cache(m, p))
    cache.batch_repeat_interleave(2)  # one copy per beam: generate() expands the inputs, not the cache
    got, _ = both_ways(m, p["input_ids"][:, -1:], cache, fields={"num_beams": 2}, attention_mask=p["attention_mask"])
    assert_close(got[:1], full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_static_cache_larger_than_the_sequence(kind):
    from transformers import StaticCache

    m, p = model(kind), prompt(kind)
    cache = StaticCache(config=m.config, max_cache_len=64)
    with torch.no_grad():
        m(input_ids=p["input_ids"][:, :-1], use_cache=True, **{cache_kw(m): cache})
    got, _ = both_ways(m, p["input_ids"][:, -1:], cache, attention_mask=p["attention_mask"])
    assert_close(got, full_logits(m, p), kind)


@pytest.mark.parametrize("kind", TEXT)
def test_left_padded_batch(kind):
    m = model(kind)
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(10, 2038, (n,), generator=gen) for n in (12, 20)]
    ids, mask = torch.zeros(2, 20, dtype=torch.long), torch.zeros(2, 20, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 20 - len(r):], mask[i, 20 - len(r):] = r, 1
    first = m.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                       pad_token_id=0)
    seqs, cache = first.sequences, getattr(first, "cache", None) or first.past_key_values
    full = torch.cat([mask, ones(seqs.shape[1] - 20, 2)], dim=1)
    got, _ = both_ways(m, seqs, cache, attention_mask=full)
    want = torch.cat([full_logits(m, {"input_ids": seqs[i][full[i].bool()].view(1, -1)}) for i in range(2)])
    assert_close(got, want, kind)


def test_encoder_decoder_continuation():
    m, p = model("bart"), prompt("bart")
    first = m.generate(**p, max_new_tokens=7, min_new_tokens=7, do_sample=False, return_dict_in_generate=True)
    seqs, cache = first.sequences, getattr(first, "cache", None) or first.past_key_values
    got, _ = both_ways(m, p["input_ids"], cache, attention_mask=p["attention_mask"], decoder_input_ids=seqs,
                       decoder_attention_mask=ones(seqs.shape[1]))
    assert_close(got, full_logits(m, {**p, "decoder_input_ids": seqs}), "bart")


def test_mrope_position_ids_with_four_rows():
    m, p = model("multimodal"), prompt("multimodal")
    cache, n = prefix_cache(m, p), p["input_ids"].shape[1]
    four = torch.cat([torch.full((1, 1, 1), n - 1), text_positions(m, n - 1)])
    got, _ = both_ways(m, None, cache, input_ids=p["input_ids"][:, -1:], attention_mask=p["attention_mask"],
                       position_ids=four)
    assert_close(got, full_logits(m, p), "multimodal")


@pytest.mark.parametrize("text_only", [False, True], ids=["new_image", "text_only"])
def test_second_turn_from_the_first_turns_cache(text_only):
    """A chat's second turn resumed from the first turn's cache equals one forward over both turns: with a new image at
    the positions get_rope_index gives over both turns' ids and grids (4 rows), a text-only turn as it is."""
    m = model("multimodal")
    target = full_logits(m, both_turns(text_only))
    cache = first_turn_cache(m)
    positions = {} if text_only else {"position_ids": second_turn_positions(m)}
    got, _ = both_ways(m, None, cache, **second_turn_kwargs(m, text_only), **positions)
    assert_close(got, target, "multimodal")


@pytest.mark.parametrize("kind", ["dense", "multimodal", "sliding"])
def test_identity_rebuild_into_a_config_aware_cache(kind):
    m, p = model(kind), prompt(kind)
    cache = rebuild_update(prefix_cache(m, p), m.config.get_text_config(decoder=True))
    got, _ = both_ways(m, None, cache, input_ids=p["input_ids"][:, -1:], attention_mask=p["attention_mask"])
    assert_close(got, full_logits(m, p), kind)


def test_assisted_decoding_internal_calls_with_masked_tokens():
    """Assisted decoding from a prompt with masked tokens mid-sequence: the guard passes it, and its greedy tokens are
    the main model's own."""
    m, a = model("dense"), build("assistant")
    ids = prompt("dense")["input_ids"][:, :16]
    mask = ones(16)
    mask[:, 1:7] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    plain = m.generate(ids, **kw).cpu()
    assert torch.equal(guarded_generate(m, ids, assistant_model=a, **kw), plain)


# --- misuse: a clear error under the guard; plain generate() should raise too -----------------------------------

def _misuse(kind: str, case: str) -> tuple[torch.nn.Module, Any, Any, dict[str, Any], str]:
    """(model, inputs, cache, generate() kwargs, what the guard's message must say) of one misuse."""
    m, p = model(kind), prompt(kind)
    ids, mask, cache = p["input_ids"], p["attention_mask"], prefix_cache(m, p)
    n = ids.shape[1]
    table = {
        "suffix_mask_only": (ids[:, -1:], cache, {"attention_mask": mask[:, -1:]}, f"pass the full mask of {n} columns"),
        "no_mask": (ids[:, -1:], cache, {}, f"Pass attention_mask with {n} columns"),
        "positions_no_mask": (ids[:, -1:], cache, {"position_ids": torch.tensor([[n - 1]])},
                              f"Pass attention_mask with {n} columns"),
        "mask_too_wide": (ids[:, -1:], cache, {"attention_mask": ones(n + 2)}, f"needs {n} \\(cached \\+ suffix\\)"),
    }
    return (m, *table[case])


MISUSE = [(k, c) for k in TEXT for c in ("suffix_mask_only", "no_mask", "positions_no_mask", "mask_too_wide")]


@pytest.mark.parametrize("kind,case", MISUSE)
def test_misuse_refused_by_the_guard(kind, case):
    m, inputs, cache, kwargs, says = _misuse(kind, case)
    with pytest.raises(ValueError, match=says):
        step(m, inputs, cache, generate=guarded_generate, **kwargs)


@pytest.mark.xfail(reason=SHOULD_RAISE, raises=AssertionError, strict=False)
@pytest.mark.parametrize("kind,case", MISUSE)
def test_misuse_raises_in_generate(kind, case):
    m, inputs, cache, kwargs, _ = _misuse(kind, case)
    try:
        step(m, inputs, cache, **kwargs)
    except ValueError:
        return
    except Exception as exc:  # noqa: BLE001 - an error from deep inside the model call is not the clear error asked for
        raise AssertionError(f"{SHOULD_RAISE}: a ValueError before the model call, not {type(exc).__name__}") from exc
    raise AssertionError(SHOULD_RAISE)


def _other_misuse(case: str) -> tuple[torch.nn.Module, Any, Any, dict[str, Any], str]:
    if case == "decoder_ids_without_decoder_mask":
        m, p = model("bart"), prompt("bart")
        first = m.generate(**p, max_new_tokens=7, min_new_tokens=7, do_sample=False, return_dict_in_generate=True)
        cache = getattr(first, "cache", None) or first.past_key_values
        return m, p["input_ids"], cache, {"attention_mask": p["attention_mask"], "decoder_input_ids": first.sequences}, \
            "pass decoder_attention_mask"
    if case == "assisted_from_prefix_cache":
        m, p = model("dense"), prompt("dense")
        return m, p["input_ids"], prefix_cache(m, p), {"attention_mask": p["attention_mask"],
                                                       "assistant_model": build("assistant")}, "attention_mask has"
    if case == "hybrid_linear_layers_empty":
        m, p = model("hybrid"), prompt("hybrid")
        return m, None, rebuild_update(prefix_cache(m, p), m.config), {"input_ids": p["input_ids"][:, -1:],
                                                                        "attention_mask": p["attention_mask"]}, "conv/recurrent"
    if case == "per_layer_compressed_without_positions":
        m, p = model("dense"), prompt("dense")
        cache = copy.deepcopy(prefix_cache(m, p))
        for i, layer in enumerate(cache.layers):
            layer.keys, layer.values = layer.keys[:, :, -(20 - 4 * i):].clone(), layer.values[:, :, -(20 - 4 * i):].clone()
        return m, p["input_ids"][:, -1:], cache, {"attention_mask": ones(int(cache.get_seq_length()) + 1)}, "position_ids"
    if case == "new_image_without_positions":  # a second turn's new image, positions left to generate()
        m = model("multimodal")
        return m, None, first_turn_cache(m), second_turn_kwargs(m), "get_rope_index"
    m, p = model("multimodal"), prompt("multimodal")  # rope_deltas_missing: a fresh instance
    cache = prefix_cache(m, p)
    fresh = build("multimodal")
    return fresh, None, cache, {"input_ids": p["input_ids"][:, -1:], "attention_mask": p["attention_mask"]}, "rope_deltas"


OTHER = ["decoder_ids_without_decoder_mask", "assisted_from_prefix_cache", "hybrid_linear_layers_empty",
         "per_layer_compressed_without_positions", "rope_deltas_missing", "new_image_without_positions"]


@pytest.mark.parametrize("case", OTHER)
def test_other_misuse_refused_by_the_guard(case):
    m, inputs, cache, kwargs, says = _other_misuse(case)
    with pytest.raises(ValueError, match=says):
        step(m, inputs, cache, generate=guarded_generate, **kwargs)


@pytest.mark.xfail(reason=SHOULD_RAISE, raises=AssertionError, strict=False)
@pytest.mark.parametrize("case", OTHER)
def test_other_misuse_raises_in_generate(case):
    m, inputs, cache, kwargs, _ = _other_misuse(case)
    try:
        step(m, inputs, cache, **kwargs)
    except ValueError:
        return
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{SHOULD_RAISE}: a ValueError before the model call, not {type(exc).__name__}") from exc
    raise AssertionError(SHOULD_RAISE)


def test_processed_length_refuses_a_token_already_cached():
    """Given how many tokens the caller processed, a suffix token the cache already holds is refused."""
    m, p = model("dense"), prompt("dense")
    n = p["input_ids"].shape[1]
    with pytest.raises(ValueError, match="already holds"):
        step(m, p["input_ids"][:, -1:], prefix_cache(m, p), generate=lambda mm, *a, **k: guarded_generate(
            mm, *a, processed_length=n - 2, **k), attention_mask=p["attention_mask"])
