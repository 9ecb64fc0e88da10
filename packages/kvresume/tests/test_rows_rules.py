"""kvresume.row_checks' rules, each called on a hand-made call at its boundary: the ids' rows against the cache's
(`ledger_rows`: equal, one short, a multiple of them fed, a prefix of one token, none, exactly the cached length and
one short of it), generate()'s expansion of the ids (`_expanded`: the cache's rows selected then repeated, a cache
whose layers cannot repeat rows), the settings named (`note_expansion`) and a stale ledger (`ledger_stale`). Each
refusal is asserted by its check name, its cause and its fix (the rows the fixed cache holds, the crop); one fix is
run and compared with a no-cache run. Fast: one generate() call."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache, StaticCache

from kvresume import compat, guarded_generate, ledger_of, track
from kvresume.call import ResumeCall, ResumeInputError
from kvresume.ledger import without_ledger
from kvresume.reuse import apply_fix
from kvresume.row_checks import EXPANSION, _repeatable, _selected, ledger_rows, ledger_stale, note_expansion
from kvresume.testing import build, floor

L = 10  # tokens each cached row holds


def ids_of(seed: int, n: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(10, 2000, (rows, n), generator=torch.Generator().manual_seed(seed))


A, B, X, Y = ids_of(0, L), ids_of(1, L), ids_of(2, L), ids_of(3, L)  # four rows, no two sharing a first token
NEW = ids_of(4, 2)


@pytest.fixture(scope="module")
def model():
    m = build("dense")
    tracker = track(m)
    yield m
    tracker.remove()


@torch.no_grad()
def prefill(m, ids: torch.Tensor, cache=None):
    cache = DynamicCache() if cache is None else cache
    m(ids, attention_mask=torch.ones_like(ids), **{compat.cache_kwarg(m): cache}, use_cache=True)
    return cache


@pytest.fixture(scope="module")
def one(model):
    """A tracked cache of one row: A."""
    return prefill(model, A)


@pytest.fixture(scope="module")
def three(model):
    """A tracked cache of three rows: B, X, A."""
    return prefill(model, torch.cat([B, X, A]))


def call_of(cache, ids, fed=None, ledger="read") -> ResumeCall:
    """The call the guard builds: the ids given, the ids generate() fed (None: not captured), the cache's ledger."""
    led = (ledger_of(cache) if cache is not None else None) if ledger == "read" else ledger
    n = int(ids.shape[-1]) if ids is not None else 3
    return ResumeCall(cache, n, fed_ids=fed, given_ids=ids, ledger=led)


def refused(check, call: ResumeCall, name: str = "ledger_rows") -> ResumeInputError:
    with pytest.raises(ResumeInputError) as exc:
        check(call)
    assert exc.value.check == name, exc.value
    return exc.value


def rows_of(cache) -> list[list[int]]:
    return ledger_of(cache).token_ids.tolist()


def fed(ids: torch.Tensor, k: int) -> torch.Tensor:
    """What generate() feeds its first call for k beams (or sequences) per row: each row repeated k times."""
    return ids.repeat_interleave(k, 0)[:, -1:]


def test_the_four_rows_share_no_first_token():
    assert len({int(r[0, 0]) for r in (A, B, X, Y)}) == 4


def test_nothing_to_check_no_cache_no_ids_no_rows_or_as_many_rows_fed(one, three):
    whole = torch.cat([A, NEW], 1)
    assert ledger_rows(call_of(None, whole)) is None  # no cache
    assert ledger_rows(call_of(three, None)) is None  # embeddings given: no ids to match
    assert ledger_rows(call_of(DynamicCache(), whole)) is None  # a cache holding nothing yet: no rows
    assert ledger_rows(call_of(one, whole)) is None  # one row each
    assert ledger_rows(call_of(three, whole, fed=fed(whole, 3))) is None  # generate() feeds the cache's 3 rows
    assert ledger_rows(call_of(three, torch.cat([torch.cat([B, X, A]), NEW.repeat(3, 1)], 1))) is None


def test_one_ids_row_against_three_selects_the_row_holding_its_whole_prefix(three):
    whole = torch.cat([A, NEW], 1)
    error = refused(ledger_rows, call_of(three, whole))  # fed not captured: the ids given are what is fed
    text = str(error)
    assert text.startswith("input_ids have 1 row(s) but the cache holds 3 (beam search keeps one per beam)"), text
    assert "the cache rows [2] hold the longest common prefixes ([10] tokens)" in text, text
    assert text.endswith("select them (cache.batch_select_indices([2]))"), text  # all 10 held: nothing to crop
    assert rows_of(error.fix["cache"]) == A.tolist() and error.fix["crop"] is None
    assert ledger_of(three).batch == 3  # the fix is a copy


def test_a_prefix_one_token_short_of_the_cached_length_is_cropped_to_it(three):
    whole = torch.cat([A[:, :L - 1], NEW], 1)
    error = refused(ledger_rows, call_of(three, whole))
    assert str(error).endswith("(cache.batch_select_indices([2])); then crop it to the 9 token(s) all of them share "
                               "(cache.crop(-1))"), str(error)
    assert error.fix["crop"] == L - 1 and rows_of(error.fix["cache"]) == A.tolist()


