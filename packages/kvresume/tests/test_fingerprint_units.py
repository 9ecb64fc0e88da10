"""kvresume.fingerprint.window_prints on a hand-made sliding layer: the slots it still shows, zeros for those it no
longer shows (one, or none, before its window), nothing where it shows none."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvresume import fingerprint as fp


def sliding(shown: int):
    keys = torch.arange(1 * 2 * shown * 10, dtype=torch.float32).view(1, 2, shown, 10)
    return SimpleNamespace(layers=[SimpleNamespace(keys=keys, is_sliding=True)]), keys


def test_a_window_shows_its_last_slots_and_zeros_before_them():
    cache, keys = sliding(3)  # the cache holds 5 slots; the window shows slots 2, 3, 4
    prints = keys[:, 0, :, :fp.WIDTH]
    assert torch.equal(fp.window_prints(cache, 0, 2, 5), prints)
    assert torch.equal(fp.window_prints(cache, 0, 3, 5), prints[:, 1:])
    got = fp.window_prints(cache, 0, 1, 5)
    assert got.shape == (1, 4, fp.WIDTH) and torch.equal(got[:, 1:], prints) and not got[:, 0].any()
    got = fp.window_prints(cache, 0, 0, 5)
    assert got.shape == (1, 5, fp.WIDTH) and torch.equal(got[:, 2:], prints) and not got[:, :2].any()
    assert fp.window_prints(cache, 0, 2, 5).data_ptr() != keys.data_ptr()  # a copy
    assert fp.window_start(cache, 0, 5) == 2


def test_slot_prints_only_of_a_layer_that_holds_them():
    keys = torch.zeros(1, 2, 3, 10)
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=keys), SimpleNamespace(), SimpleNamespace(keys=None)])
    assert fp.slot_prints(cache, 0, 1, 3).shape == (1, 2, fp.WIDTH)
    assert fp.slot_prints(cache, 0, 0, 4) is None and fp.slot_prints(cache, None, 0, 1) is None
    assert fp.slot_prints(cache, 3, 0, 1) is None and fp.slot_prints(cache, 1, 0, 1) is None
    assert fp.slot_prints(cache, 2, 0, 1) is None
    assert fp.slot_prints(SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(2, 3))]), 0, 0, 1) is None


def test_a_window_that_shows_nothing():
    cache, _ = sliding(0)
    assert fp.window_prints(cache, 0, 0, 4) is None


def test_a_quantized_layer_cannot_be_followed():
    class QuantizedLayer:
        _quantized_keys = None

    class ResidualLayer:
        residual_length = 4

    for layer in (QuantizedLayer(), ResidualLayer()):
        why = fp.unfollowed(SimpleNamespace(layers=[SimpleNamespace(keys=None), layer]))
        assert why == (f"{type(layer).__name__} keeps its slots quantized (only the last residual_length ones as keys), "
                       "and re-quantizes them as it grows: no slot's content can be fingerprinted")
    assert fp.unfollowed(SimpleNamespace(layers=[SimpleNamespace(keys=None)])) is None


def test_a_layer_that_does_not_say_it_slides_shows_every_slot():
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(1, 1, 3, 4))])
    assert fp.window_start(cache, 0, 5) is None


def lay(dim=4, **extra):
    return SimpleNamespace(keys=torch.zeros(*(1,) * (dim - 2), 2, 4) if dim else None, **extra)


def test_the_print_layer_is_the_last_full_one_else_the_last_sliding_one():
    cache = SimpleNamespace(layers=[lay(), lay(is_sliding=True), lay(), lay(is_sliding=True), lay(dim=3), lay(dim=0)])
    assert fp.print_layer(cache) == 2
    assert fp.print_layer(SimpleNamespace(layers=[lay(is_sliding=True), lay(is_sliding=True), lay(dim=3)])) == 1
    assert fp.print_layer(SimpleNamespace(layers=[lay(dim=3)])) is None
    assert fp.print_layer(SimpleNamespace(self_attention_cache=SimpleNamespace(layers=[lay(), lay()]), layers=[])) == 1


def test_the_known_layer_is_remembered_while_it_holds_4d_keys():
    inner = SimpleNamespace(layers=[lay(), lay()])
    cache = SimpleNamespace(self_attention_cache=inner, layers=[])
    assert fp.known_layer(cache) == 1 and vars(inner)[fp.LAYER_ATTR] == 1 and fp.LAYER_ATTR not in vars(cache)
    vars(inner)[fp.LAYER_ATTR] = 0
    assert fp.known_layer(cache) == 0  # remembered, not searched again
    for gone in (2, 5):  # past the layers: searched again
        vars(inner)[fp.LAYER_ATTR] = gone
        assert fp.known_layer(cache) == 1 and vars(inner)[fp.LAYER_ATTR] == 1
    for changed in (lay(dim=0), lay(dim=3), SimpleNamespace()):
        plain = SimpleNamespace(layers=[changed, lay()])
        vars(plain)[fp.LAYER_ATTR] = 0
        assert fp.known_layer(plain) == 1
    none = SimpleNamespace(layers=[lay(dim=3)])
    assert fp.known_layer(none) is None and fp.LAYER_ATTR not in vars(none)
    assert fp.known_layer(SimpleNamespace(layers=None)) is None


def test_the_grown_layer_is_one_whose_keys_grow_with_the_writes():
    plain = lay()
    cache = SimpleNamespace(layers=[plain, lay(max_cache_len=8), lay(residual_length=2), lay(is_sliding=True),
                                    lay(is_sliding=False)])
    assert fp.grown_layer(cache, 0) is plain and fp.grown_layer(cache, None) is None
    assert [fp.grown_layer(cache, i) for i in (1, 2, 3)] == [None, None, None]
    assert fp.grown_layer(cache, 4) is cache.layers[4]
    assert fp.grown_layer(SimpleNamespace(self_attention_cache=SimpleNamespace(layers=[plain])), 0) is plain
