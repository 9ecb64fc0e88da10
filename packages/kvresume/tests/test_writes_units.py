"""kvresume.writes on hand-made tensors (no model runs): positions shaped to [rows, batch, f], the written slots' mask
columns, a write's and decode steps' ledger entries, the grown masks' columns at their size limit, the tail's steps,
folds, copies and pickles, and what the cache records before a fold."""
from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import pytest
import torch

from kvresume import writes as w
from kvresume.fingerprint import WIDTH
from kvresume.ledger import ATTR, TAIL, UNKNOWN, ledger_from_tensors

T = torch.tensor


def same(a, b) -> bool:
    b = torch.as_tensor(b)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_plain_is_long_outside_autograd():
    t = T([1, 2])
    assert w.plain(t) is t
    f = T([1.0, 2.0], requires_grad=True)
    got = w.plain(f)
    assert same(got, [1, 2]) and not got.requires_grad
    assert same(w.plain(T([3], dtype=torch.int32)), [3])


@pytest.mark.parametrize("given, batch, f, want", [
    ([5, 6, 7], 1, 3, [[[5, 6, 7]]]),
    ([5, 6, 7], 2, 2, [[[6, 7], [6, 7]]]),  # 1-D: the last f, one row repeated over the batch
    ([[5, 6], [7, 8]], 2, 2, [[[5, 6], [7, 8]]]),
    ([[[1, 2]], [[3, 4]], [[5, 6]]], 1, 2, [[[1, 2]], [[3, 4]], [[5, 6]]]),  # 3 M-RoPE rows as they are
    ([[[0, 0]], [[1, 2]], [[3, 4]], [[5, 6]]], 1, 2, [[[1, 2]], [[3, 4]], [[5, 6]]]),  # 4 rows: the text row dropped
    ([[[0, 9]], [[1, 2]], [[3, 4]]], 2, 1, [[[9], [9]], [[2], [2]], [[4], [4]]]),
])
def test_positions_as_rows(given, batch, f, want):
    assert same(w.as_rows(T(given), batch, f), want)


def test_a_3_row_tensor_of_4_rows_in_dim_1_is_not_cut():
    p = torch.arange(4 * 2).view(1, 4, 2)
    assert same(w.as_rows(p, 4, 2), p)


def test_the_written_slots_mask_columns():
    mask = T([[0, 1, 1, 0], [1, 1, 0, 1]])
    assert same(w.mask_slots(mask, 2, 2, "cpu"), [[1, 0], [0, 1]])
    assert w.mask_slots(mask, 2, 4, "cpu") is mask
    assert same(w.mask_slots(mask, 2, 1, "cpu"), [[0], [1]])
    col = mask.t().contiguous().t()  # another stride: still the last columns
    assert same(w.mask_slots(col, 2, 3, "cpu"), [[1, 1, 0], [1, 0, 1]])
    assert same(w.mask_slots(mask[:, 1:], 2, 2, "cpu"), [[1, 0], [0, 1]])  # an offset view
    for other in (None, mask[:1], mask[:, :1], T([1, 1]), torch.ones(2, 4, 1)):
        assert same(w.mask_slots(other, 2, 2, "cpu"), torch.ones(2, 2, dtype=torch.long))


def keys(batch, slots, heads=2, dim=WIDTH + 2, start=0):
    return (torch.arange(batch * heads * slots * dim, dtype=torch.float32) + start).view(batch, heads, slots, dim)


def test_a_writes_ledger_from_ids_or_embeddings():
    ids, mask = T([[4, 5]]), T([[1, 0, 1]])
    write = w.Write(ids, None, mask, None, None, "state", past=7, batch=1, f=2)
    led = write.ledger()
    assert write.length == 2 and same(led.token_ids, ids) and same(led.positions, [[[7, 8]]])
    assert same(led.mask, [[0, 1]]) and led.rope_deltas == "state" and led.prints is None and led.layer is None
    embeds = w.Write(None, T([[3, 9], [4, 8]]), None, None, 2, None, past=0, batch=2, f=2)
    led = embeds.ledger()
    assert same(led.token_ids, [[UNKNOWN, UNKNOWN]] * 2) and same(led.positions, [[[3, 9], [4, 8]]])
    assert same(led.mask, torch.ones(2, 2, dtype=torch.long)) and led.layer == 2
    two = w.Write(None, None, None, None, None, None, past=3, batch=2, f=1).ledger()
    assert same(two.positions, [[[3], [3]]]) and same(two.token_ids, [[UNKNOWN], [UNKNOWN]])


