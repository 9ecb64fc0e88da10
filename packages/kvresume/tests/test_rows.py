"""The ledger follows the cache's rows (by fingerprint): beam search, num_return_sequences, rows selected, repeated
and reordered with or without their ids, the wrong beam's row. Each case: a hit equals a no-cache greedy run (tokens
equal, logits within the model's floor), or a refusal naming the cause whose fix, applied, equals it."""
from __future__ import annotations

import copy

import pytest
import torch

from kvresume import ResumeInputError, guarded_generate, ledger_of, resume, track
from kvresume.compat import generate_cache_kwarg
from kvresume.reuse import apply_fix
from kvresume.testing import build, floor

NEW = 3


@pytest.fixture(scope="module")
def model():
    m = build("dense")
    tracker = track(m)
    yield m
    tracker.remove()


def ids_of(seed: int, n: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(10, 2000, (rows, n), generator=torch.Generator().manual_seed(seed))


def greedy(**extra):
    return dict(max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, output_logits=True, pad_token_id=0,
                **extra)


@torch.no_grad()
def reference(m, whole: torch.Tensor):
    return m.generate(whole, attention_mask=torch.ones_like(whole), use_cache=False, **greedy())


def assert_hit(out, ref) -> float:
    """Same new tokens as the no-cache run, every step's logits within the floor; returns the max logit diff."""
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    diff = max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits))
    assert diff <= floor("dense"), diff
    return diff


@torch.no_grad()
def guarded(m, whole, cache):
    return guarded_generate(m, whole, attention_mask=torch.ones_like(whole), **{generate_cache_kwarg(m): cache},
                            **greedy())


@torch.no_grad()
def fixed(m, error: ResumeInputError, whole, cache):
    """The refusal's fix applied to the guarded call, run."""
    new_cache, kwargs = apply_fix(error.fix, cache, {"attention_mask": torch.ones_like(whole)})
    return guarded_generate(m, whole, **kwargs, **{generate_cache_kwarg(m): new_cache}, **greedy())


def refused(fn, *args) -> ResumeInputError:
    with pytest.raises(ResumeInputError) as exc:
        fn(*args)
    return exc.value


def rows_hold_their_ledger(m, cache) -> None:
    """Each cache row's last-layer keys are what a fresh prefill of its ledger's tokens writes (the rows are real)."""
    led = ledger_of(cache)
    assert led is not None and led.batch == cache.layers[-1].keys.shape[0]
    for r in range(led.batch):
        with torch.no_grad():
            fresh = m(led.token_ids[r:r + 1], use_cache=True).past_key_values
        assert torch.allclose(fresh.layers[-1].keys[0], cache.layers[-1].keys[r], atol=1e-4)


@pytest.fixture(scope="module")
def beams(model):
    """generate(num_beams=3) from a 12-token prompt whose 3 final cache rows are not all the same beam."""
    prompt = ids_of(0, 12)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=3, max_new_tokens=8,
                             do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, out.past_key_values


def test_beam_search_ledger_rows_are_the_cache_rows(model, beams):
    _, cache = beams
    rows_hold_their_ledger(model, cache)
    led = ledger_of(cache)
    assert len({tuple(r) for r in led.token_ids.tolist()}) > 1  # beams differ: a reordering was followed


def test_best_beam_continues_through_resume_and_guarded_generate(model, beams):
    best, cache = beams
    whole = torch.cat([best, ids_of(1, 4)], 1)
    ref = reference(model, whole)
    error = refused(lambda: resume(model, whole, copy.deepcopy(cache), **greedy()))
    assert error.check == "ledger_rows" and "batch_select_indices" in str(error)
    selected = error.fix["cache"]
    held = ledger_of(selected).length
    out = resume(model, whole, copy.deepcopy(selected), **greedy())
    print("beam resume: reused", held, "max logit diff", assert_hit(out, ref))
    error = refused(guarded, model, whole, copy.deepcopy(cache))
    assert error.check == "ledger_rows"
    print("beam guarded: max logit diff", assert_hit(fixed(model, error, whole, cache), ref))


def test_the_wrong_beam_row_is_refused_and_its_fix_restores(model, beams):
    best, cache = beams
    led = ledger_of(cache)
    held = led.length
    match = [int((led.token_ids[r] == best[0, :held]).long().cumprod(0).sum()) for r in range(led.batch)]
    wrong = min(range(led.batch), key=lambda r: match[r])
    assert match[wrong] < held
    one = copy.deepcopy(cache)
    one.batch_select_indices(torch.tensor([wrong]))
    whole = torch.cat([best, ids_of(2, 2)], 1)
    error = refused(guarded, model, whole, copy.deepcopy(one))
    assert error.check == "ledger_tokens" and error.fix.get("crop") == match[wrong]
    print("wrong beam: crop to", match[wrong], "max logit diff", assert_hit(fixed(model, error, whole, one),
                                                                           reference(model, whole)))


def test_num_return_sequences_rows_follow(model):
    prompt = ids_of(3, 10)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), num_beams=3, num_return_sequences=2,
                             max_new_tokens=5, do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    cache = out.past_key_values
    rows_hold_their_ledger(model, cache)
    whole = torch.cat([out.sequences, ids_of(4, 2, rows=2)], 1)
    error = refused(guarded, model, whole, copy.deepcopy(cache))
    assert error.check == "ledger_rows"
    print("2 of 3 beams: max logit diff", assert_hit(fixed(model, error, whole, cache), reference(model, whole)))
    with torch.no_grad():
        sampled = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, num_return_sequences=2,
                                 max_new_tokens=4, return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(ledger_of(sampled.past_key_values).token_ids, sampled.sequences[:, :-1])


@pytest.fixture(scope="module")
def batch(model):
    """A 2-row tracked cache of two different 10-token prompts, and each row's next tokens."""
    ids = ids_of(5, 10, rows=2)
    with torch.no_grad():
        cache = model(ids, attention_mask=torch.ones_like(ids), use_cache=True).past_key_values
    return ids, cache, ids_of(6, 2, rows=3)


@pytest.mark.parametrize("order", [[1, 0], [0, 0, 0], [1, 1]])
def test_rows_selected_with_their_ids_pass_and_equal(model, batch, order):
    ids, cache, new = batch
    moved = copy.deepcopy(cache)
    moved.batch_select_indices(torch.tensor(order))
    assert torch.equal(ledger_of(moved).token_ids, ids[order])
    whole = torch.cat([ids[order], new[:len(order)]], 1)
    print(order, "reused 10, max logit diff", assert_hit(guarded(model, whole, moved), reference(model, whole)))


def test_rows_reordered_without_their_ids_are_refused_and_resume_restores(model, batch):
    ids, cache, new = batch
    moved = copy.deepcopy(cache)
    moved.reorder_cache(torch.tensor([1, 0]))
    whole = torch.cat([ids, new[:2]], 1)
    error = refused(guarded, model, whole, copy.deepcopy(moved))
    assert error.check == "ledger_tokens" and error.fix.get("resume")
    out = resume(model, whole, copy.deepcopy(moved), **greedy())
    print("reordered w/o ids: resume reuses 0, max logit diff", assert_hit(out, reference(model, whole)))


def test_a_repeated_row_expands_to_different_continuations(model, batch):
    ids, cache, new = batch
    one = copy.deepcopy(cache)
    one.batch_select_indices(torch.tensor([1]))
    one.batch_repeat_interleave(3)
    whole = torch.cat([ids[[1, 1, 1]], new], 1)
    print("repeat x3: max logit diff", assert_hit(guarded(model, whole, one), reference(model, whole)))
