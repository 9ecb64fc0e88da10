"""generate() expands the ids, not the cache: `num_return_sequences` (sampled) and `num_beams` beside a cache of one row
per ids row. The guard names that cause (`ledger_rows`: "generate() expands ... to N", the setting named), never a
false one ("no cache row starts with ..."), before any work; its fix (a copy of the cache with each row repeated as
generate() repeats the ids), applied with the same arguments, equals a no-cache run of the whole conversation with
those arguments (sampling seeded alike; beams), whole ids or a suffix, tracked or untracked, one row or two."""
from __future__ import annotations

import copy

import pytest
import torch

from kvresume import ResumeInputError, guarded_generate, ledger_of, resume, resume_report, track
from kvresume.ledger import without_ledger
from kvresume.reuse import apply_fix
from kvresume.testing import build, floor

NEW = 3
SETTINGS = {"sampled x2": dict(do_sample=True, num_return_sequences=2),
            "beams 3": dict(do_sample=False, num_beams=3),
            "beams 3, x2": dict(do_sample=False, num_beams=3, num_return_sequences=2)}
FED = {"sampled x2": 2, "beams 3": 3, "beams 3, x2": 3}  # generate() repeats the ids per beam, else per sequence


@pytest.fixture(scope="module")
def model():
    m = build("dense")
    tracker = track(m)
    yield m
    tracker.remove()


def ids_of(seed: int, n: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(10, 2000, (rows, n), generator=torch.Generator().manual_seed(seed))


def args(setting: str) -> dict:
    return dict(max_new_tokens=NEW, return_dict_in_generate=True, output_logits=True, pad_token_id=0,
                **SETTINGS[setting])


@torch.no_grad()
def run(m, ids, seed: int = 7, **kwargs):
    torch.manual_seed(seed)  # sampling: the same draws as the reference's
    return guarded_generate(m, ids, **kwargs)


@torch.no_grad()
def reference(m, whole, setting):
    torch.manual_seed(7)
    return m.generate(whole, attention_mask=torch.ones_like(whole), use_cache=False, **args(setting))


def assert_same(out, ref) -> float:
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:]), (out.sequences, ref.sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits))
    assert diff <= floor("dense"), diff
    return diff


@pytest.fixture(scope="module")
def one_row(model):
    prompt = ids_of(0, 10)
    with torch.no_grad():
        cache = model(prompt, attention_mask=torch.ones_like(prompt), use_cache=True).past_key_values
    return prompt, cache, ids_of(1, 4)


def refused_expansion(m, ids, mask, cache, setting) -> ResumeInputError:
    """The call refused by name, before generate() wrote anything (the cache unchanged), for the real cause."""
    before = [layer.keys.clone() for layer in cache.layers]
    with pytest.raises(ResumeInputError) as exc:
        run(m, ids, attention_mask=mask, past_key_values=cache, **args(setting))
    error = exc.value
    text = str(error)
    assert error.check == "ledger_rows" and "expands" in text and "not the cache" in text, text
    assert f"to {FED[setting]}" in text and "no cache row starts" not in text, text
    for name in ("num_beams", "num_return_sequences"):
        assert (f"{name}=" in text) == (name in SETTINGS[setting]), text
    assert all(torch.equal(a, layer.keys) for a, layer in zip(before, cache.layers))
    assert int(error.fix["cache"].layers[0].keys.shape[0]) == FED[setting]
    return error


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_whole_ids_refused_for_the_expansion_and_the_fix_equals_no_cache(model, one_row, setting):
    prompt, cache, suffix = one_row
    whole = torch.cat([prompt, suffix], 1)
    mask = torch.ones_like(whole)
    error = refused_expansion(model, whole, mask, copy.deepcopy(cache), setting)
    assert "batch_repeat_interleave" in str(error)
    fixed, kwargs = apply_fix(error.fix, cache, {"attention_mask": mask})
    out = run(model, whole, past_key_values=fixed, **kwargs, **args(setting))
    print(setting, "fix: max logit diff", assert_same(out, reference(model, whole, setting)))


@pytest.mark.parametrize("setting", ["sampled x2", "beams 3"])
def test_suffix_refused_for_the_expansion_and_the_fix_equals_no_cache(model, one_row, setting):
    prompt, cache, suffix = one_row
    mask = torch.ones(1, 14, dtype=torch.long)  # the cached prefix's columns + the suffix's
    error = refused_expansion(model, suffix, mask, copy.deepcopy(cache), setting)
    fixed, kwargs = apply_fix(error.fix, cache, {"attention_mask": mask})
    out = run(model, suffix, past_key_values=fixed, **kwargs, **args(setting))
    print(setting, "suffix fix: max logit diff", assert_same(out, reference(model, torch.cat([prompt, suffix], 1), setting)))


def test_the_advice_by_hand_equals_no_cache(model, one_row):
    """The message's own steps: copy.deepcopy(cache), then cache.batch_repeat_interleave(k), the same arguments."""
    prompt, cache, suffix = one_row
    whole = torch.cat([prompt, suffix], 1)
    mine = copy.deepcopy(cache)
    mine.batch_repeat_interleave(2)
    assert ledger_of(mine).batch == 2
    out = run(model, whole, attention_mask=torch.ones_like(whole), past_key_values=mine, **args("sampled x2"))
    print("by hand: max logit diff", assert_same(out, reference(model, whole, "sampled x2")))


def test_an_untracked_cache_is_refused_for_the_same_cause(model, one_row):
    prompt, cache, suffix = one_row
    whole = torch.cat([prompt, suffix], 1)
    bare = without_ledger(cache)
    error = refused_expansion(model, whole, torch.ones_like(whole), copy.deepcopy(bare), "beams 3")
    fixed, kwargs = apply_fix(error.fix, bare, {"attention_mask": torch.ones_like(whole)})
    out = run(model, whole, past_key_values=fixed, **kwargs, **args("beams 3"))
    print("untracked fix: max logit diff", assert_same(out, reference(model, whole, "beams 3")))


def test_two_rows_each_repeated_in_order(model):
    prompts = ids_of(2, 9, rows=2)
    with torch.no_grad():
        cache = model(prompts, attention_mask=torch.ones_like(prompts), use_cache=True).past_key_values
    whole = torch.cat([prompts, ids_of(3, 3, rows=2)], 1)
    with pytest.raises(ResumeInputError) as exc:
        run(model, whole, attention_mask=torch.ones_like(whole), past_key_values=copy.deepcopy(cache), **args("sampled x2"))
    error = exc.value
    assert error.check == "ledger_rows" and "2 input_ids row(s) to 4" in str(error)
    assert torch.equal(ledger_of(error.fix["cache"]).token_ids, prompts[[0, 0, 1, 1]])
    fixed, kwargs = apply_fix(error.fix, cache, {"attention_mask": torch.ones_like(whole)})
    out = run(model, whole, past_key_values=fixed, **kwargs, **args("sampled x2"))
    print("2 rows x2: max logit diff", assert_same(out, reference(model, whole, "sampled x2")))


@pytest.mark.parametrize("setting", ["sampled x2", "beams 3"])
def test_resume_equals_no_cache(model, one_row, setting):
    """resume() with these settings re-prefills (reuse.py: whole.EXPANDS_ROWS), so it equals a no-cache run."""
    prompt, cache, suffix = one_row
    whole = torch.cat([prompt, suffix], 1)
    torch.manual_seed(7)
    with torch.no_grad():
        out = resume(model, whole, copy.deepcopy(cache), **args(setting))
    print(setting, "resume:", resume_report(out), "max logit diff", assert_same(out, reference(model, whole, setting)))