def test_a_single_shared_token_is_a_prefix_and_no_shared_token_is_none(three):
    other = ids_of(5, 3)
    assert int(other[0, 0]) != int(A[0, 1])
    whole = torch.cat([A[:, :1], other], 1)
    error = refused(ledger_rows, call_of(three, whole))
    assert "([1] tokens)" in str(error) and error.fix["crop"] == 1, str(error)
    two = torch.cat([torch.cat([A, Y]), NEW.repeat(2, 1)], 1)  # row 1 starts like no cache row
    error = refused(ledger_rows, call_of(three, two))
    assert str(error).startswith("input_ids have 2 row(s) but the cache holds 3, and no cache row starts with ids row "
                                 "1's tokens"), str(error)
    assert error.fix == {}


def test_an_untracked_cache_or_a_ledger_of_other_rows_asks_for_the_rows(one, three):
    whole = torch.cat([A, NEW], 1)
    for call in (call_of(without_ledger(three), whole), call_of(three, whole, ledger=ledger_of(one))):
        error = refused(ledger_rows, call)
        assert str(error).startswith("input_ids have 1 row(s) but the cache holds 3 (beam search keeps one per beam): "
                                     "generate() would fail on tensor sizes or pair rows wrongly"), str(error)
        assert "track(model) before the cache is written" in str(error) and error.fix == {}


@pytest.mark.parametrize("rows_fed", [2, 5])  # as many as the ids (no expansion), and one past a multiple of them
def test_rows_fed_that_are_no_multiple_beyond_the_ids_are_no_expansion(three, rows_fed):
    whole = torch.cat([torch.cat([A, B]), NEW.repeat(2, 1)], 1)
    error = refused(ledger_rows, call_of(three, whole, fed=torch.cat([whole, whole, whole])[:rows_fed]))
    assert str(error).startswith("input_ids have 2 row(s) but the cache holds 3"), str(error)
    assert "expands" not in str(error) and rows_of(error.fix["cache"]) == [A[0].tolist(), B[0].tolist()]


def test_one_row_expanded_repeats_the_cache_and_names_the_settings_or_both(model, one):
    whole = torch.cat([A, NEW], 1)
    error = refused(ledger_rows, call_of(one, whole, fed=fed(whole, 2)))  # no setting noted: both named
    text = str(error)
    assert text.startswith("generate() expands the 1 input_ids row(s) to 2 (num_return_sequences / num_beams: it "
                           "repeats the ids and the mask 2 times, once per beam, else once per returned sequence), "
                           "but not the cache, which holds 1 row(s): generate() would fail"), text
    assert text.endswith("(copy.deepcopy(cache), then cache.batch_repeat_interleave(2))"), text  # beams: no other way
    assert rows_of(error.fix["cache"]) == A.tolist() * 2 and error.fix["crop"] is None
    call = call_of(one, whole, fed=fed(whole, 2))
    note_expansion(call, model, {"num_return_sequences": 2, "do_sample": True})
    text = str(refused(ledger_rows, call))
    assert "to 2 (num_return_sequences=2: it repeats" in text, text
    assert text.endswith("then cache.batch_repeat_interleave(2)); or call generate() 2 times with "
                         "num_return_sequences=1, each with its own copy of the cache (sampling then draws other "
                         "tokens than one call of 2 sequences)"), text


def test_rows_expanded_from_other_cache_rows_are_selected_in_the_ids_order_then_repeated(three):
    whole = torch.cat([torch.cat([A, B]), NEW.repeat(2, 1)], 1)
    error = refused(ledger_rows, call_of(three, whole, fed=fed(whole, 2)))
    text = str(error)
    assert "expands the 2 input_ids row(s) to 4" in text and "which holds 3 row(s)" in text, text
    assert text.endswith("then cache.batch_select_indices([2, 2, 0, 0]))"), text
    assert rows_of(error.fix["cache"]) == [A[0].tolist()] * 2 + [B[0].tolist()] * 2 and error.fix["crop"] is None


def test_rows_expanded_one_token_short_are_cropped_and_one_token_is_still_a_prefix(three):
    for keep in (L - 1, 1):
        whole = torch.cat([torch.cat([A[:, :keep], B[:, :keep]]), ids_of(6, 2, rows=2)], 1)
        error = refused(ledger_rows, call_of(three, whole, fed=fed(whole, 2)))
        assert str(error).endswith(f"then cache.batch_select_indices([2, 2, 0, 0])), then crop it to the {keep} "
                                   f"token(s) all rows share (cache.crop({keep - L}))"), str(error)
        assert error.fix["crop"] == keep


