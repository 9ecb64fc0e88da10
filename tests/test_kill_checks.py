"""Kill tests for the guard's checks (make mutants: packages/kvresume/kvresume/checks.py) on hand-made calls: each feeds a check the
measurement that tells it from a near miss (a cache whose widest layer is not its reported length, a 4-D mask, an
empty or one-token decoder feed, a sliding layer). No model runs."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from kvresume import checks
from kvresume.call import ResumeCall, ResumeInputError


@dataclass
class Call(ResumeCall):
    """A ResumeCall whose cache lengths are given: (reported, widest)."""

    past: int = 0
    widest: int | None = None

    @property
    def lengths(self) -> tuple[int, int]:
        return self.past, self.past if self.widest is None else self.widest


def _layer(length: int, sliding: bool = False) -> SimpleNamespace:
    return SimpleNamespace(keys=torch.zeros(1, 1, length, 2), is_sliding=sliding, get_seq_length=lambda: length)


def test_nothing_fed_with_a_4d_mask_names_the_suffix_and_the_whole_width():
    call = Call(cache=None, n=3, fed=0, past=5, attention_mask=torch.ones(1, 1, 3, 8))
    with pytest.raises(ResumeInputError) as err:
        checks.nothing_fed(call)
    assert str(err.value) == ("generate() feeds the model none of the 3 tokens given beside a cache of 5: pass the suffix "
                              "with an attention_mask of 8 columns (cached + suffix)")


def test_nothing_fed_with_a_full_width_mask_is_not_the_suffix_only_case():
    with pytest.raises(ResumeInputError, match="feeds the model none of the 3 tokens"):
        checks.nothing_fed(Call(cache=None, n=3, fed=0, past=5, attention_mask=torch.ones(1, 8)))


def test_nothing_fed_reads_the_masks_columns_not_its_rows():
    with pytest.raises(ResumeInputError, match="covers only the suffix \\(3 columns\\)"):
        checks.nothing_fed(Call(cache=None, n=3, fed=0, past=5, attention_mask=torch.ones(2, 3)))


def test_fed_neither_passes_what_a_whole_sequence_leaves_uncached_per_length():
    checks.fed_neither(Call(cache=None, n=10, fed=5, past=5, widest=7))  # n - past
    checks.fed_neither(Call(cache=None, n=10, fed=3, past=5, widest=7))  # n - widest
    checks.fed_neither(Call(cache=None, n=10, fed=10, past=5, widest=7))  # the suffix


def test_fed_neither_message():
    with pytest.raises(ResumeInputError) as err:
        checks.fed_neither(Call(cache=None, n=10, fed=2, past=5))
    assert str(err.value) == ("generate() feeds the model 2 of the 10 tokens given beside a cache of 5: neither the suffix "
                              "(10) nor what a whole sequence leaves uncached; pass the suffix with an attention_mask of 15 "
                              "columns (cached + suffix)")


START = 0


def _restart(ids: torch.Tensor | None, past: int, widest: int | None = None) -> Call:
    return Call(cache=None, n=4, fed=None if ids is None else ids.shape[-1], past=past, widest=widest,
                decoder_start=START, fed_ids=ids)


@pytest.mark.parametrize("ids, past", [(torch.tensor([[START]]), 3), (torch.tensor([[START, 5]]), 1)])
def test_restart_token_raises_for_one_token_and_a_one_token_cache(ids, past):
    with pytest.raises(ResumeInputError, match="decoder start token first"):
        checks.restart_token(_restart(ids, past))


@pytest.mark.parametrize("ids, past, widest", [
    (torch.tensor([[START, 5]]), 0, 4),  # the reported length is 0, whatever the widest layer holds
    (torch.tensor([[START, 5]]), 0, 0),
    (None, 3, None),  # no captured ids
    (torch.zeros(1, 0, dtype=torch.long), 3, None),  # nothing fed
])
def test_restart_token_returns_without_a_cache_or_ids(ids, past, widest):
    checks.restart_token(_restart(ids, past, widest))


def test_mask_width_accepts_the_cached_plus_fed_columns_where_the_widest_layer_differs():
    checks.mask_width(Call(cache=None, n=2, past=5, widest=7, attention_mask=torch.ones(1, 7)))
    checks.mask_width(Call(cache=None, n=2, past=5, widest=7, attention_mask=torch.ones(1, 9)))
    with pytest.raises(ResumeInputError, match="attention_mask has 8 columns"):
        checks.mask_width(Call(cache=None, n=2, past=5, widest=7, attention_mask=torch.ones(1, 8)))


def test_uneven_layers_ignores_sliding_layers_and_catches_two_lengths():
    sliding = SimpleNamespace(layers=[_layer(6), _layer(3, sliding=True)])
    checks.uneven_layers(Call(cache=sliding, n=1, past=6))
    uneven = SimpleNamespace(layers=[_layer(6), _layer(4)])
    with pytest.raises(ResumeInputError, match="hold \\[4, 6\\] tokens"):
        checks.uneven_layers(Call(cache=uneven, n=1, past=6))
    checks.uneven_layers(Call(cache=uneven, n=1, past=6, position_ids=torch.arange(1)[None]))


def test_rope_state_names_the_reported_length():
    with pytest.raises(ResumeInputError, match="beside a cache of 5 tokens"):
        checks.rope_state(Call(cache=None, n=1, past=5, widest=7, keeps_rope_state=True))


def test_positions_follow_the_given_rows_not_the_masks_padding():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])  # 5 cached columns, row 1 with 2 padding
    call = Call(cache=None, n=1, past=5, processed_length=5, rows=torch.tensor([5, 4]), attention_mask=mask,
                position_ids=torch.tensor([[5], [4]]))
    checks.positions_at_processed(call)  # the rows say 5 and 4 (the mask's padding would say 3)
    with pytest.raises(ResumeInputError, match="expected \\[5, 4\\]"):
        checks.positions_at_processed(Call(**{**call.__dict__, "position_ids": torch.tensor([[5], [3]])}))


ROWS2 = torch.zeros(2, 3, dtype=torch.long)


@pytest.mark.parametrize("check, call, name, shape", [
    (checks.nothing_fed, Call(cache=None, n=3, fed=0, past=5, given_ids=ROWS2), "attention_mask", (2, 8)),  # no mask
    (checks.nothing_fed, Call(cache=None, n=3, fed=0, past=5), "attention_mask", (1, 8)),  # no ids given: one row
    (checks.nothing_fed, Call(cache=None, n=3, fed=0, past=5, given_ids=ROWS2, attention_mask=torch.ones(2, 3)),
     "attention_mask", (2, 8)),  # a mask over the suffix only
    (checks.nothing_fed, Call(cache=None, n=3, fed=0, past=5, given_ids=ROWS2, attention_mask=torch.ones(2, 8)),
     "attention_mask", (2, 8)),  # a full-width mask, nothing fed all the same
    (checks.mask_width, Call(cache=None, n=2, fed=2, past=5, widest=7, given_ids=ROWS2, attention_mask=torch.ones(2, 8)),
     "attention_mask", (2, 7)),
    (checks.restart_token, Call(cache=None, n=4, fed=3, past=4, decoder_start=START, fed_ids=ROWS2, given_ids=ROWS2),
     "decoder_attention_mask", (2, 4)),  # the whole decoder sequence given
], ids=["no-mask", "no-ids", "suffix-mask", "full-mask", "mask-width", "restart-token"])
def test_each_refusal_carries_a_long_ones_mask_over_cached_and_suffix(check, call, name, shape):
    """The advice a refusal carries: an all-ones int64 mask, one row per given row (1 without ids), cached + suffix
    wide (a decoder's: the whole decoder sequence given)."""
    with pytest.raises(ResumeInputError) as err:
        check(call)
    fix = err.value.fix
    assert list(fix) == [name] and fix[name].dtype == torch.long
    assert fix[name].shape == shape and bool(fix[name].eq(1).all())