def test_a_slab_of_keys_is_cut_to_its_fingerprints_and_other_prints_are_kept():
    k = keys(1, 3)
    slab = w.Write(T([[1, 2, 3]]), None, None, k, 0, None, 0, 1, 3, slab=True)
    got = slab.fingerprints()
    assert same(got, k[:, 0, :, :WIDTH]) and got.is_contiguous()
    assert same(slab.ledger().prints, k[:, 0, :, :WIDTH])
    prints = torch.zeros(1, 3, WIDTH)
    assert w.Write(None, None, None, prints, 0, None, 0, 1, 3).fingerprints() is prints
    assert w.Write(None, None, None, None, 0, None, 0, 1, 3, slab=True).fingerprints() is None


def test_decode_steps_ledger_with_grown_masks_or_step_by_step():
    k = keys(1, 6)
    steps = w.Steps(f=1, layer=4, start=3, keys=k)
    for j in range(3):
        steps.steps.append((T([[10 + j]]), T([[3 + j]]), torch.ones(1, 4 + j, dtype=torch.long)))
    assert steps.length == 3
    led = steps.ledger()
    assert same(led.token_ids, [[10, 11, 12]]) and same(led.positions, [[[3, 4, 5]]]) and led.layer == 4
    assert same(led.mask, [[1, 1, 1]]) and same(led.prints, k[:, 0, 3:6, :WIDTH]) and led.rope_deltas is None
    odd = w.Steps(f=1, layer=0, start=0, keys=k)
    odd.steps = [(T([[1]]), T([[0]]), None), (T([[2]]), T([[1]]), T([[0, 0]]))]
    assert same(odd.ledger().mask, [[1, 0]])
    one = w.Steps(f=1, layer=0, start=0, keys=k)
    one.steps = [(T([[1]]), T([[0]]), None)]
    assert same(one.ledger().mask, [[1]]) and same(one.ledger().token_ids, [[1]])


def grown(batch, n0, f, k):
    """generate()'s masks of k steps of f tokens after n0 columns, each column its own number."""
    total = n0 + f * (k - 1)
    full = torch.arange(batch * total).view(batch, total)
    return [full[:, :n0 + j * f].clone() for j in range(k)]


@pytest.mark.parametrize("batch, n0, f, k", [(1, 3, 1, 4), (2, 2, 2, 3), (1, 2, 2, 1), (2, 1, 1, 2)])
def test_grown_masks_give_each_steps_last_f_columns(batch, n0, f, k):
    masks = grown(batch, n0, f, k)
    want = torch.cat([m[:, -f:] for m in masks], 1)
    assert same(w._grown_masks(masks, batch, f), want)


def test_masks_that_do_not_grow_as_generate_s_are_left_to_the_step_by_step_path():
    masks = grown(1, 3, 1, 3)
    assert w._grown_masks([None] + masks[1:], 1, 1) is None
    assert w._grown_masks([m[0] for m in masks], 1, 1) is None  # 1-D
    assert w._grown_masks(masks, 2, 1) is None  # other rows
    assert w._grown_masks(masks, 1, 4) is None  # narrower than f
    assert w._grown_masks([masks[0], masks[0], masks[2]], 1, 1) is None
    assert w._grown_masks(masks[:2] + [masks[2].tolist()], 1, 1) is None
    assert w._grown_masks(masks[:2] + [masks[2].to("meta")], 1, 1) is None
    assert w._grown_masks([masks[0][:, :1]], 1, 1) is not None  # exactly f wide
    assert w._grown_masks([T([5])], 1, 1) is None  # 1-D, as long as the batch


def test_grown_masks_at_their_size_limit(monkeypatch):
    masks = grown(2, 3, 2, 3)  # 2 * (3 * 3 + 2 * 3 * 2 // 2) = 30 values
    monkeypatch.setattr(w, "MASKS", 30)
    assert w._grown_masks(masks, 2, 2) is not None
    monkeypatch.setattr(w, "MASKS", 29)
    assert w._grown_masks(masks, 2, 2) is None


