"""Tracking is cheap: the hooks read nothing back to the host in the decode path (no .item(), .tolist(), .cpu(),
bool(tensor), int(tensor), ...). Counted with a TorchFunctionMode: a tracked step makes exactly the host reads an
untracked one makes (the model's own), for a decode step, a whole generate(), beam search, a batch change and a
hybrid model's linear-state marks."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kvresume import ledger_of, track
from kvresume.testing import build

HOST = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"}


class HostReads(TorchFunctionMode):
    """Counts the tensor calls that read values back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        kwargs = kwargs or {}
        to_cpu = name == "to" and getattr(getattr(args[0], "device", None), "type", "cpu") != "cpu" and \
            any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device")))  # a copy to the host from a device
        if name in HOST or to_cpu:
            self.calls.append(name)
        return func(*args, **kwargs)


def reads(fn) -> list[str]:
    with HostReads() as mode, torch.no_grad():
        fn()
    return mode.calls


def both(m, fn) -> tuple[list[str], list[str]]:
    """(host reads of fn() with the model tracked, untracked)."""
    tracker = track(m)
    tracked = reads(fn)
    tracker.remove()
    return tracked, reads(fn)


@pytest.mark.parametrize("kind", ["dense", "hybrid", "sliding"])
def test_a_tracked_decode_step_reads_nothing_back(kind):
    m = build(kind)
    ids = torch.randint(10, 2000, (1, 40), generator=torch.Generator().manual_seed(0))
    tracker = track(m)
    with torch.no_grad():
        cache = m(input_ids=ids, use_cache=True).past_key_values
    tracker.remove()
    nxt = torch.tensor([[7]])

    def step():
        m(input_ids=nxt, past_key_values=copy.deepcopy(cache), attention_mask=torch.ones(1, 41, dtype=torch.long))

    tracked, untracked = both(m, step)
    assert sorted(tracked) == sorted(untracked), (tracked, untracked)


def test_generate_and_beam_search_read_nothing_more_when_tracked():
    m = build("dense")
    ids = torch.randint(10, 2000, (1, 12), generator=torch.Generator().manual_seed(1))
    for extra in ({}, {"num_beams": 3}):
        def run():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0,
                       **extra)

        tracked, untracked = both(m, run)
        assert sorted(tracked) == sorted(untracked), (extra, tracked, untracked)


def test_a_batch_change_is_followed_without_reading_back():
    m = build("dense")
    ids = torch.randint(10, 2000, (2, 10), generator=torch.Generator().manual_seed(2))
    tracker = track(m)
    with torch.no_grad():
        cache = m(input_ids=ids, use_cache=True).past_key_values
    tracker.remove()
    nxt = torch.tensor([[7], [8], [9]])
    grown = {}

    def step():
        c = copy.deepcopy(cache)
        c.batch_select_indices(torch.tensor([1, 0, 1]))
        m(input_ids=nxt, past_key_values=c, attention_mask=torch.ones(3, 11, dtype=torch.long))
        grown["cache"] = c

    tracked, untracked = both(m, step)
    assert sorted(tracked) == sorted(untracked), (tracked, untracked)
    track(m)
    step()  # tracked again, outside the counter: the ledger read back follows the rows
    assert torch.equal(ledger_of(grown["cache"]).token_ids, torch.cat([ids[[1, 0, 1]], nxt], 1))
