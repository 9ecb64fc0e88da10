"""kvresume.layers on stand-ins: a linear-attention layer's conv and recurrent states copied through the target's own
update methods (each layer index, its kernel size) with its own token count, a sliding layer's processed length."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvresume import layers


class Linear:
    """A linear-attention layer's state as the target sees it: what its update methods were called with."""

    def __init__(self, count=None):
        self.conv_states, self.recurrent_states, self.calls = {}, {}, []
        if count is not None:
            self.cumulative_length_linear = torch.tensor(count)

    def update_conv_state(self, state, idx, conv_kernel_size=None):
        self.calls.append(("conv", idx, conv_kernel_size, state))

    def update_recurrent_state(self, state, idx):
        self.calls.append(("recurrent", idx, state))


def test_linear_states_are_copied_per_layer_index_with_the_kernel_size_and_the_own_count():
    conv0, conv2, rec0, rec1 = (torch.full((1, 2), float(i)) for i in range(4))
    source = SimpleNamespace(conv_states={0: conv0, 1: None, 2: conv2}, conv_kernel_size={0: 4, 2: 3},
                             recurrent_states={0: rec0, 1: rec1}, cumulative_length_linear=torch.tensor(9))
    target = Linear(count=0)
    layers.copy_linear_state(source, target)
    assert [c[:3] if c[0] == "conv" else c[:2] for c in target.calls] == [
        ("conv", 0, 4), ("recurrent", 0), ("recurrent", 1), ("conv", 2, 3)]
    states = [c[-1] for c in target.calls]
    assert all(torch.equal(a, b) for a, b in zip(states, (conv0, rec0, rec1, conv2)))
    assert all(s.data_ptr() != b.data_ptr() for s, b in zip(states, (conv0, rec0, rec1, conv2)))  # copies
    assert int(target.cumulative_length_linear) == 9


def test_a_sliding_layers_processed_length_is_carried_where_both_keep_one():
    target = SimpleNamespace(cumulative_length=0)
    layers.copy_processed_length(SimpleNamespace(cumulative_length=7), target)
    assert target.cumulative_length == 7 and type(target.cumulative_length) is int
    count = torch.tensor(5)
    layers.copy_processed_length(SimpleNamespace(cumulative_length=count), target)
    assert torch.equal(target.cumulative_length, count) and target.cumulative_length is not count
    layers.copy_processed_length(SimpleNamespace(), target)
    untouched = SimpleNamespace()
    layers.copy_processed_length(SimpleNamespace(cumulative_length=3), untouched)
    assert int(target.cumulative_length) == 5 and not hasattr(untouched, "cumulative_length")


class KV:
    def __init__(self, n, keys, values, **linear):
        self.keys, self.values, self.n = keys, values, n
        self.__dict__.update(linear)

    def get_seq_length(self):
        return self.n


class Other(KV):
    pass


def kv(n=2, shift=0.0, **linear):
    return KV(n, torch.arange(4.0).view(1, 1, 2, 2), torch.arange(4.0).view(1, 1, 2, 2) + shift, **linear)


def test_layers_are_equal_by_class_length_and_bits():
    assert layers.layer_state_equal(kv(), kv())
    assert not layers.layer_state_equal(kv(), kv(shift=1.0))  # the values differ, the keys alike
    b = kv()
    b.keys = b.keys + 1
    assert not layers.layer_state_equal(kv(), b)
    assert not layers.layer_state_equal(kv(n=2), kv(n=3))  # the length reported differs, the bits alike
    other = Other(2, kv().keys, kv().values)
    assert not layers.layer_state_equal(kv(), other)
    assert layers.cache_state_equal(SimpleNamespace(layers=[kv(), kv()]), SimpleNamespace(layers=[kv(), kv()]))
    assert not layers.cache_state_equal(SimpleNamespace(layers=[kv(), kv()]), SimpleNamespace(layers=[kv()]))
    assert not layers.cache_state_equal(SimpleNamespace(layers=[kv()]), SimpleNamespace(layers=[kv(shift=2.0)]))


def linear(conv=0.0, rec=0.0, count=None, keys=(0,)):
    extra = {} if count is None else {"cumulative_length_linear": torch.tensor(count)}
    return kv(conv_states={k: torch.full((2,), conv) for k in keys},
              recurrent_states={k: torch.full((2,), rec) for k in keys}, **extra)


def test_linear_layers_are_equal_by_their_states_and_own_count():
    assert layers.layer_state_equal(linear(), linear())
    assert layers.layer_state_equal(linear(count=4), linear(count=4))
    assert not layers.layer_state_equal(linear(conv=1.0), linear())
    assert not layers.layer_state_equal(linear(rec=1.0), linear())
    assert not layers.layer_state_equal(linear(count=4), linear(count=5))
    assert not layers.layer_state_equal(linear(count=4), linear())
    assert not layers.layer_state_equal(linear(keys=(0, 1)), linear(keys=(0,)))
    a, b = linear(), linear()
    b.recurrent_states[0] = None
    assert not layers.layer_state_equal(a, b)
    a.recurrent_states[0] = None
    assert layers.layer_state_equal(a, b)


def test_a_layer_that_does_not_say_is_not_sliding():
    assert layers.is_sliding(SimpleNamespace()) is False and layers.is_sliding(SimpleNamespace(is_sliding=1)) is True
