"""kvresume.prefix's decision functions, each fed the case that contradicts it: stuck positions vs an eviction's gaps
vs left padding (misplaced), a mask that disagrees (reusable), padded rows' positions (start_positions,
text_positions), caches that can or cannot crop (can_crop), and the guard's fix fitting (ledger_checks._refuse)."""
from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache

from kvresume import testing as T
from kvresume.compat import text_config
from kvresume.ledger import Ledger
from kvresume.prefix import can_crop, misplaced, reusable, start_positions, text_positions


def _led(positions: list[list[int]], mask: list[list[int]] | None = None, ids: list[list[int]] | None = None) -> Ledger:
    pos = torch.tensor(positions)
    ids_t = torch.tensor(ids) if ids is not None else torch.arange(pos.numel()).view_as(pos) + 10
    mask_t = torch.tensor(mask) if mask is not None else torch.ones_like(pos)
    return Ledger(ids_t, pos.unsqueeze(0), mask_t)


def test_misplaced_stuck_vs_gaps_vs_padding() -> None:
    assert misplaced(_led([[0, 1, 2, 2, 2]])) == 3  # stuck at 2
    assert misplaced(_led([[0, 1, 5, 9]])) is None  # an eviction's gaps: increasing
    assert misplaced(_led([[1, 1, 0, 1, 2]], [[0, 0, 1, 1, 1]])) is None  # pads (at 1) are not read
    assert misplaced(_led([[0, 1, 2, 3], [1, 0, 1, 1]], [[1, 1, 1, 1], [0, 1, 1, 1]])) == 3  # row 1 stuck at slot 3
    mrope = Ledger(torch.ones(1, 3, dtype=torch.long), torch.zeros(3, 1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    assert misplaced(mrope) is None  # M-RoPE positions are not read


def test_reusable_stops_at_mask_disagreement_and_stuck_slots() -> None:
    led = _led([[0, 1, 2, 3]], ids=[[5, 6, 7, 8]])
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    assert reusable(led, ids, None) == 4
    assert reusable(led, ids, torch.tensor([[1, 1, 0, 1, 1]])) == 2  # slot 2 attended in the cache, padding now
    assert reusable(_led([[0, 1, 1, 1]], ids=[[5, 6, 7, 8]]), ids, None) == 2  # slots 2.. stuck
    assert reusable(led, torch.tensor([[5, 4, 7]]), None) == 1


def test_positions_count_only_attended_slots() -> None:
    kept = _led([[0, 1, 2], [1, 1, 1]], [[1, 1, 1], [0, 0, 0]])  # row 1: all padding so far
    assert start_positions(kept).tolist() == [3, 0]
    assert text_positions(kept, torch.tensor([[1, 1], [0, 1]])).tolist() == [[3, 4], [1, 0]]
    assert start_positions(_led([[0]]).first(0)).tolist() == [0]


def test_can_crop_static_sliding_dynamic() -> None:
    m = T.model("sliding")
    p = T.prompt("sliding")["input_ids"]
    with torch.no_grad():
        past = DynamicCache(config=m.config)
        m(input_ids=p, **{T.cache_kw(m): past}, use_cache=True)  # 40 tokens, window 16
        short = DynamicCache(config=m.config)
        m(input_ids=p[:, :8], **{T.cache_kw(m): short}, use_cache=True)
    assert not can_crop(past) and can_crop(short)
    from transformers.cache_utils import StaticLayer

    static = StaticCache(config=text_config(T.model("dense").config), max_cache_len=8)
    assert can_crop(static) == hasattr(StaticLayer, "crop")  # 5.17.0: no crop; 5.25.0: a negative crop
    assert can_crop(DynamicCache())


def test_decoder_whole_ids_or_cached_plus_suffix() -> None:
    from kvresume.ledger_checks import _decoder_whole

    led = _led([[0, 1, 2, 3]], ids=[[2, 6, 7, 8]])
    whole = torch.tensor([[2, 6, 7, 9]])
    assert torch.equal(_decoder_whole(led, whole, 3), whole)  # already the whole sequence
    assert _decoder_whole(led, torch.tensor([[7, 8]]), 2).tolist() == [[2, 6, 7, 8]]  # the cache's last 2: a suffix
    assert _decoder_whole(led, torch.tensor([[2, 6]]), 2).tolist() == [[2, 6, 2, 6]]  # as long as the crop: a suffix


def test_fed_mask_narrow_only_where_generate_narrowed_the_given_mask() -> None:
    from kvresume.call import ResumeCall
    from kvresume.checks import fed_mask_narrow
    from kvresume import ResumeInputError

    m = T.model("dense")
    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=T.prompt("dense")["input_ids"], **{T.cache_kw(m): cache}, use_cache=True)  # 24 cached

    def call(given: int | None, fed: int | None) -> ResumeCall:
        c = ResumeCall(cache, n=6, fed=6, attention_mask=None if given is None else torch.ones(1, given, dtype=torch.long))
        c.fed_mask = None if fed is None else torch.ones(1, fed, dtype=torch.long)
        return c

    import pytest
    with pytest.raises(ResumeInputError) as err:
        fed_mask_narrow(call(30, 6))  # given 30 columns, generate() fed 6
    assert err.value.fix == {"resume": True}
    fed_mask_narrow(call(30, 30))  # fed as given
    fed_mask_narrow(call(6, 6))  # the caller's own short mask (mask_width / ledger checks name it): not generate()'s
    fed_mask_narrow(call(None, 6))  # no mask given
    fed_mask_narrow(call(30, None))  # no mask fed (5.25.0)
