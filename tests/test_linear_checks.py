"""The guard's checks on a hybrid's linear-attention layers (packages/kvresume/kvresume/linear_checks.py): a case each must refuse
(where the installed release makes it), its valid twin, the advice applied, and the decisions fed contradicting
measurements."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from helpers import models

from kvresume import compat
from kvresume import ResumeInputError, check_resume_inputs, track
from kvresume import linear_checks as lc
from kvresume.reuse import apply_fix
from helpers.compare import max_abs_diff
from helpers.continuation import generate_first_step
from helpers.rollback import probes, setup

PROMPT, K = 20, 4


@pytest.fixture(scope="module")
def hybrid():
    model = models.load(models.TINY_HYBRID).model
    tracker = track(model)
    yield model
    tracker.remove()


def _ids(model, n):
    return setup.token_ids(n, model, 0)


def _new(model):
    return DynamicCache(config=compat.text_config(model.config))


def _guard(model, ids, cache):
    kwargs = {compat.generate_cache_kwarg(model): copy.deepcopy(cache)}
    check_resume_inputs(model, ids, attention_mask=torch.ones_like(ids), **kwargs)


def _rolled(model, ids, mode):
    """The cache of ids[:PROMPT] that processed K more under `mode` and was cropped back; None where refused."""
    cache = _new(model)
    setup.forward(model, ids[:, :PROMPT], cache)
    if probes._start_recording(cache, mode, K):
        return None
    try:
        setup.forward(model, ids[:, PROMPT:PROMPT + K], cache)
        cache.crop(-K)
    except Exception:  # noqa: BLE001 - the release refuses this rollback itself
        return None
    return cache


def _whole_and_stale(model):
    """The prompt plus the token after the K rolled back, and the recorded-then-cropped cache (skip where refused)."""
    ids = _ids(model, PROMPT + K + 1)
    stale = _rolled(model, ids, "record")
    if stale is None:
        pytest.skip(f"transformers {compat.TRANSFORMERS_VERSION} refuses a k-token forward while recording")
    return torch.cat([ids[:, :PROMPT], ids[:, PROMPT + K:]], 1), stale


def test_linear_rollback_refuses_a_crop_that_left_the_recurrent_state_and_its_advice_restores(hybrid):
    whole, stale = _whole_and_stale(hybrid)
    with pytest.raises(ResumeInputError) as exc:
        _guard(hybrid, whole, stale)
    assert exc.value.check == "linear_rollback" and "after 24 tokens" in str(exc.value)
    reference = generate_first_step(hybrid, whole, _new(hybrid), attention_mask=torch.ones_like(whole)).logits
    cache, kwargs = apply_fix(exc.value.fix, stale, {"attention_mask": torch.ones_like(whole)})
    assert max_abs_diff(reference, generate_first_step(hybrid, whole, cache, **kwargs).logits) < 1e-5


def test_linear_rollback_passes_a_cache_that_never_saw_the_tokens_and_a_restoring_crop(hybrid):
    ids = _ids(hybrid, PROMPT + K + 1)
    whole = torch.cat([ids[:, :PROMPT], ids[:, PROMPT + K:]], 1)
    fresh = _new(hybrid)
    setup.forward(hybrid, ids[:, :PROMPT], fresh)
    _guard(hybrid, whole, fresh)  # the valid twin: passes
    kept = _rolled(hybrid, ids, "record_keep")  # 5.25.0: rolled back with a recorded history
    if kept is not None:
        _guard(hybrid, whole, kept)


def test_linear_length_refuses_a_hand_rebuild_without_its_count_and_the_carried_count_passes(hybrid):
    ids = _ids(hybrid, PROMPT + K)
    original = _new(hybrid)
    setup.forward(hybrid, ids[:, :-1], original)
    rebuilt = probes.hand_rebuild(original, hybrid.config)
    linear, full = lc._counts(rebuilt)
    if not linear:  # no linear token count before 5.25.0: the hand rebuild is right, and passes
        _guard(hybrid, ids, rebuilt)
        return
    with pytest.raises(ResumeInputError) as exc:
        _guard(hybrid, ids, rebuilt)
    assert exc.value.check == "linear_length"
    _guard(hybrid, ids, exc.value.fix["cache"])  # the carried count: the valid twin
    got = generate_first_step(hybrid, ids, exc.value.fix["cache"], attention_mask=torch.ones_like(ids)).logits
    want = generate_first_step(hybrid, ids, original, attention_mask=torch.ones_like(ids)).logits
    assert torch.equal(got, want)


MARKS = [(20, (1.0, 2.0)), (24, (3.0, 4.0))]


@pytest.mark.parametrize("now,held,expected", [
    ((3.0, 4.0), 20, 24),   # the state after 24 tokens, the cache holding 20: stale
    ((1.0, 2.0), 20, None),  # rolled back to the state after 20: right
    ((3.0, 4.0), 24, None),  # not cropped
    ((5.0, 6.0), 21, None),  # a state never noted (a crop that restored a recorded one): not decided stale
    (None, 20, None),        # no linear layer
])
def test_stale_length_decides_from_the_fingerprint_it_holds(now, held, expected):
    assert lc.stale_length(MARKS, now, held) == expected


@pytest.mark.parametrize("linear,full,expected", [
    ([4, 4, 4], [23], 23),   # 5.25.0's hand rebuild: the conv width against 23 held
    ([23, 23, 23], [23], None),
    ([], [23], None),        # a release without a linear count
    ([0, 0, 0], [], None),   # nothing held by attention layers
    ([23, 4, 23], [23], 23),
])
def test_count_mismatch_decides_from_the_counts_measured(linear, full, expected):
    assert lc.count_mismatch(linear, full) == expected


def test_resume_re_prefills_a_cache_whose_linear_layers_were_not_rolled_back(hybrid):
    from kvresume import resume
    from helpers.continuation import greedy_config

    whole, stale = _whole_and_stale(hybrid)
    want = generate_first_step(hybrid, whole, _new(hybrid), attention_mask=torch.ones_like(whole)).logits
    with torch.no_grad():
        out = resume(hybrid, whole, stale, generation_config=greedy_config(hybrid))
    assert max_abs_diff(want, compat.generate_logits(out)[0]) < 1e-5
