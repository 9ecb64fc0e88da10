"""DynamicCache offloading on a hybrid (linear-attention + full-attention) model: the schedule recorder.

`record_schedule` (everywhere): which cache layers the offloading path actually offloads and prefetches, per forward
call of the kit's `.cpu()` greedy loop (helpers.offload.loops.greedy_run). The cache's own `offload`/`prefetch`/
`update*` methods are wrapped on the instance (the originals still run) under helpers.offload.streams' recording
stand-ins for the CUDA stream API, and helpers.offload.tracking.track enters every copy into the stream log.

The stream model and the race replay: helpers.offload.streams, helpers.offload.replay; the GPU experiment:
helpers.offload.gpu; the installed source and the real path unpatched: helpers.offload.source; figures: helpers.offload.plots.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from kvresume import compat
from ..hybrid import layer_types as config_layer_types
from .loops import GreedyRun, greedy_run
from .standins import recording_streams
from .states import layer_states
from .tracking import _layer_arg, instrument as wrap_methods, track

LINEAR_TYPES = ("linear_attention",)
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
MOVES = ("offload", "prefetch")
CACHE_METHODS = ("offload", "prefetch", "update", "update_conv_state", "update_recurrent_state")


# --- the recorder ---------------------------------------------------------------------------------

def _held_states(layer: Any) -> tuple[list[str], int]:
    """Names and total bytes of the state tensors a cache layer holds right now (what offload would move)."""
    held = layer_states(0, layer)
    names = [name.split()[2].split("[")[0] for name in held]  # "layer 0 conv_states[1]" -> "conv_states"
    return names, sum(t.numel() * t.element_size() for _, _, t in held.values())


@dataclass
class ScheduleRecord:
    """Every offload/prefetch (and cache update) the offloading path made, per forward call."""

    layer_types: list[str]
    layer_classes: list[str]
    calls: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    stream_calls: dict[str, int] = field(default_factory=dict)
    run: GreedyRun | None = field(default=None, repr=False)
    streams: Any = field(default=None, repr=False)  # the helpers.offload.streams.StreamLog of the run

    def begin(self, label: str) -> None:
        self.calls.append(label)

    def log(self, level: str, method: str, layer_idx: int, layer: Any = None) -> None:
        held, nbytes = _held_states(layer) if layer is not None else ([], 0)
        kind = self.layer_types[layer_idx] if 0 <= layer_idx < len(self.layer_types) else "?"
        self.events.append({"order": len(self.events), "call": self.calls[-1] if self.calls else "(none)",
                            "call_index": len(self.calls) - 1, "level": level, "method": method,
                            "layer": layer_idx, "layer_type": kind, "held_states": "+".join(held) or "-",
                            "held_bytes": nbytes})

    def table(self) -> Any:
        """All events as a DataFrame (one row per wrapped method call)."""
        import pandas as pd

        cols = ["order", "call", "call_index", "level", "method", "layer", "layer_type", "held_states", "held_bytes"]
        return pd.DataFrame(self.events, columns=cols)

    def counts(self, method: str, level: str = "layer") -> Any:
        """Layer x forward-call matrix: how often `method` ran on each layer in each call."""
        import pandas as pd

        index = [f"{i} {t}" for i, t in enumerate(self.layer_types)]
        matrix = pd.DataFrame(0, index=index, columns=self.calls)
        for e in self.events:
            if e["method"] == method and e["level"] == level and 0 <= e["layer"] < len(index):
                matrix.iloc[e["layer"], e["call_index"]] += 1
        return matrix

    def per_layer(self) -> Any:
        """One row per layer: its type, cache class and how often each wrapped method ran on it."""
        import pandas as pd

        rows = []
        for i, (kind, cls) in enumerate(zip(self.layer_types, self.layer_classes)):
            ev = [e for e in self.events if e["layer"] == i]
            row = {"layer": i, "layer_type": kind, "cache_layer_class": cls}
            for m in MOVES:
                row[f"layer.{m}"] = sum(e["method"] == m and e["level"] == "layer" for e in ev)
                row[f"bytes_{m}"] = sum(e["held_bytes"] for e in ev if e["method"] == m and e["level"] == "layer")
            for m in CACHE_METHODS:  # cache-level calls name the layer index they were asked for
                label = "cache.prefetch(requested)" if m == "prefetch" else f"cache.{m}"
                row[label] = sum(e["method"] == m and e["level"] == "cache" for e in ev)
            rows.append(row)
        return pd.DataFrame(rows)

    def verdict_inputs(self) -> dict[str, Any]:
        """The numbers offload.linear_layers_never_moved is decided from."""
        table = self.per_layer()
        linear = table[table.layer_type.isin(LINEAR_TYPES)]
        attention = table[table.layer_type.isin(ATTENTION_TYPES)]
        offloads = self.counts("offload")
        attn_rows = [f"{i} {t}" for i, t in enumerate(self.layer_types) if t in ATTENTION_TYPES]
        return {
            "n_calls": len(self.calls),
            "linear_layers": linear.layer.tolist(),
            "attention_layers": attention.layer.tolist(),
            "linear_offloads": int(linear["layer.offload"].sum()),
            "linear_prefetches": int(linear["layer.prefetch"].sum()),
            "attention_offloads": int(attention["layer.offload"].sum()),
            "attention_prefetches": int(attention["layer.prefetch"].sum()),
            "attention_bytes_offloaded": int(attention["bytes_offload"].sum()),
            "every_attention_layer_offloaded_every_call": bool(len(attn_rows) > 0 and (offloads.loc[attn_rows] > 0).all().all()),
            "linear_state_updates": int(linear["cache.update_conv_state"].sum() + linear["cache.update_recurrent_state"].sum()),
            "linear_kv_updates": int(linear["cache.update"].sum()),
            "stream_stand_in_calls": dict(self.stream_calls),
        }


@contextmanager
def instrument(cache: Any, layer_types: list[str]) -> Iterator[ScheduleRecord]:
    """Record, on this cache instance, every layer's offload/prefetch and every cache-level call of CACHE_METHODS.

    The originals still run (each wrapper calls them); the instance attributes are removed on exit.
    """
    record = ScheduleRecord(list(layer_types), [type(layer).__name__ for layer in compat.cache_layers(cache)])

    def layer_hook(idx: int, layer: Any, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            record.log("layer", method, idx, layer)
            return original(*args, **kwargs)
        return wrapper

    on_cache = lambda method, args, kwargs: record.log("cache", method, _layer_arg(method, args, kwargs))  # noqa: E731
    with wrap_methods(cache, on_cache, layer_hook, CACHE_METHODS, MOVES):
        yield record


def record_schedule(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 4) -> ScheduleRecord:
    """Greedy run with `DynamicCache(config=model.config, offloading=True)`, instrumented, under the
    recording stream stand-ins (helpers.offload.streams): `record.streams` holds every copy, wait and read."""
    types = config_layer_types(model.config)
    with recording_streams() as log:
        cache = compat.dynamic_cache(model.config, offloading=True)
        with instrument(cache, types) as record, track(cache, log):
            def begin(label: str) -> None:
                record.begin(label)
                log.begin(label, host_synced=True)
            record.run = greedy_run(model, ids, n_steps, cache=cache, before_call=begin)
    record.stream_calls, record.streams = dict(log.calls), log
    return record


