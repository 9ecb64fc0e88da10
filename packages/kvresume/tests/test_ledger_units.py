"""The ledger's own operations on hand-made ledgers, each checked entry by entry against the case that contradicts it:
a crop, an eviction, a row selection or repeat (per-row rope_deltas followed, a shared one kept), rows gathered slot by
slot, appended writes (text rows under M-RoPE rows, fingerprints only where every part has them), the next position,
the common prefix (embedding slots match anything), the factory's ledger from ids, and where a cache keeps it."""
from __future__ import annotations

import copy

import torch
from transformers import DynamicCache, EncoderDecoderCache

from kvresume import track
from kvresume.ledger import (ATTR, UNKNOWN, Ledger, _by_count, adopt_prints, attach_ledger, cache_held, empty_ledger,
                             joined, keep_slots, ledger_from_tensors, ledger_of, ledger_owner, stale_prefix, stored_ledger,
                             without_ledger)
from kvresume.testing import build

IDS = torch.tensor([[5, 6, 7, 8], [15, 16, 17, 18]])
POS = torch.tensor([[[0, 1, 2, 3], [0, 0, 1, 2]]])
MASK = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
PRINTS = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 4, 2)


def led(deltas=None, prints=PRINTS) -> Ledger:
    return Ledger(IDS.clone(), POS.clone(), MASK.clone(), deltas, None if prints is None else prints.clone(), 3)


def same(a: Ledger, ids, pos, mask, prints=None) -> bool:
    ok = a.token_ids.tolist() == ids and a.positions.tolist() == pos and a.mask.tolist() == mask
    return ok and (a.prints is None if prints is None else a.prints.tolist() == prints)


def test_length_batch_and_a_crop_keep_every_field_of_the_first_slots():
    a = led()
    assert (a.length, a.batch) == (4, 2)
    b = a.first(2)
    assert same(b, [[5, 6], [15, 16]], [[[0, 1], [0, 0]]], [[1, 1], [0, 1]], PRINTS[:, :2].tolist()) and b.layer == 3
    assert led(prints=None).first(2).prints is None


def test_an_eviction_keeps_the_slots_in_the_order_given():
    b = led().slots([3, 0])
    assert same(b, [[8, 5], [18, 15]], [[[3, 0], [2, 0]]], [[1, 1], [1, 0]], PRINTS[:, [3, 0]].tolist())
    assert led(prints=None).slots(torch.tensor([1])).prints is None


def test_rows_follow_their_per_row_rope_deltas_and_keep_a_shared_one():
    b = led(deltas=torch.tensor([[10], [20]])).rows(torch.tensor([1, 1, 0]))
    assert same(b, [IDS[1].tolist()] * 2 + [IDS[0].tolist()], [[[0, 0, 1, 2], [0, 0, 1, 2], [0, 1, 2, 3]]],
                [MASK[1].tolist()] * 2 + [MASK[0].tolist()], PRINTS[[1, 1, 0]].tolist())
    assert b.rope_deltas.tolist() == [[20], [20], [10]]
    shared = torch.tensor([[7]])
    assert led(deltas=shared).rows(torch.tensor([1, 0])).rope_deltas is shared
    assert led(deltas=torch.tensor(7)).rows(torch.tensor([1, 0])).rope_deltas.tolist() == 7
    assert led(prints=None).rows(torch.tensor([0])).prints is None


def test_gather_takes_each_slot_from_the_row_given_and_the_last_slot_s_rope_deltas():
    index = torch.tensor([[0, 1, 0, 1], [1, 1, 1, 0]])
    b = led(deltas=torch.tensor([[10], [20]])).gather(index)
    assert same(b, [[5, 16, 7, 18], [15, 16, 17, 8]], [[[0, 0, 2, 2], [0, 0, 1, 3]]], [[1, 1, 1, 1], [0, 1, 1, 1]],
                [[PRINTS[r, s].tolist() for s, r in enumerate(row)] for row in index.tolist()])
    assert b.rope_deltas.tolist() == [[20], [10]]
    empty = led(deltas=torch.tensor([[10], [20]])).first(0)
    assert empty.gather(torch.zeros(2, 0, dtype=torch.long)).rope_deltas.tolist() == [[10], [20]]
    assert led(prints=None).gather(index).prints is None


