"""Cache rebuilds to triage: the four built-ins and a reporter's own function, loaded by name.

A rebuild is a function ``(cache, model, prompt) -> cache`` (the prefix cache it gets is a deep copy).
It may instead return a resume state that carries the logical (processed) length beside the cache: a
`Rebuilt`, or a dict with ``past_key_values`` and ``processed_length``. Built-ins use transformers' own
`DynamicCache.update()` only (an `update()` of two slices appends them) and each layer's own class
(`helpers.families.rebuilds.layer_aware`: sliding layers keep their processed length, linear-attention layers their
conv/recurrent states, so the built-ins work on sliding-window and hybrid caches); nothing of transformers is copied.

`load(spec)` takes a built-in name, ``path/to/file.py:function`` or ``package.module:function`` and
raises `RebuildError` with one line that says what went wrong, before any experiment runs.
"""
from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import StaticCache

from kvresume import compat
from kvresume.ledger import attach_ledger, stored_ledger
from . import patterns
from ..pipeline.run.params import resolve
from kvresume import layers
from ..families import rebuilds as family

RebuildFn = Callable[[Any, torch.nn.Module, Any], Any]
BUILTINS = ("identity", "streaming", "int8", "per_layer", "crop_short", "reused_no_copy")


class RebuildError(RuntimeError):
    """A rebuild that cannot be loaded or that raised; str() is the one line the notebook prints."""


@dataclass
class Rebuilt:
    """What a rebuild gave back: the cache and, when it says so, the logical length."""

    cache: Any
    processed_length: int | None = None
    resume: bool = False  # returned as a resume state: generate() is given positions at processed_length


def _check_layers(cache: Any) -> None:
    """Every layer is one transformers' layer classes can rebuild: K/V attention and/or linear-attention state."""
    for i, layer in enumerate(compat.cache_layers(cache)):
        if not (layers.has_kv(layer) or layers.has_linear_state(layer)):
            raise ValueError(f"the built-in rebuilds copy K/V and linear-attention layers; cache layer {i} "
                             f"({type(layer).__name__}) holds neither: pass your own rebuild")


def _rebuild(cache: Any, model: torch.nn.Module, transform: Any = None) -> Any:
    """`helpers.families.rebuilds.layer_aware`: K/V `update()`d (through `transform`), sliding layers' processed length
    and linear layers' conv/recurrent states carried through transformers' own layer classes."""
    _check_layers(cache)
    if isinstance(cache, StaticCache):  # a StaticCache in, a StaticCache of that size out (through its filled slots)
        size = int(compat.cache_layers(cache)[0].max_cache_len)
        return patterns.as_static(_rebuild(patterns.as_dynamic(cache, model.config), model, transform), model.config, size)
    return family.layer_aware(cache, model.config, transform) if transform else family.layer_aware(cache, model.config)


def identity(cache: Any, model: torch.nn.Module, prompt: Any) -> Any:
    """Notebook 01's rebuild on any cache family: every layer copied through its own class into a config-aware cache."""
    return _rebuild(cache, model)


