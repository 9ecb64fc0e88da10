"""Copy tracking of the offloading path under the stream model, and the 5.20.0 ordering edge.

`track(cache, log)` wraps, on the cache instance only, every layer's `offload` / `prefetch` / `update`
and the cache's three update methods (the originals always run): each real copy or compute the
installed `Cache.update` makes is entered into a `streams.StreamLog` with the buffer it reads and the
buffer it writes. Host buffers are modelled per layer: on CPU the layer's `.to()` calls are no-ops, so
a layer's location (device or host) is tracked here, as the real `prefetch` checks it
(`keys.device != self.device`). The lag unit of the replay is the cache-update call (see helpers.offload.streams).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Callable, Iterator
from unittest import mock

import torch

from kvresume import compat
from .streams import StreamLog

UPDATE_METHODS = ("update", "update_conv_state", "update_recurrent_state")


def device_buffer(layer: int) -> str:
    return f"layer {layer} device K/V"


def host_buffer(layer: int) -> str:
    return f"layer {layer} host K/V"


def _kv(layer: Any) -> list[torch.Tensor]:
    """The layer's non-empty K/V tensors (none before its first update, none on a linear-attention layer)."""
    keys, values = compat.layer_kv(layer) if getattr(layer, "is_initialized", False) else (None, None)
    return [t for t in (keys, values) if isinstance(t, torch.Tensor) and t.numel() > 0]