def test_joined_puts_text_rows_under_m_rope_rows_and_keeps_prints_only_where_all_have_them():
    three = Ledger(IDS[:, :2].clone(), torch.stack([POS[0, :, :2]] * 3) + torch.tensor([0, 5, 9]).view(3, 1, 1),
                   MASK[:, :2].clone(), torch.tensor([[1], [2]]), PRINTS[:, :2].clone(), 3)
    b = joined([three, Ledger(IDS[:, 2:], POS[..., 2:], MASK[:, 2:], torch.tensor([[3], [4]]), PRINTS[:, 2:], 3)])
    assert b.token_ids.tolist() == IDS.tolist() and b.mask.tolist() == MASK.tolist() and b.layer == 3
    assert b.positions.tolist() == [[[0, 1, 2, 3], [0, 0, 1, 2]], [[5, 6, 2, 3], [5, 5, 1, 2]], [[9, 10, 2, 3], [9, 9, 1, 2]]]
    assert b.rope_deltas.tolist() == [[3], [4]] and b.prints.tolist() == PRINTS.tolist()
    assert joined([three, Ledger(IDS[:, 2:], POS[..., 2:], MASK[:, 2:])]).prints is None
    text = joined([led().first(2), Ledger(IDS[:, 2:], POS[..., 2:], MASK[:, 2:], None, PRINTS[:, 2:])])
    assert text.positions.tolist() == POS.tolist() and text.prints.tolist() == PRINTS.tolist()


def test_joined_skips_empty_parts_but_keeps_the_last_when_all_are_empty():
    a = led()
    assert same(joined([empty_ledger(2, 3), a]), IDS.tolist(), POS.tolist(), MASK.tolist(), PRINTS.tolist())
    assert joined([a.first(0), a.first(0)]).length == 0
    e = empty_ledger(2, rows=3)
    assert tuple(e.token_ids.shape) == (2, 0) and tuple(e.positions.shape) == (3, 2, 0) and tuple(e.mask.shape) == (2, 0)
    assert e.token_ids.dtype == e.positions.dtype == e.mask.dtype == torch.long and e.prints is None


def test_next_positions_continue_from_each_row_s_last_largest_position():
    assert led().next_positions().tolist() == [4, 3]
    three = Ledger(IDS, torch.stack([POS[0], POS[0] + 4, POS[0] + 1]), MASK)
    assert three.next_positions().tolist() == [8, 7]


def test_the_common_prefix_stops_at_the_first_token_any_row_differs_in():
    a = Ledger(torch.tensor([[5, UNKNOWN, 7, 8], [5, 6, 9, 8]]), torch.zeros(1, 2, 4, dtype=torch.long), torch.ones(2, 4))
    assert a.common_prefix(torch.tensor([[5, 42, 7, 8], [5, 6, 9, 8]])) == 4  # an embedding slot matches any id
    assert a.common_prefix(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])) == 2
    assert a.common_prefix(torch.tensor([[5, 6], [5, 6]])) == 2 and a.common_prefix(torch.tensor([[5, 6, 7, 8, 9]] * 2)) == 2
    assert a.common_prefix(torch.tensor([[6], [5]])) == 0
    assert led().common_prefix(torch.cat([IDS, IDS], 1)) == 4


def test_the_factory_s_ledger_from_ids_defaults_positions_and_mask():
    a = ledger_from_tensors(torch.tensor([4, 5, 6]))
    assert same(a, [[4, 5, 6]], [[[0, 1, 2]]], [[1, 1, 1]]) and a.rope_deltas is None and a.prints is None
    b = ledger_from_tensors(torch.tensor([[4, 5, 6]]), torch.tensor([7, 8, 9]), torch.tensor([[0, 1, 1]]), torch.tensor([2]))
    assert same(b, [[4, 5, 6]], [[[7, 8, 9]]], [[0, 1, 1]]) and b.rope_deltas.tolist() == [2]
    c = ledger_from_tensors(IDS, torch.stack([POS[0]] * 3))
    assert tuple(c.positions.shape) == (3, 2, 4) and c.positions.dtype == torch.long
    ids = torch.tensor([[4, 5, 6]])
    assert ledger_from_tensors(ids).token_ids is not ids