def _sink_and_window(cache: Any, model: torch.nn.Module, windows: list[int], sink: int) -> Rebuilt:
    """Per attention layer: `update()` the first `sink` stored tokens, then `update()` the last `windows[i]` (appended);
    linear-attention layers keep their state whole. Which slots were kept, control 0's slot comparison measures."""

    def transform(i: int, keys: torch.Tensor, values: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        length = int(keys.shape[-2])
        s = min(sink, length)
        w = max(0, min(windows[i], length - s))
        chunks = [(keys[..., :s, :].clone(), values[..., :s, :].clone())]
        return chunks + ([(keys[..., length - w:, :].clone(), values[..., length - w:, :].clone())] if w else [])

    return Rebuilt(_rebuild(cache, model, transform), int(cache.get_seq_length()))


def streaming(cache: Any, model: torch.nn.Module, prompt: Any, sink: int = 4, window: int = 16) -> Rebuilt:
    """StreamingLLM-style eviction: every attention layer keeps the first `sink` and the last `window` stored tokens."""
    return _sink_and_window(cache, model, [window] * len(compat.cache_layers(cache)), sink)


def layer_windows(n_layers: int, window: int) -> list[int]:
    """PyramidKV-style budgets: layer 0 keeps `window`, the last layer a quarter of it, linear in between."""
    low = max(1, window // 4)
    return [round(window - (window - low) * i / max(n_layers - 1, 1)) for i in range(n_layers)]


def per_layer(cache: Any, model: torch.nn.Module, prompt: Any, sink: int = 4, window: int = 16) -> Rebuilt:
    """Different keep budgets per attention layer (sink + a window shrinking with depth), so layers hold different lengths."""
    return _sink_and_window(cache, model, layer_windows(len(compat.cache_layers(cache)), window), sink)


def _int8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """Per-token symmetric int8: scale = max |x| over head_dim / 127, quantize, dequantize, back to x.dtype."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
    q = torch.clamp(torch.round(xf / scale), -127, 127).to(torch.int8)
    return (q.float() * scale).to(x.dtype)


def int8(cache: Any, model: torch.nn.Module, prompt: Any) -> Any:
    """Per-token symmetric int8 quantize-then-dequantize of K and V (attention layers; linear states copied)."""
    return _rebuild(cache, model, lambda _i, k, v: [(_int8_roundtrip(k), _int8_roundtrip(v))])


def crop_short(cache: Any, model: torch.nn.Module, prompt: Any, short: int = 1) -> Any:
    """`copy.deepcopy(cache)` then `crop(n - short)`: every attention layer's last `short` slots dropped (through the
    layer classes, so sliding and hybrid layers take it; linear states stay whole; a sliding layer's processed length
    goes down with it, as crop() does). An exact prefix, not a compression. A token ledger (kvresume.ledger) travels
    as with copy.deepcopy and crop(): kept whole, read against the shorter cache."""
    out = _rebuild(cache, model, lambda _i, k, v: [(k[..., :-short, :].clone(), v[..., :-short, :].clone())])
    for layer in compat.cache_layers(out):
        if hasattr(layer, "cumulative_length") and layers.has_kv(layer):
            layer.cumulative_length -= short
    return attach_ledger(out, copy.deepcopy(stored_ledger(cache)))


QUESTION_IDS = [10 + b for b in b" Why"]  # reused_no_copy: the other request's question (the tiny models' byte ids)


@torch.no_grad()
def reused_no_copy(cache: Any, model: torch.nn.Module, prompt: Any) -> Any:
    """The prefix-caching recipe without `copy.deepcopy`: another request's `generate()` (the cached prefix + a 4-token
    question, 2 new tokens) ran on this very cache object, so it holds 5 slots of that request after the prefix
    (a StaticCache: as many as its free slots allow)."""
    n = int(cache.get_seq_length())
    static = isinstance(cache, StaticCache)
    room = int(compat.cache_layers(cache)[0].max_cache_len) - n if static else len(QUESTION_IDS) + 1
    question = torch.tensor([QUESTION_IDS[:max(room - 1, 1)]], device=prompt.input_ids.device)
    ids = torch.cat([prompt.input_ids[:, :n], question.expand(prompt.input_ids.shape[0], -1)], dim=1)
    mask = torch.cat([prompt.attention_mask[:, :n], torch.ones_like(ids[:, n:])], dim=1)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                   **{compat.generate_cache_kwarg(model): cache})
    return cache


def builtin(name: str, sink: int = 4, window: int = 16) -> RebuildFn:
    """A built-in rebuild by name (streaming and per_layer get the notebook's S and W)."""
    if name not in BUILTINS:
        raise RebuildError(f"rebuild {name!r}: no built-in of that name (built-ins: {', '.join(BUILTINS)})")
    fn = globals()[name]
    return functools.partial(fn, sink=sink, window=window) if name in ("streaming", "per_layer") else fn


def _import_target(spec: str) -> Any:
    """What 'path/to/file.py:function' or 'package.module:function' names; RebuildError (one line) otherwise."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise RebuildError(f"rebuild {spec!r}: expected a built-in ({', '.join(BUILTINS)}), "
                           "'path/to/file.py:function' or 'package.module:function'")
    head, name, path = f"rebuild {shown(spec)!r}", repr(shown(where + ":")[:-1]), resolve(where)
    if where.endswith(".py") and not path.is_file():
        raise RebuildError(f"{head}: file {name} does not exist "
                           "(relative paths are tried from the working directory, then the kit checkout)")
    try:
        if where.endswith(".py"):
            mod_spec = importlib.util.spec_from_file_location(f"kvkit_rebuild_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(where)
    except Exception as exc:  # noqa: BLE001 - one line instead of a traceback
        raise RebuildError(f"{head}: cannot import {name}: {_one_line(exc)}") from None
    if not hasattr(module, attr):
        raise RebuildError(f"{head}: {name} has no attribute {attr!r}")
    return getattr(module, attr)


_DIRS = re.compile(r"(?:[A-Za-z]:)?[/\\](?:[^\s/\\'\",()]+[/\\])+")


def _one_line(exc: BaseException) -> str:
    """'Type: first line of the message', directories of absolute paths cut (no machine paths in results)."""
    text = str(exc).strip().splitlines()
    return _DIRS.sub("", f"{type(exc).__name__}: {text[0] if text else ''}")[:300]


def load(spec: str, sink: int = 4, window: int = 16) -> RebuildFn:
    """A built-in name, 'path/to/file.py:function' or 'package.module:function' -> a rebuild function."""
    fn = builtin(spec, sink, window) if ":" not in spec else _import_target(spec)
    if not callable(fn):
        raise RebuildError(f"rebuild {shown(spec)!r}: {type(fn).__name__} object is not callable")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError as exc:
        raise RebuildError(f"rebuild {shown(spec)!r}: must take (cache, model, prompt): {exc}") from None
    except ValueError:
        pass  # builtins without a signature: tried when called
    return fn


def label(spec: str) -> str:
    """A short name for tables and the results file: built-in name, else the function's name."""
    return spec if ":" not in spec else spec.rpartition(":")[2]


def as_rebuilt(result: Any, spec: str = "") -> Rebuilt:
    """Whatever rebuild `spec` returned -> Rebuilt (a cache, a Rebuilt, or a resume state: a dict holding a cache)."""
    if isinstance(result, Rebuilt):
        return result
    if isinstance(result, dict) and result.get("past_key_values") is not None:
        length = result.get("processed_length")
        return Rebuilt(result["past_key_values"], None if length is None else int(length), resume=length is not None)
    if hasattr(result, "get_seq_length") and hasattr(result, "layers"):
        return Rebuilt(result)
    raise RebuildError(f"rebuild {spec!r}: the rebuild returned {type(result).__name__}; expected a cache (with "
                       ".layers) or a resume state carrying one")


def apply(fn: RebuildFn, spec: str, cache: Any, model: torch.nn.Module, prompt: Any) -> Rebuilt:
    """Run a rebuild on a deep copy of `cache`; a raise or an unusable result becomes one RebuildError line."""
    try:
        result = fn(copy.deepcopy(cache), model, prompt)
    except Exception as exc:  # noqa: BLE001 - the reporter's function failed: say so in one line
        raise RebuildError(f"rebuild {spec!r} raised {_one_line(exc)}") from None
    return as_rebuilt(result, spec)


def shown(spec: str) -> str:
    """The spec as a results file may show it: an absolute file path is cut to the file name (no machine paths)."""
    where, sep, attr = spec.rpartition(":")
    return f"{Path(where).name}{sep}{attr}" if sep and where.endswith(".py") and Path(where).is_absolute() else spec
