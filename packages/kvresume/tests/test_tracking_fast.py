"""The tracker's cheap decode path gives the ledger the slow path gives: a fold of generate()'s writes (a prompt, then
growing masks) equals write by write, also where the masks do not grow as generate()'s do; a decode step continues
the last write only while nothing changed (a crop, a new batch, a swapped layer go through the full start); the
rotary hook comes off only for a model seen rotating with the given position ids themselves, and comes back for a
call given none."""
from __future__ import annotations

import copy

import torch

from kvresume import ledger_of, track
from kvresume.tracking import is_tracked
from kvresume.compat import rotary_embedding
from kvresume.testing import build
from kvresume.ledger import TAIL, joined, ledger_owner, stale_prefix, stored_ledger
from kvresume.writes import Steps, Write


def _steps(masks: list[torch.Tensor], f: int) -> tuple[Steps, list[Write]]:
    """The same decode steps as one `Steps` (reading the keys when folded) and as a Write each (copying them)."""
    keys = torch.randn(masks[0].shape[0], 2, 64, 16)
    past = masks[0].shape[-1] - f
    steps, writes = Steps(f, 3, past, keys=keys[:, :, :past + f * len(masks)]), []
    for m in masks:
        b = m.shape[0]
        ids, pos = torch.randint(0, 9, (b, f)), torch.randint(0, 99, (b, f))
        steps.steps.append((ids, pos, m))
        writes.append(Write(ids, pos, m, keys.narrow_copy(2, past, f), 3, None, past, b, f, True))
        past += f
    return steps, writes


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in ((a.token_ids, b.token_ids), (a.positions, b.positions),
                                               (a.mask, b.mask), (a.prints, b.prints))) and a.mask.dtype == torch.long


def test_a_fold_of_growing_masks_equals_write_by_write():
    torch.manual_seed(0)
    for b, f in ((1, 1), (2, 3)):
        masks = [torch.randint(0, 2, (b, 10))]
        for _ in range(6):
            masks.append(torch.cat([masks[-1], torch.randint(0, 2, (b, f))], 1))
        steps, writes = _steps(masks, f)
        prompt = Write(torch.ones(b, 10 - f, dtype=torch.long), torch.zeros(b, 10 - f, dtype=torch.long),
                       masks[0][:, :10 - f], torch.randn(b, 2, 10 - f, 16), 3, None, 0, b, 10 - f, True)
        assert _same(steps.ledger(), joined(writes)) and steps.length == 7 * f
        assert _same(joined([prompt, steps]), joined([prompt, *writes]))


def test_masks_that_do_not_grow_like_generate_are_cut_one_by_one():
    masks = [torch.ones(1, 9, dtype=torch.long), torch.zeros(1, 11, dtype=torch.long),  # skips a column
             torch.tensor([[1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1]]).bool()]  # another dtype
    steps, writes = _steps(masks, 1)
    assert steps.ledger().mask.tolist() == [[1, 0, 1]] and _same(steps.ledger(), joined(writes))
    steps.steps[1] = (*steps.steps[1][:2], None)  # no mask: ones
    assert steps.ledger().mask.tolist() == [[1, 1, 1]]


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


def test_generates_decode_steps_take_the_decode_path_and_fold_to_the_full_paths_ledger():
    m = build("dense")
    prompt = torch.arange(10, 22).view(1, -1)
    with track(m), torch.no_grad():
        out = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True)
    cache = out.past_key_values
    chunks = ledger_owner(cache).__dict__[TAIL].chunks
    assert [type(c) for c in chunks] == [Write, Steps] and chunks[1].length == 7, "the prompt, then 7 decode steps"
    fast = stored_ledger(cache)
    with track(m) as tracker, torch.no_grad():
        tracker.text = False  # every call through the full path
        slow = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                          pad_token_id=0, return_dict_in_generate=True).past_key_values
    assert _same(fast, stored_ledger(slow)) and fast.token_ids[0].tolist() == out.sequences[0, :-1].tolist()


def test_decode_steps_are_read_from_the_keys_they_left_not_from_what_the_cache_holds_when_folded():
    m = build("dense")
    prompt = torch.arange(10, 22).view(1, -1)
    with track(m), torch.no_grad():
        cache = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                           pad_token_id=0, return_dict_in_generate=True).past_key_values
    assert type(ledger_owner(cache).__dict__[TAIL].chunks[-1]) is Steps, "not folded yet"
    cache.crop(-3)  # 19 slots to 16 (5.25.0 takes only a negative crop)
    with torch.no_grad():  # untracked: other tokens over the last 3 decode steps' slots
        m(input_ids=torch.tensor([[5, 6, 7]]), past_key_values=cache, use_cache=True)
    assert stale_prefix(cache) == (16, 19, 0) and ledger_of(cache) is None


def test_a_model_tracked_around_a_tracked_inner_model_records_each_write_once():
    m = build("dense")
    inner = track(m.model)  # as a plugin tracking every PreTrainedModel at post_init: the inner one first
    track(m)
    assert not is_tracked(m.model) and not m.model._forward_pre_hooks and inner.model is m.model
    prompt = torch.arange(10, 22).view(2, -1)
    with torch.no_grad():
        out = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True)
    led = ledger_of(out.past_key_values)
    assert led.length == out.past_key_values.get_seq_length() and torch.equal(led.token_ids, out.sequences[:, :-1])
    track(m).remove()
