"""The tracker's cheap decode path gives the ledger the slow path gives: a fold of generate()'s writes (a prompt, then
growing masks) equals write by write, also where the masks do not grow as generate()'s do; a decode step continues
the last write only while nothing changed (a crop, a new batch, a swapped layer go through the full start); the
rotary hook comes off only for a model seen rotating with the given position ids themselves, and comes back for a
call given none."""
from __future__ import annotations

import copy

import torch

from kvresume import ledger_of, track
from kvresume.compat import rotary_embedding
from kvresume.ledger import stored_ledger
from kvresume.testing import build
from kvresume.writes import Write


def _writes(masks: list[torch.Tensor], f: int) -> list[Write]:
    keys = torch.randn(masks[0].shape[0], 2, 64, 16)
    out, past = [], masks[0].shape[-1] - f
    for m in masks:
        b = m.shape[0]
        out.append(Write(torch.randint(0, 9, (b, f)), torch.randint(0, 99, (b, f)), m, keys.narrow_copy(2, past, f), 3,
                         None, past, b, f, True))
        past += f
    return out


def _one_by_one(writes: list[Write]) -> torch.Tensor:
    return torch.cat([w.ledger().mask for w in writes], 1)


def test_a_fold_of_growing_masks_equals_write_by_write():
    torch.manual_seed(0)
    for b, f in ((1, 1), (2, 3)):
        masks = [torch.randint(0, 2, (b, 10))]
        for _ in range(6):
            masks.append(torch.cat([masks[-1], torch.randint(0, 2, (b, f))], 1))
        writes = _writes(masks, f)
        prompt = Write(torch.ones(b, 10 - f, dtype=torch.long), torch.zeros(b, 10 - f, dtype=torch.long),
                       masks[0][:, :10 - f], torch.randn(b, 2, 10 - f, 16), 3, None, 0, b, 10 - f, True)
        for run in (writes, [prompt, *writes]):
            folded = Write.bulk(run)
            assert torch.equal(folded.mask, _one_by_one(run)) and folded.mask.dtype == torch.long
            assert torch.equal(folded.prints, torch.cat([w.fingerprints() for w in run], 1))


def test_masks_that_do_not_grow_like_generate_are_cut_one_by_one():
    masks = [torch.ones(1, 9, dtype=torch.long), torch.zeros(1, 11, dtype=torch.long),  # skips a column
             torch.tensor([[1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1]]).bool()]  # another dtype
    writes = _writes(masks, 1)
    assert Write.bulk(writes).mask.tolist() == [[1, 0, 1]] == _one_by_one(writes).tolist()
    writes[1].mask = None  # no mask: ones
    assert Write.bulk(writes).mask.tolist() == [[1, 1, 1]]


def _decode(m, cache, token: int, held: int) -> None:
    with torch.no_grad():
        m(input_ids=torch.tensor([[token]] * cache.layers[0].keys.shape[0]), past_key_values=cache,
          attention_mask=torch.ones(cache.layers[0].keys.shape[0], held + 1, dtype=torch.long),
          position_ids=torch.full((cache.layers[0].keys.shape[0], 1), held))


def test_a_decode_step_continues_only_an_unchanged_cache():
    m = build("dense")
    ids = torch.arange(10, 22).view(1, -1)
    with track(m), torch.no_grad():
        cache = m(input_ids=ids, use_cache=True).past_key_values
        _decode(m, cache, 30, 12)
        _decode(m, cache, 31, 13)  # continued
        assert ledger_of(cache).token_ids.tolist() == [[*range(10, 22), 30, 31]]
        cache.crop(-1)  # shorter than the ledger: started again, the ledger trimmed (5.25.0 takes only a negative crop)
        _decode(m, cache, 32, 13)
        assert ledger_of(cache).token_ids.tolist() == [[*range(10, 22), 30, 32]]
        cache.batch_repeat_interleave(2)  # other rows: followed by fingerprint
        _decode(m, cache, 33, 14)
        assert ledger_of(cache).token_ids.tolist() == [[*range(10, 22), 30, 32, 33]] * 2
        cache.layers[-1] = copy.deepcopy(cache.layers[-1])  # the fingerprint layer swapped for an equal one
        _decode(m, cache, 34, 15)
        assert ledger_of(cache).token_ids[:, -2:].tolist() == [[33, 34]] * 2
    untracked = copy.deepcopy(cache)
    _decode(m, untracked, 35, 16)  # written while untracked
    with track(m):
        _decode(m, untracked, 36, 17)
    assert ledger_of(untracked) is None


def test_the_rotary_hook_comes_off_only_for_a_model_passing_its_positions_on():
    m = build("dense")
    ids = torch.arange(10, 22).view(1, -1)
    with track(m) as tracker, torch.no_grad():
        cache = m(input_ids=ids, position_ids=torch.arange(12).view(1, -1) + 5, use_cache=True).past_key_values
        assert tracker.passthrough is True and tracker.rope_handle is None, "off once learnt: a compiled step after"
        _decode(m, cache, 30, 17)  # read from the call: the hook is off
        assert tracker.rope_handle is None and not rotary_embedding(m)._forward_pre_hooks
        seen: list[int] = []
        rotary_embedding(m).register_forward_pre_hook(lambda _m, a, kw: seen.append(len(tracker.handles)),
                                                      with_kwargs=True)
        m(input_ids=torch.tensor([[31]]), past_key_values=cache)  # no position ids: the hook is back for this call
        assert seen == [3] and tracker.rope_handle is None, "on during the call, off after it"
        for n in range(3):  # off for a call given positions, on for one given none: one handle at a time
            _decode(m, cache, 40 + n, 14 + 2 * n)
            m(input_ids=torch.tensor([[50 + n]]), past_key_values=cache)
        assert seen == [3, *[2, 3] * 3] and len(tracker.handles) == 2 and len(rotary_embedding(m)._forward_pre_hooks) == 1
    assert stored_ledger(cache).positions[0, 0].tolist()[:14] == [*range(5, 17), 17, 13]
    assert len(rotary_embedding(m)._forward_pre_hooks) == 1  # remove() took the tracker's off: the test's own stays

    other = build("dense")  # a model that hands its rotary embedding other positions than the given ones
    other.model.register_forward_pre_hook(lambda _m, a, kw: (a, {**kw, "position_ids": kw["position_ids"] * 2}),
                                          with_kwargs=True)
    with track(other) as tracker, torch.no_grad():
        cache = other(input_ids=ids, position_ids=torch.arange(12).view(1, -1), use_cache=True).past_key_values
        _decode(other, cache, 30, 12)
        assert tracker.passthrough is False and tracker.rope_handle is not None
    assert stored_ledger(cache).positions[0, 0].tolist() == [*range(0, 24, 2), 24]