def test_by_count_repeats_rows_to_a_multiple_and_refuses_another_count():
    a = led(prints=None)
    assert _by_count(a, None) .token_ids.tolist() == IDS.tolist() and _by_count(a, 2).token_ids.tolist() == IDS.tolist()
    assert _by_count(a, 4).token_ids.tolist() == [IDS[0].tolist()] * 2 + [IDS[1].tolist()] * 2
    assert _by_count(a, 3) is None


def test_the_ledger_lives_on_the_self_attention_cache_and_moves_with_it():
    dec = DynamicCache()
    dec.update(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4), 0)  # (an empty one is falsy: the wrapper keeps it)
    ed = EncoderDecoderCache(dec, DynamicCache())
    assert ledger_owner(ed) is dec and ledger_owner(dec) is dec
    attach_ledger(ed, led())
    assert ATTR in dec.__dict__ and stored_ledger(ed) is dec.__dict__[ATTR] and stored_ledger(None) is None
    assert attach_ledger(ed, None) is ed and ATTR not in dec.__dict__
    assert cache_held(DynamicCache()) == (0, None) and cache_held(ed) == (3, 2)


def test_a_tracked_cache_s_ledger_is_cropped_evicted_and_dropped_with_it():
    m = build("dense")
    with track(m), torch.no_grad():
        cache = m(input_ids=torch.arange(10, 22).view(2, 6), use_cache=True).past_key_values
    assert cache_held(cache) == (6, 2) and ledger_of(cache).token_ids.tolist() == [list(range(10, 16)), list(range(16, 22))]
    bare = without_ledger(cache)
    assert stored_ledger(bare) is None and stored_ledger(cache) is not None and bare.get_seq_length() == 6
    kept = copy.deepcopy(cache)
    keep_slots(kept, [0, 2])
    assert stored_ledger(kept).token_ids.tolist() == [[10, 12], [16, 18]]
    assert keep_slots(bare, [0]) is bare and stored_ledger(bare) is None
    cache.crop(-2)  # a negative crop (the removal count): every release takes it
    assert ledger_of(cache).length == 4 and stored_ledger(cache).length == 6  # a crop trims as it is read


def _tracked(kind: str, ids: torch.Tensor, **config) -> DynamicCache:
    m = build(kind) if not config else _sliding_only()
    with track(m), torch.no_grad():
        return m(input_ids=ids, use_cache=True).past_key_values


def _sliding_only() -> torch.nn.Module:
    import transformers
    from kvresume.testing import text_config

    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(text_config("sliding", layer_types=["sliding_attention"] * 4)).eval()


def test_stale_prefix_names_the_first_slot_any_row_lost_and_the_first_row_that_lost_it():
    ids = torch.arange(10, 22).view(2, 6)
    cache = _tracked("dense", ids)
    assert stale_prefix(cache) is None
    edited = copy.deepcopy(cache)
    edited.layers[-1].keys[1, 0, 3, 0] += 1
    edited.layers[-1].keys[0, 0, 5, 0] += 1
    assert stale_prefix(edited) == (3, 6, 1) and ledger_of(edited) is None
    edited.crop(-3)
    assert stale_prefix(edited) is None and ledger_of(edited).length == 3  # the edited slots cropped away
    assert stale_prefix(DynamicCache()) is None
    from kvresume import kv_cache_from_tensors
    from kvresume.testing import text_config

    by_ids = kv_cache_from_tensors([(l.keys, l.values) for l in edited.layers], text_config("dense"), token_ids=ids[:, :3])
    by_ids.layers[-1].keys[0, 0, 1, 0] += 1
    assert stale_prefix(by_ids) is None  # no fingerprints: nothing to contradict


