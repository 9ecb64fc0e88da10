"""A ledger the cache's content contradicts is never read as if it matched: a cache cropped and written back to the
same length while the model was not tracked is refused by name (`ledger_stale`), whichever continuation is asked
for, and the fix (crop to the slots that still match, the whole sequence fed) equals a no-cache run. A QuantizedCache
(its slots kept quantized) is not followed: it gets no ledger, the guard treats a plain call as untracked, and
resume() refuses it by name (`ledger_unfollowed`: it cannot choose a prefix), its fix (no cache) equal to a no-cache run."""
from __future__ import annotations

import copy

import pytest
import torch

from kvresume import ResumeInputError, guarded_generate, ledger_of, resume, track
from kvresume.compat import generate_cache_kwarg
from kvresume.reuse import apply_fix
from kvresume.testing import build, floor
from kvresume.tracking import UNFOLLOWED
from test_rows import assert_hit, greedy, guarded, reference

NEW = 3


def ids_of(seed: int, n: int) -> torch.Tensor:
    return torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(seed))




@pytest.fixture(scope="module")
def rewritten():
    """A tracked 12-token cache, cropped to 8 and written back to 12 with other tokens while untracked."""
    m = build("dense")
    tracker = track(m)
    ids = ids_of(7, 12)
    with torch.no_grad():
        cache = m(input_ids=ids, use_cache=True).past_key_values
    cache.crop(-4)  # to 8 (a removal count: every release takes it)
    tracker.remove()
    other = ids_of(8, 4)
    with torch.no_grad():
        m(input_ids=other, past_key_values=cache, attention_mask=torch.ones(1, 12, dtype=torch.long))
    track(m)
    return m, ids, other, cache


@pytest.mark.parametrize("which", ["old tokens (wrong)", "written tokens (right)"])
def test_a_cache_rewritten_while_untracked_is_refused_and_the_fix_restores(rewritten, which):
    m, ids, other, cache = rewritten
    assert ledger_of(cache) is None  # 12 slots, the ledger's 12 entries: not read as if they matched
    head = ids if which.startswith("old") else torch.cat([ids[:, :8], other], 1)
    whole = torch.cat([head, ids_of(9, 2)], 1)
    with pytest.raises(ResumeInputError) as exc:
        guarded(m, whole, copy.deepcopy(cache))
    assert exc.value.check == "ledger_stale" and exc.value.fix["crop"] == 8 and "not tracked" in str(exc.value)
    fixed, kwargs = apply_fix(exc.value.fix, cache, {"attention_mask": torch.ones_like(whole)})
    assert ledger_of(fixed).length == 8
    with torch.no_grad():
        out = guarded_generate(m, whole, **kwargs, **{generate_cache_kwarg(m): fixed}, **greedy())
    print(which, "reused 8, max logit diff", assert_hit(out, reference(m, whole)))
    with pytest.raises(ResumeInputError) as exc:
        resume(m, whole, copy.deepcopy(cache), **greedy())
    assert exc.value.check == "ledger_stale"
    fixed, _ = apply_fix(exc.value.fix, cache, {})
    assert_hit(resume(m, whole, fixed, **greedy()), reference(m, whole))


def test_a_quantized_cache_is_not_followed_and_the_guard_treats_it_untracked():
    pytest.importorskip("optimum.quanto")
    from transformers import QuantizedCache

    m = build("dense")
    tracker = track(m)
    ids = ids_of(10, 12)

    def quantized():  # quanto's tensors cannot be deep-copied: a fresh cache per use
        cache = QuantizedCache(backend="quanto", config=m.config, nbits=4, residual_length=4, q_group_size=16)
        with torch.no_grad():
            return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                              pad_token_id=0, return_dict_in_generate=True, **{generate_cache_kwarg(m): cache})

    out = quantized()
    cache = out.past_key_values
    assert ledger_of(cache) is None and "Quantized" in cache.__dict__[UNFOLLOWED]
    whole = torch.cat([out.sequences, ids_of(11, 2)], 1)
    got = guarded(m, whole, cache)  # untracked: the guard's shape checks only, no ledger claims
    with torch.no_grad():
        again = m.generate(whole, attention_mask=torch.ones_like(whole), **greedy(),
                           **{generate_cache_kwarg(m): quantized().past_key_values})
    assert torch.equal(got.sequences, again.sequences)
    with pytest.raises(ResumeInputError) as exc:  # resume() cannot know what it holds: refused by its name
        resume(m, whole, quantized().past_key_values, **greedy())
    assert exc.value.check == "ledger_unfollowed" and "Quantized" in str(exc.value), str(exc.value)
    fixed, kwargs = apply_fix(exc.value.fix, None, {})
    assert fixed is None
    assert_hit(guarded(m, whole, fixed), reference(m, whole))
    tracker.remove()
