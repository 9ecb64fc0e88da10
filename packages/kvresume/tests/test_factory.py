"""The factory's decisions, each fed the case that contradicts it, on configs alone (no forward pass): every refusal's
exact message (which layer, which shape), the borders it accepts (a sliding layer at its window, processed_length 0,
a linear layer with only one kind of state), the ledger it attaches, and the linear layers' token count and conv
kernel size carried both ways (kv_cache_from_tensors, export_tensors)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers

from kvresume import compat, export_tensors, kv_cache_from_tensors, ledger_of
from kvresume.factory import FactoryError, layer_types, validate
from kvresume.ledger import stored_ledger
from kvresume.testing import text_config

DENSE, SLIDING, HYBRID = text_config("dense"), text_config("sliding"), text_config("hybrid")  # 2 K/V heads, head_dim 16


def kv(slots: int = 10, batch: int = 1, heads: int = 2, dim: int = 16, dtype: torch.dtype = torch.float32) -> tuple:
    gen = torch.Generator().manual_seed(slots * 100 + batch)
    return (torch.randn(batch, heads, slots, dim, generator=gen).to(dtype),
            torch.randn(batch, heads, slots, dim, generator=gen).to(dtype))


def refusal(pairs: list[Any], config: Any, **kwargs: Any) -> str:
    with pytest.raises(FactoryError) as err:
        kv_cache_from_tensors(pairs, config, **kwargs)
    return str(err.value)


def linear(conv_width: int = 4) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(conv_width)
    return {"conv": {0: torch.randn(1, 8, conv_width, generator=gen)}, "recurrent": {0: torch.randn(1, 2, 4, 4, generator=gen)}}


def hybrid_pairs(slots: int = 10) -> tuple[list[Any], dict[int, Any]]:
    pairs = [kv(slots) if t == "full_attention" else None for t in HYBRID.layer_types]
    return pairs, {i: linear() for i, t in enumerate(HYBRID.layer_types) if t == "linear_attention"}


def all_linear_config() -> Any:
    fields = {k: getattr(HYBRID, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "linear_conv_kernel_dim",
                                              "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                                              "linear_num_value_heads")}
    return transformers.Qwen3_5TextConfig(**fields, num_hidden_layers=2, layer_types=["linear_attention"] * 2)


def test_a_config_without_layer_types_is_full_attention_everywhere():
    assert layer_types(SimpleNamespace(num_hidden_layers=3)) == ["full_attention"] * 3
    assert layer_types(SLIDING) == ["sliding_attention", "full_attention"] * 2
    assert refusal([kv(), None, kv(), kv()], SimpleNamespace(num_hidden_layers=4, num_key_value_heads=2, head_dim=16)) == \
        "layer 1: attention layer (layer_types[1] = 'full_attention') given no K/V"


def test_a_pair_must_be_two_tensors():
    k, v = kv()
    assert refusal([kv(), (k, v, v), kv(), kv()], DENSE) == "layer 1: expected a (keys, values) pair of tensors, got tuple"
    assert refusal([kv(), kv(), (k, v.tolist()), kv()], DENSE) == "layer 2: keys and values must be tensors, got Tensor/list"
    assert refusal([kv(), kv(), (None, v), kv()], DENSE) == "layer 2: keys and values must be tensors, got NoneType/Tensor"


def test_each_shape_refusal_names_the_layer_and_the_offending_dimension():
    assert refusal([kv(), kv(), kv(5, heads=3), kv()], DENSE) == \
        "layer 2: K/V heads: 3 in [1, 3, 5, 16], the config has num_key_value_heads=2"
    assert refusal([kv(), kv(), kv(5, dim=8), kv()], DENSE) == \
        "layer 2: head_dim: 8 in [1, 2, 5, 8], the config has head_dim=16"
    k, v = kv()
    assert refusal([kv(), kv(), (k, v.half()), kv()], DENSE) == \
        "layer 2: keys are torch.float32 on cpu, values torch.float16 on cpu"


def test_a_batch_size_differing_across_layers_names_both():
    assert refusal([kv(batch=1), kv(batch=3), kv(), kv()], DENSE) == "layer 1: batch size 3, layer 0 has 1"


def test_a_linear_layer_takes_either_kind_of_state_and_nothing_else():
    pairs, states = hybrid_pairs()
    conv_only = {i: {"conv": s["conv"]} for i, s in states.items()}
    recurrent_only = {i: {"recurrent": s["recurrent"]} for i, s in states.items()}
    assert set(validate(pairs, HYBRID, linear_states=conv_only)) == {3, 7}
    assert set(validate(pairs, HYBRID, linear_states=recurrent_only)) == {3, 7}
    listed = {**states, 1: ["conv", "recurrent"]}
    assert refusal(pairs, HYBRID, linear_states=listed).startswith("layer 1: linear-attention layer without conv/recurrent")
    assert refusal(pairs, HYBRID, linear_states={**states, 1: {"conv": {}}}).startswith("layer 1: linear-attention")
    given_kv = [kv() if i == 1 else p for i, p in enumerate(pairs)]
    assert refusal(given_kv, HYBRID, linear_states=states).startswith(
        "layer 1: linear-attention layer (layer_types[1] = 'linear_attention') given K/V")


def test_a_sliding_layer_may_hold_its_whole_window_given_the_processed_length():
    at_window = [kv(16), kv(30), kv(16), kv(30)]
    assert kv_cache_from_tensors(at_window, SLIDING, processed_length=30).get_seq_length() == 30
    assert refusal([kv(17), kv(30), kv(16), kv(30)], SLIDING, processed_length=30) == \
        "layer 0: sliding layer given 17 slots, more than its window sliding_window=16"


def test_the_processed_length_is_needed_from_a_window_less_one_and_only_for_sliding_layers():
    short = kv_cache_from_tensors([kv(14), kv(14), kv(14), kv(14)], SLIDING)
    assert short.get_seq_length() == 14
    assert kv_cache_from_tensors([kv(5), kv(40), kv(5), kv(40)], SLIDING).layers[1].keys.shape[-2] == 40
    assert refusal([kv(15), kv(15), kv(15), kv(15)], SLIDING) == (
        "processed_length: a sliding layer holds a full window, so how many tokens it has seen is not in its K/V; "
        "pass processed_length")


def test_processed_length_must_be_a_non_negative_int_and_zero_is_one():
    for bad in (True, 3.5, -1):
        assert refusal([kv()] * 4, DENSE, processed_length=bad) == \
            f"processed_length: {bad!r} is not a non-negative int"
    empty = [kv(0)] * 4
    assert validate(empty, DENSE, processed_length=0).keys() == {0, 1, 2, 3}
    assert refusal([kv(3)] * 4, DENSE, processed_length=0) == "layer 0: processed_length 0 is smaller than the 3 slots it stores"


def test_the_ledger_holds_the_given_ids_and_positions_one_per_slot():
    ids = torch.arange(100, 110).view(1, -1)
    positions = torch.arange(5, 15).view(1, -1)
    cache = kv_cache_from_tensors([kv()] * 4, DENSE, token_ids=ids, positions=positions)
    led = ledger_of(cache)
    assert led.token_ids.equal(ids) and led.positions.equal(positions.unsqueeze(0))
    assert ledger_of(kv_cache_from_tensors([kv()] * 4, DENSE, token_ids=ids)).positions.equal(torch.arange(10).view(1, 1, -1))
    assert ledger_of(kv_cache_from_tensors([kv()] * 4, DENSE)) is None


def test_a_ledger_that_does_not_fit_the_slots_is_refused_naming_both_shapes():
    ids = torch.arange(100, 110).view(1, -1)
    assert refusal([kv()] * 4, DENSE, token_ids=ids[:, :9]) == "token_ids: 1 rows x 9 slots, the K/V hold 1 x 10"
    assert refusal([kv(batch=2)] * 4, DENSE, token_ids=ids) == "token_ids: 1 rows x 10 slots, the K/V hold 2 x 10"
    assert refusal([kv(batch=3)] * 4, DENSE, token_ids=ids.repeat(2, 1)) == "token_ids: 2 rows x 10 slots, the K/V hold 3 x 10"
    assert refusal([kv()] * 4, DENSE, token_ids=ids, positions=torch.arange(11).view(1, -1)) == \
        "positions: shape [1, 1, 11] does not match token_ids [1, 10]"
    assert refusal([kv()] * 4, DENSE, positions=torch.arange(10).view(1, -1)) == \
        "positions given without token_ids: the ledger needs both (or token_ids alone)"


def test_a_cache_without_attention_layers_takes_any_ledger():
    config = all_linear_config()
    ids = torch.arange(100, 107).view(1, -1)
    cache = kv_cache_from_tensors([None, None], config, linear_states={0: linear(), 1: linear()}, token_ids=ids)
    assert stored_ledger(cache).token_ids.equal(ids)  # (ledger_of needs an attention layer's length to read it)


def test_linear_layers_get_the_processed_length_else_the_longest_kv_else_zero(monkeypatch):
    seen: list[tuple[Any, Any]] = []
    carry = compat.carry_linear_length
    monkeypatch.setattr(compat, "carry_linear_length", lambda t, s: seen.append((t, s)) or carry(t, s))

    def counts(pairs: list[Any], config: Any, states: dict[int, Any], **kwargs: Any) -> dict[int, Any]:
        seen.clear()
        cache = kv_cache_from_tensors(pairs, config, linear_states=states, **kwargs)
        index = {id(layer): i for i, layer in enumerate(cache.layers)}
        return {index.get(id(t)): s for t, s in seen if isinstance(s, int)}

    pairs, states = hybrid_pairs(10)
    pairs[7] = kv(12)
    assert counts(pairs, HYBRID, states) == {i: 12 for i in states}
    assert counts(pairs, HYBRID, states, processed_length=20) == {i: 20 for i in states}
    assert counts([None, None], all_linear_config(), {0: linear(), 1: linear()}) == {0: 0, 1: 0}


def test_the_conv_kernel_size_travels_both_ways():
    pairs, states = hybrid_pairs()
    states[0] = {**linear(3), "conv_kernel_size": {0: 4}}  # a conv state shorter than the kernel: padded to it
    cache = kv_cache_from_tensors(pairs, HYBRID, linear_states=states)
    assert cache.layers[0].conv_kernel_size[0] == 4 and cache.layers[0].conv_states[0].shape[-1] == 4
    assert cache.layers[1].conv_kernel_size[0] == 4  # none given: the state's own width
    _, exported, _ = export_tensors(cache)
    assert exported[0]["conv_kernel_size"] == {0: 4} and set(exported) == set(states)


def test_export_reads_a_layer_without_a_conv_kernel_size():
    layer = SimpleNamespace(conv_states={0: torch.ones(1, 2, 3)}, recurrent_states={0: None})
    cache = SimpleNamespace(layers=[layer], get_seq_length=lambda: 0)
    pairs, states, n = export_tensors(cache)
    assert pairs == [None] and n == 0
    assert states[0]["conv_kernel_size"] == {} and states[0]["recurrent"] == {} and states[0]["conv"][0].equal(layer.conv_states[0])


def test_a_sliding_layer_keeps_its_processed_length_and_a_full_one_its_slots():
    cache = kv_cache_from_tensors([kv(16), kv(30), kv(16), kv(30)], SLIDING, processed_length=30)
    assert [compat.cache_layers(cache)[i].get_seq_length() for i in range(4)] == [30, 30, 30, 30]
    assert not hasattr(cache.layers[1], "cumulative_length") or cache.layers[1].cumulative_length == 30
