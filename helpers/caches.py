"""The source's cache variants, built exactly the way their names say, and how to describe them."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvresume import compat
from kvresume.compat import cache_from_pairs, kv_pairs
from .compare import tensors_bitwise_equal


@dataclass
class Variant:
    """A cache variant: the cache, how it was built, or why this release cannot build it."""

    name: str
    how: str
    cache: Any = None
    unavailable: str | None = None


def build_variants(prefill_cache: Any, model_config: Any) -> dict[str, Variant]:
    """The source's four variants: A original deep copy, B update() into DynamicCache(),
    C update() into DynamicCache(config=text_config), D the tensor-data constructor."""
    text_config = compat.text_config(model_config)
    variants = {
        "original": Variant("original", "copy.deepcopy(prefill_cache)", copy.deepcopy(prefill_cache)),
        "rebuilt_update": Variant("rebuilt_update", "DynamicCache() + update() per layer",
                                  cache_from_pairs(kv_pairs(prefill_cache))),
        "rebuilt_config": Variant("rebuilt_config", "DynamicCache(config=text_config) + update() per layer",
                                  cache_from_pairs(kv_pairs(prefill_cache), text_config)),
    }
    how = "DynamicCache(ddp_cache_data=kv_pairs, config=text_config)"
    try:
        variants["rebuilt_ctor"] = Variant("rebuilt_ctor", how, compat.dynamic_cache_from_pairs(kv_pairs(prefill_cache), text_config))
    except NotImplementedError as exc:
        variants["rebuilt_ctor"] = Variant("rebuilt_ctor", how, unavailable=str(exc))
    return variants


def describe(cache: Any) -> dict[str, Any]:
    """Layer count, layer classes, reported length, K/V shapes and dtypes of a cache (each kind listed once)."""
    layers = compat.cache_layers(cache)
    shapes = [tuple(None if t is None else tuple(t.shape) for t in compat.layer_kv(layer)) for layer in layers]
    return {
        "n_layers": len(layers),
        "layer_classes": ", ".join(sorted({type(layer).__name__ for layer in layers})),
        "seq_length": int(cache.get_seq_length()),
        "kv_shapes": "; ".join(sorted({str(s) for s in shapes})),
        "kv_dtype": ", ".join(sorted({str(compat.layer_kv(layer)[0].dtype) for layer in layers
                                      if compat.layer_kv(layer)[0] is not None})),
    }


def kv_bitwise_equal(a: Any, b: Any) -> bool:
    """Every layer's keys and values identical in shape, dtype and bits."""
    la, lb = compat.cache_layers(a), compat.cache_layers(b)
    if len(la) != len(lb):
        return False
    return all(tensors_bitwise_equal(x, y) for ka, kb in zip(la, lb)
               for x, y in zip(compat.layer_kv(ka), compat.layer_kv(kb)))


def fresh_copy(variant: Variant) -> Any:
    """A deep copy so that one continuation never mutates the cache the next one starts from."""
    if variant.cache is None:
        raise RuntimeError(f"variant {variant.name} is unavailable: {variant.unavailable}")
    return copy.deepcopy(variant.cache)


def _storages(cache: Any) -> set[int]:
    """Addresses of the (non-empty) storages behind the K/V tensors of a cache: a view shares its base's storage."""
    return {t.untyped_storage().data_ptr() for layer in compat.cache_layers(cache) for t in compat.layer_kv(layer)
            if t is not None and t.untyped_storage().nbytes()}


def shares_storage(a: Any, b: Any) -> bool:
    """Whether any K/V tensor of `a` lives in a storage that holds a K/V tensor of `b` (aliasing).

    Equality of a rebuilt cache with its original means nothing if they share storage.
    """
    return bool(_storages(a) & _storages(b))