def test_rows_expanded_that_no_cache_row_starts_or_an_untracked_cache_are_refused_without_a_fix(three):
    whole = torch.cat([torch.cat([A, Y]), NEW.repeat(2, 1)], 1)
    error = refused(ledger_rows, call_of(three, whole, fed=fed(whole, 2)))
    assert "which holds 3 row(s), and no cache row starts with some ids row's tokens: pass the whole sequence of each " \
           "row, with the cache rows it continues selected and repeated 2 times" in str(error), str(error)
    assert error.fix == {}
    whole = torch.cat([torch.cat([A, B]), NEW.repeat(2, 1)], 1)
    error = refused(ledger_rows, call_of(without_ledger(three), whole, fed=fed(whole, 2)))
    assert "which holds 3 row(s), and 3 is not one row per ids row: select the cache rows" in str(error), str(error)
    assert str(error).endswith("then repeat each 2 times (cache.batch_repeat_interleave(2))") and error.fix == {}


def test_a_cache_whose_layers_cannot_repeat_rows_is_resume_s_to_re_prefill(model, one):
    static = prefill(model, A, StaticCache(config=model.config, max_cache_len=16))
    assert not _repeatable(static) and _repeatable(one)
    whole = torch.cat([A, NEW], 1)
    error = refused(ledger_rows, call_of(static, whole, fed=fed(whole, 2)))
    assert "; this cache's layers cannot repeat rows (StaticCache): pass the whole sequence through kvresume.resume(" \
           in str(error), str(error)
    assert error.fix == {"resume": True}


def test_selecting_no_rows_and_rows_in_another_order(three):
    assert int(_selected(three, []).layers[0].keys.shape[0]) == 0  # an empty index is an index of rows
    assert rows_of(_selected(three, [2, 0])) == [A[0].tolist(), B[0].tolist()]
    assert ledger_of(three).batch == 3


def test_note_expansion_names_each_setting_past_its_neutral_value(model, one):
    call = call_of(one, A)
    note_expansion(call, model, {"num_beams": 3, "num_return_sequences": 2})
    assert getattr(call, EXPANSION) == "num_beams=3, num_return_sequences=2"
    note_expansion(call, model, {"num_beams": 1, "num_return_sequences": 1})
    assert getattr(call, EXPANSION) == ""
    fresh = call_of(one, A)
    note_expansion(fresh, model, {"generation_config": object()})  # not a config: generate()'s own error to raise
    assert not hasattr(fresh, EXPANSION)

    class Older:  # an older release's config: without some fields
        num_return_sequences = 2

        def update(self, **_kwargs):
            return {}

    note_expansion(fresh, SimpleNamespace(generation_config=Older()), {})
    assert getattr(fresh, EXPANSION) == "num_return_sequences=2"


@torch.no_grad()
def test_the_cropped_expansion_fix_equals_a_no_cache_run(model, three):
    """Two ids rows sharing 9 of the 10 cached tokens, two beams each: the fix (rows selected, repeated, cropped)."""
    whole = torch.cat([torch.cat([A[:, :L - 1], B[:, :L - 1]]), ids_of(7, 2, rows=2)], 1)
    args = dict(max_new_tokens=3, do_sample=False, num_beams=2, pad_token_id=0, return_dict_in_generate=True,
                output_logits=True)
    mask, name = torch.ones_like(whole), compat.generate_cache_kwarg(model)
    with pytest.raises(ResumeInputError) as exc:
        guarded_generate(model, whole, attention_mask=mask, **{name: copy.deepcopy(three)}, **args)
    assert exc.value.check == "ledger_rows" and exc.value.fix["crop"] == L - 1, exc.value
    cache, kwargs = apply_fix(exc.value.fix, three, {"attention_mask": mask})
    out = guarded_generate(model, whole, **{name: cache}, **kwargs, **args)
    ref = model.generate(whole, attention_mask=mask, use_cache=False, **args)
    assert torch.equal(out.sequences, ref.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits)) <= floor("dense")


@pytest.fixture(scope="module")
def rewritten(model):
    """A tracked 12-token cache cropped to 8 and written back to 12 with other tokens while untracked: stale from 8."""
    cache = prefill(model, ids_of(8, 12))
    cache.crop(-4)
    bare = build("dense")  # the same weights, not tracked
    bare.load_state_dict(model.state_dict())
    with torch.no_grad():
        bare(ids_of(9, 4), **{compat.cache_kwarg(bare): cache}, attention_mask=torch.ones(1, 12, dtype=torch.long))
    return cache


def test_a_stale_ledger_is_refused_with_its_crop_and_a_read_ledger_is_not(rewritten, one):
    whole = ids_of(10, 14)
    error = refused(ledger_stale, call_of(rewritten, whole), "ledger_stale")
    assert str(error).startswith("the cache holds 12 tokens, but from slot 8 on (row 0) not the ones its token ledger "
                                 "recorded"), str(error)
    assert "crop it to the 8 token(s) that still match (cache.crop(-4))" in str(error) and error.fix == {"crop": 8}
    assert ledger_stale(call_of(rewritten, whole, ledger=ledger_of(one))) is None  # a ledger read: it matched
    assert ledger_stale(call_of(None, whole)) is None and ledger_stale(call_of(one, whole)) is None