def test_a_sliding_only_cache_shows_too_little_to_name_stale_slots():
    cache = _tracked("sliding", torch.arange(10, 30).view(1, -1), sliding_only=True)
    cache.layers[-1].keys[0, 0, -1, 0] += 1
    assert stale_prefix(cache) is None and ledger_of(cache) is None


def test_a_ledger_without_fingerprints_adopts_the_cache_s_where_it_shows_them():
    ids = torch.arange(10, 22).view(2, 6)
    cache = _tracked("dense", ids)
    bare = ledger_from_tensors(ids)
    got = adopt_prints(cache, bare)
    assert got.layer == 3 and got.prints.equal(stored_ledger(cache).prints) and got.prints is not stored_ledger(cache).prints
    assert got.token_ids.equal(ids) and bare.prints is None
    assert adopt_prints(cache, ledger_from_tensors(ids[:1])) .prints is None  # other rows: not adopted
    assert adopt_prints(cache, ledger_from_tensors(torch.arange(8).view(1, 8).repeat(2, 1))).prints is None  # longer


def test_the_factory_s_ledger_is_long_integers_in_rows_whatever_it_is_given():
    a = ledger_from_tensors(torch.tensor([[4, 5, 6]], dtype=torch.int32), torch.tensor([[7, 8, 9]], dtype=torch.int32),
                            torch.tensor([[False, True, True]]))
    assert a.token_ids.dtype == a.positions.dtype == a.mask.dtype == torch.long and a.mask.tolist() == [[0, 1, 1]]
    b = ledger_from_tensors(IDS, POS[0])  # 2-D positions [batch, slots]: one text row
    assert tuple(b.token_ids.shape) == (2, 4) and b.positions.tolist() == POS.tolist()
    assert ledger_from_tensors(IDS).positions.tolist() == [[[0, 1, 2, 3], [0, 1, 2, 3]]]
    assert tuple(empty_ledger(2).positions.shape) == (1, 2, 0)


def test_one_rope_delta_per_row_is_followed_and_empty_parts_keep_the_last_one_s_rows():
    assert led(deltas=torch.tensor([10, 20])).rows(torch.tensor([1, 0, 0])).rope_deltas.tolist() == [20, 10, 10]
    parts = [empty_ledger(2, 1), empty_ledger(2, 3), empty_ledger(2, 1)]
    assert tuple(joined(parts).positions.shape) == (1, 2, 0)


def test_a_stale_slot_inside_a_cropped_cache_is_named_and_cache_held_reads_any_cache():
    from types import SimpleNamespace

    cache = _tracked("dense", torch.arange(10, 22).view(2, 6))
    cache.layers[-1].keys[0, 0, 1, 0] += 1
    cache.crop(-3)
    assert stale_prefix(cache) == (1, 3, 0)
    assert cache_held(SimpleNamespace(get_seq_length=lambda: 0)) == (0, None)
    layers = [SimpleNamespace(), SimpleNamespace(keys=torch.zeros(0)), SimpleNamespace(keys=torch.zeros(3, 1, 2, 4))]
    assert cache_held(SimpleNamespace(layers=layers, get_seq_length=lambda: 2)) == (2, 3)
    bare = without_ledger(cache)
    assert bare.layers[0].keys is not cache.layers[0].keys and bare.layers[0].keys.equal(cache.layers[0].keys)


def test_the_ledger_of_an_empty_encoder_decoder_cache_is_kept_on_its_decoder_side():
    """An empty DynamicCache is falsy: the owner is still the self-attention cache, where later reads look."""
    from transformers import DynamicCache, EncoderDecoderCache

    from kvresume.ledger import ledger_owner

    inner = DynamicCache()
    wrapper = EncoderDecoderCache(inner, DynamicCache())
    assert not inner and ledger_owner(wrapper) is inner
    plain = DynamicCache()
    assert ledger_owner(plain) is plain