def _layer_arg(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The layer index a cache call was made for (`update(k, v, layer_idx)`, `update_*_state(x, layer_idx)`,
    `offload(layer_idx, ...)`, `prefetch(layer_idx, ...)`)."""
    if "layer_idx" in kwargs:
        return int(kwargs["layer_idx"])
    pos = {"update": 2, "offload": 0, "prefetch": 0}.get(method, 1)
    return int(args[pos]) if len(args) > pos else -1


def _patch(obj: Any, method: str, wrapper_of: Callable[[Callable[..., Any]], Callable[..., Any]],
           undo: ExitStack) -> None:
    """Shadow obj.method by an instance attribute wrapping the current one (mock.patch.object), undone with `undo`."""
    current = getattr(obj, method, None)
    if callable(current):
        undo.enter_context(mock.patch.object(obj, method, wrapper_of(current)))


def _around(obj: Any, method: str, undo: ExitStack, before: Callable[..., None] | None = None,
            after: Callable[[], None] | None = None) -> None:
    """Shadow obj.method (_patch): `before(*args, **kwargs)` runs before the original, `after()` after it."""
    def wrapper_of(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before(*args, **kwargs)
            out = original(*args, **kwargs)
            if after is not None:
                after()
            return out
        return wrapper
    _patch(obj, method, wrapper_of, undo)


LayerHook = Callable[[int, Any, str, Callable[..., Any]], Callable[..., Any]]


@contextmanager
def instrument(cache: Any, on_update: Callable[[str, tuple[Any, ...], dict[str, Any]], None], layer_hook: LayerHook,
               cache_methods: tuple[str, ...] = UPDATE_METHODS,
               layer_methods: tuple[str, ...] = ("offload", "prefetch", "update")) -> Iterator[None]:
    """Shadow, on the cache instance only, its `cache_methods` (`on_update(method, args, kwargs)` runs before each) and
    every layer's `layer_methods` (`layer_hook(idx, layer, method, original)` returns the wrapper)."""
    with ExitStack() as undo:
        for method in cache_methods:
            _around(cache, method, undo, before=lambda *args, m=method, **kwargs: on_update(m, args, kwargs))
        for idx, layer in enumerate(compat.cache_layers(cache)):
            for method in layer_methods:
                _patch(layer, method, lambda original, i=idx, l=layer, m=method: layer_hook(i, l, m, original), undo)
        yield


def _stale(layer: Any, held: tuple[Any, Any] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a stale read of the layer's host buffer returns: what the pool's block held before (helpers.offload.arms),
    else zeros (a freshly allocated pinned buffer)."""
    if held is not None and held[0] is not None and held[1] is not None:
        return held[0].clone(), held[1].clone()
    return torch.zeros_like(layer.keys), torch.zeros_like(layer.values)


@contextmanager
def track(cache: Any, log: StreamLog, lag: int | None = None, pool: Any = None) -> Iterator[StreamLog]:
    """Enter every copy/compute of the offloading path into `log`; with `lag`, serve stale reads (zeros, or with a
    `pool.SimPool` what the reused pinned block held before)."""
    where: dict[int, str] = {}
    held: dict[int, tuple[Any, Any]] = {}

    def on_update(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        log.update_index += 1
        log.update_layer = _layer_arg(method, args, kwargs)

    def layer_hook(idx: int, layer: Any, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if method == "update":
                reads = device_buffer(idx) if device_buffer(idx) in log.writers else None
                log.access("layer update (compute)", idx, reads, device_buffer(idx))
                where[idx] = "device"
                return original(*args, **kwargs)
            out = original(*args, **kwargs)
            if method == "offload" and _kv(layer):
                log.access("offload copy (device->host)", idx, device_buffer(idx), host_buffer(idx))
                where[idx] = "host"
                if pool is not None:
                    keys, values = compat.layer_kv(layer)
                    held[idx] = (pool.fill(idx, "keys", keys), pool.fill(idx, "values", values))
            elif method == "prefetch" and _kv(layer) and where.get(idx) == "host":
                event = log.access("prefetch copy (host->device)", idx, host_buffer(idx), device_buffer(idx))
                where[idx] = "device"
                if lag and event["read_ordered"] is False and event["calls_since_producer"] < lag:
                    layer.keys, layer.values = _stale(layer, held.get(idx))
                    event["served_stale"] = True
            return out
        return wrapper

    with instrument(cache, on_update, layer_hook):
        yield log


@contextmanager
def ordering_edge(cache: Any) -> Iterator[Any]:
    """The 5.20.0 edge on this cache instance: `prefetch` first makes the prefetch stream wait for the
    default stream (`prefetch_stream.wait_stream(torch.cuda.default_stream())`), then runs as installed."""
    with ExitStack() as undo:
        _around(cache, "prefetch", undo,
                before=lambda *a, **k: cache.prefetch_stream.wait_stream(torch.cuda.default_stream()))
        yield cache


def device_event() -> Any:
    """The offload-event arm's event: a `torch.Event` on the CUDA device, which any stream kind really waits for."""
    return torch.Event(device="cuda")


def cuda_event() -> Any:
    """`torch.cuda.Event()`: what a `torch.Stream` (5.17.0's prefetch stream with torch >= 2.7) does NOT wait for
    (helpers.offload.streams, CUDA_EVENT); the device probe's control and the tests' no-op form."""
    return torch.cuda.Event()


@contextmanager
def offload_event_edge(cache: Any) -> Iterator[Any]:
    """Host-buffer-only fix arm: an event (`device_event`, a torch.Event) recorded after each layer's offload copy (on
    the stream the offload runs on, the default stream) and waited by the prefetch stream before that layer's prefetch."""
    events: dict[int, Any] = {}

    def record(idx: int) -> None:
        events[idx] = device_event()
        events[idx].record(torch.cuda.current_stream())

    def wait(idx: int) -> None:
        if idx in events:
            cache.prefetch_stream.wait_event(events[idx])

    with ExitStack() as undo:
        for idx, layer in enumerate(compat.cache_layers(cache)):
            _around(layer, "offload", undo, after=lambda idx=idx: record(idx))
            _around(layer, "prefetch", undo, before=lambda *a, idx=idx, **k: wait(idx))
        yield cache


@contextmanager
def record_stream_edge(cache: Any) -> Iterator[Any]:
    """Reuse-only fix arm: after each layer's prefetch, `keys/values.record_stream(default stream)`, so the
    allocator does not reuse a prefetched block before the default stream's reads of it are done (under the recording
    stand-ins, entered into the stream log instead)."""

    def keep(idx: int, layer: Any) -> None:
        held = _kv(layer)
        default = torch.cuda.default_stream() if held else None
        for tensor in held:
            if isinstance(getattr(default, "log", None), StreamLog):
                default.log.record_stream(default, idx, f"{device_buffer(idx)} used on {default.name}")
            else:
                tensor.record_stream(default)

    with ExitStack() as undo:
        for idx, layer in enumerate(compat.cache_layers(cache)):
            _around(layer, "prefetch", undo, after=lambda idx=idx, layer=layer: keep(idx, layer))
        yield cache


EDGES = {"none": nullcontext, "5.20.0 edge": ordering_edge, "offload event": offload_event_edge,
         "record_stream": record_stream_edge}
