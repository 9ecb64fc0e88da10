"""kvresume.pool's rules, at their boundaries: which calls the pool cannot resume (`unpooled`), and what tells two
models' caches apart (`identity`). Fast: no generate() call."""
from __future__ import annotations

import pytest
import torch

from kvresume.pool import identity, unpooled
from kvresume.testing import build


@pytest.fixture(scope="module")
def ref() -> torch.nn.Module:
    return build("llama")


def ids(n: int) -> torch.Tensor:
    return torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(0))


def test_a_neutral_setting_is_pooled(ref):
    assert unpooled(ref, ids(5), dict(cache_implementation=None, return_dict_in_generate=False)) is None
    assert "cache_implementation" in unpooled(ref, ids(5), dict(cache_implementation="static"))
    assert "one row" in unpooled(ref, ids(5).repeat(2, 1), {})
    assert "past_key_values" in unpooled(ref, ids(5), dict(past_key_values=object()))


def test_images_the_ledger_cannot_key_by_pixels_are_re_prefilled(ref):
    why = unpooled(ref, ids(5), dict(pixel_values=torch.zeros(1, 3, 8, 8)))
    assert why is not None and "pixel_values" in why
    assert unpooled(ref, ids(5), dict(pixel_values=None)) is None




def test_unpooled_names_each_cause_exactly(ref):
    assert unpooled(ref, None, {}) == "not one row of input ids"
    assert unpooled(ref, ids(5)[0], {}) == "not one row of input ids"
    assert unpooled(build("bart"), ids(5), {}) == "an encoder-decoder model"
    assert unpooled(ref, ids(5), dict(position_ids=torch.arange(5)[None])) == "the caller passed position_ids"
    beside = "beside a pooled cache"
    assert unpooled(ref, ids(5), dict(return_dict_in_generate=True)) == f"return_dict_in_generate=True {beside}"
    assert unpooled(ref, ids(5), dict(cache_implementation="static")) == f"cache_implementation='static' {beside}"


def test_identity_follows_any_weight_changed_in_place_and_another_model():
    m = build("llama")
    before = identity(m)
    assert identity(m) == before  # nothing changed: the same identity
    with torch.no_grad():
        m.lm_head.weight[-1, -1] += 1.0  # one value no sample reads: its version counter moved
    assert identity(m) != before
    assert identity(build("llama")) != identity(build("llama"))  # two objects with equal weights: caches stay apart


@pytest.mark.parametrize("at", [0, 15])
def test_identity_reads_sampled_values_a_copy_through_data_does_not_version(at):
    m = build("llama")
    w = m.lm_head.weight
    before, flat, version = identity(m), w.data.view(-1), w._version
    flat[at * (flat.numel() // 16)] += 1.0  # through .data: the version counter stays, the 16 samples see it
    assert w._version == version and identity(m) != before
    flat[at * (flat.numel() // 16) + 1] += 1.0  # between two samples, through .data: not seen (the limit of a sample)
    after = identity(m)
    flat[at * (flat.numel() // 16) + 1] -= 1.0
    assert identity(m) == after


def test_an_adapter_switched_on_or_off_is_another_identity():
    peft = pytest.importorskip("peft")
    m = build("llama")
    lora = peft.get_peft_model(m, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    on = identity(lora)
    with lora.disable_adapter():
        off = identity(lora)
    assert on != off and identity(lora) == on