def cache_with(keys_tensor):
    layer = SimpleNamespace(keys=keys_tensor)
    return SimpleNamespace(layers=[layer]), layer


def test_the_tail_steps_where_the_cache_took_f_slots_and_starts_new_steps_otherwise():
    base = ledger_from_tensors(T([[1, 2]]))
    tail = w.Tail([base], 2, 1, layer=0)
    _, layer = cache_with(keys(1, 3))
    tail.grown = layer
    assert tail.step(T([[3]]), T([[2]]), None) and tail.length == 3 and tail.writes == 1
    run = tail.chunks[-1]
    assert type(run) is w.Steps and (run.f, run.layer, run.start) == (1, 0, 2) and run.keys is layer.keys is tail.keys
    layer.keys = keys(1, 4)
    assert tail.step(T([[4]]), T([[3]]), None) and tail.chunks[-1] is run and len(run.steps) == 2
    layer.keys = keys(1, 6)
    assert not tail.step(T([[5]]), T([[4]]), None) and tail.length == 4  # 2 slots taken for 1 token
    assert tail.step(T([[5, 6]]), T([[4, 5]]), None) and tail.chunks[-1] is not run and tail.chunks[-1].f == 2
    tail.layer = 1
    layer.keys = keys(1, 8)
    assert tail.step(T([[7, 8]]), T([[6, 7]]), None) and tail.chunks[-1].layer == 1 and len(tail.chunks) == 4


def test_every_fold_writes_the_tail_folds_into_one_ledger(monkeypatch):
    monkeypatch.setattr(w, "FOLD", 3)
    tail = w.Tail([], 0, 1)
    for i in range(2):
        tail.add(ledger_from_tensors(T([[i]])))
    assert len(tail.chunks) == 2 and tail.writes == 2 and tail.length == 2
    tail.add(ledger_from_tensors(T([[2]])))
    assert len(tail.chunks) == 1 and tail.writes == 0 and same(tail.chunks[0].token_ids, [[0, 1, 2]])


def test_a_tail_copies_and_pickles_folded():
    tail = w.Tail([ledger_from_tensors(T([[1]])), ledger_from_tensors(T([[2]]))], 2, 1, layer=3, writes=2)
    for got in (copy.deepcopy(tail), pickle.loads(pickle.dumps(tail))):
        assert len(got.chunks) == 1 and same(got.chunks[0].token_ids, [[1, 2]])
        assert (got.length, got.batch) == (2, 1)
    empty = copy.deepcopy(w.Tail([], 0, 2))
    assert empty.chunks == [] and empty.batch == 2
    assert pickle.loads(pickle.dumps(w.Tail([], 0, 2))).chunks == []


def test_what_the_cache_records_before_a_fold():
    cache = SimpleNamespace()
    assert w.recorded(cache) is None
    cache.__dict__[ATTR] = ledger_from_tensors(T([[1, 2], [3, 4]]))
    assert w.recorded(cache) == (2, 2)
    tail = w.add_chunk(cache, ledger_from_tensors(T([[5], [6]])))
    assert cache.__dict__[TAIL] is tail and tail.length == 3 and tail.batch == 2 and len(tail.chunks) == 2
    assert w.recorded(cache) == (3, 2)
    assert w.add_chunk(cache, ledger_from_tensors(T([[7], [8]]))) is tail and tail.length == 4
    tail.chunks = []
    assert w.recorded(cache) == (2, 2)  # folded away: the stored ledger's


def test_the_first_write_of_an_untracked_cache_starts_the_tail():
    cache = SimpleNamespace()
    tail = w.add_chunk(cache, ledger_from_tensors(T([[5, 6, 7]])))
    assert tail.length == 3 and tail.batch == 1 and len(tail.chunks) == 1
    inner = SimpleNamespace()
    outer = SimpleNamespace(self_attention_cache=inner)
    w.add_chunk(outer, ledger_from_tensors(T([[1]])))
    assert TAIL in inner.__dict__ and TAIL not in outer.__dict__ and w.recorded(outer) == (1, 1)
