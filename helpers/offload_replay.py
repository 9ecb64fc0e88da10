"""The offloading path under the stream model: the ordering check, the 5.20.0 edge, and the race replay.

`track(cache, log)` wraps, on the cache instance only, every layer's `offload` / `prefetch` / `update`
and the cache's three update methods (the originals always run): each real copy or compute the
installed `Cache.update` makes is entered into a `streams.StreamLog` with the buffer it reads and the
buffer it writes. Host buffers are modelled per layer: on CPU the layer's `.to()` calls are no-ops, so
a layer's location (device or host) is tracked here, as the real `prefetch` checks it
(`keys.device != self.device`). The lag unit of the replay is the cache-update call (see helpers.streams).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import compat
from .compare import noise_floor
from .offload import Decision, GreedyRun, greedy_run, step_table
from .streams import STALE_VALUE, StreamLog, recording_streams

UPDATE_METHODS = ("update", "update_conv_state", "update_recurrent_state")
# transformers issue #48947, Qwen3.8-27B, bf16, batch 2 x 4096 random tokens
REPORT_VALUES = {"prefill max |logit diff|": 0.0, "decode 1 max |logit diff|": 2.1171875}


def device_buffer(layer: int) -> str:
    return f"layer {layer} device K/V"


def host_buffer(layer: int) -> str:
    return f"layer {layer} host K/V"


def _holds_kv(layer: Any) -> bool:
    keys, _ = compat.layer_kv(layer) if getattr(layer, "is_initialized", False) else (None, None)
    return isinstance(keys, torch.Tensor) and keys.numel() > 0


def _patch(obj: Any, method: str, wrapper_of: Callable[[Callable[..., Any]], Callable[..., Any]],
           undo: list[tuple[Any, str, Any]]) -> None:
    """Shadow obj.method by an instance attribute wrapping the current one; `undo` restores it."""
    current = getattr(obj, method, None)
    if current is None or not callable(current):
        return
    undo.append((obj, method, vars(obj).get(method)))
    setattr(obj, method, wrapper_of(current))


@contextmanager
def _patched() -> Iterator[list[tuple[Any, str, Any]]]:
    undo: list[tuple[Any, str, Any]] = []
    try:
        yield undo
    finally:
        for obj, method, previous in reversed(undo):
            if previous is None:
                vars(obj).pop(method, None)
            else:
                setattr(obj, method, previous)


@contextmanager
def track(cache: Any, log: StreamLog, lag: int | None = None) -> Iterator[StreamLog]:
    """Enter every copy/compute of the offloading path into `log`; with `lag`, serve stale reads."""
    where: dict[int, str] = {}

    def counted(method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrapper_of(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                log.update_index += 1
                return original(*args, **kwargs)
            return wrapper
        return wrapper_of

    def layer_op(idx: int, layer: Any, method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrapper_of(original: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if method == "update":
                    reads = device_buffer(idx) if device_buffer(idx) in log.writers else None
                    log.access("layer update (compute)", idx, reads, device_buffer(idx))
                    where[idx] = "device"
                    return original(*args, **kwargs)
                out = original(*args, **kwargs)
                if method == "offload" and _holds_kv(layer):
                    log.access("offload copy (device->host)", idx, device_buffer(idx), host_buffer(idx))
                    where[idx] = "host"
                elif method == "prefetch" and _holds_kv(layer) and where.get(idx) == "host":
                    event = log.access("prefetch copy (host->device)", idx, host_buffer(idx), device_buffer(idx))
                    where[idx] = "device"
                    if lag and event["read_ordered"] is False and event["calls_since_producer"] < lag:
                        layer.keys, layer.values = torch.zeros_like(layer.keys), torch.zeros_like(layer.values)
                        event["served_stale"] = True
                return out
            return wrapper
        return wrapper_of

    with _patched() as undo:
        for method in UPDATE_METHODS:
            _patch(cache, method, counted(method), undo)
        for idx, layer in enumerate(compat.cache_layers(cache)):
            for method in ("offload", "prefetch", "update"):
                _patch(layer, method, layer_op(idx, layer, method), undo)
        yield log


@contextmanager
def ordering_edge(cache: Any, device: str | torch.device | None = None) -> Iterator[Any]:
    """The 5.20.0 edge on this cache instance: `prefetch` first makes the prefetch stream wait for the
    default stream (`prefetch_stream.wait_stream(torch.cuda.default_stream(device))`), then runs as installed."""
    device = torch.device(device) if device is not None else None
    with _patched() as undo:
        def wrapper_of(original: Callable[..., Any]) -> Callable[..., Any]:
            def prefetch(*args: Any, **kwargs: Any) -> Any:
                cache.prefetch_stream.wait_stream(torch.cuda.default_stream(device))
                return original(*args, **kwargs)
            return prefetch
        _patch(cache, "prefetch", wrapper_of, undo)
        yield cache


@dataclass
class ReplayRun:
    """One greedy run of the installed offloading path under the recording stand-ins."""

    lag: int
    fix: bool
    run: GreedyRun
    log: StreamLog

    def stale(self) -> list[dict[str, Any]]:
        return [r for r in self.log.reads() if r["served_stale"]]


def replay_run(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, lag: int = 0, fix: bool = False,
               host_synced: bool = True) -> ReplayRun:
    """Greedy run with DynamicCache(offloading=True) under recording stand-ins (lag 0: nothing stale).

    `fix`: add the 5.20.0 ordering edge; `host_synced`: the greedy loop's `.cpu()` of the logits is a
    host wait for the default stream between calls.
    """
    with recording_streams() as log:
        cache = compat.dynamic_cache(model.config, offloading=True)
        with track(cache, log, lag=lag), (ordering_edge(cache, ids.device) if fix else nullcontext()):
            run = greedy_run(model, ids, n_steps, cache=cache, before_call=lambda label: log.begin(label, host_synced))
    run.cache = None
    return ReplayRun(lag, fix, run, log)


def reads_table(log: StreamLog) -> Any:
    """The recorded reads: call, layer, reading stream, producing stream, ordered?"""
    import pandas as pd

    cols = ["call", "layer", "reader", "reads", "reading_stream", "producer", "producing_stream", "producer_call",
            "calls_since_producer", "ordered", "served_stale"]
    return pd.DataFrame(log.reads(), columns=cols)


def ordering_decision(log: StreamLog) -> Decision:
    """offload.prefetch_reads_unordered_copy from the record: some prefetch reads a host buffer whose
    device->host copy is not ordered before it."""
    reads = [r for r in log.reads() if r["reader"].startswith("prefetch copy")]
    bad = [r for r in reads if not r["ordered"]]
    waits = [e["detail"] for e in log.events if e["op"] == "wait_stream"]
    evidence = {"prefetch_reads": len(reads), "unordered_prefetch_reads": len(bad),
                "unordered": [{k: r[k] for k in ("call", "layer", "reading_stream", "producing_stream",
                                                 "producer_call", "calls_since_producer")} for r in bad],
                "wait_stream_calls": {w: waits.count(w) for w in sorted(set(waits))},
                "stream_api_calls": dict(log.calls)}
    first = bad[0] if bad else None
    why = (f"{len(bad)} of {len(reads)} prefetch reads of a host buffer are not ordered after the copy that fills it; "
           f"first: {first['call']}, layer {first['layer']} read on {first['reading_stream']}, copy on "
           f"{first['producing_stream']} ({first['calls_since_producer']} cache-update calls earlier)" if first else
           f"all {len(reads)} prefetch reads are ordered after their device->host copy (waits: {evidence['wait_stream_calls']})")
    return Decision(bool(bad) and len(reads) > 0, evidence, why,
                    deciding={"unordered prefetch reads": len(bad), "prefetch reads": len(reads)})


@dataclass
class Replay:
    """The race replay: offloading=False twice (the floor), then the offloading path at each lag."""

    reference: GreedyRun
    again: GreedyRun
    dtype: torch.dtype
    runs: list[ReplayRun] = field(default_factory=list)

    def floors(self) -> list[Any]:
        return [noise_floor(r, [a], self.dtype, what="offloading=False run twice")
                for r, a in zip(self.reference.logits, self.again.logits)]

    def table(self) -> Any:
        """Per lag (and fix) and step: max |logit diff| vs offloading=False, bitwise, beyond the floor."""
        import pandas as pd

        frames = []
        for rr in self.runs:
            steps = step_table(self.reference, rr.run)
            floors = self.floors()
            steps["noise_threshold"] = [f.threshold for f in floors]
            steps["differs"] = [f.differs(v) for f, v in zip(floors, steps.max_abs_diff)]
            steps.insert(0, "variant", f"lag {rr.lag}" + (" + 5.20.0 edge" if rr.fix else ""))
            steps.insert(1, "lag", rr.lag)
            steps.insert(2, "fix", rr.fix)
            steps.insert(3, "stale_reads", len(rr.stale()))
            steps.insert(4, "unordered_reads", len(rr.log.unordered_reads()))
            frames.append(steps)
        return pd.concat(frames, ignore_index=True)


def race_replay(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, lags: list[int], dtype: torch.dtype,
                fix_lag: int | None = None) -> Replay:
    """The report's experiment against offloading=False at each lag, plus the 5.20.0 edge at `fix_lag`."""
    replay = Replay(greedy_run(model, ids, n_steps), greedy_run(model, ids, n_steps), dtype)
    replay.runs = [replay_run(model, ids, n_steps, lag) for lag in lags]
    if fix_lag is not None:
        replay.runs.append(replay_run(model, ids, n_steps, fix_lag, fix=True))
    return replay


def replay_decision(table: Any) -> Decision:
    """offload.race_replay_drifts_like_report: at every lag where every unordered read is served stale, the
    prefill is bitwise equal and every decode step differs beyond the noise floor; with no stale read (lag 0,
    the 5.20.0 edge) every step is bitwise equal. Lags that serve only some stale reads are reported, not decided."""
    def summary(rows: Any) -> dict[str, Any]:
        prefill, decode = rows[rows.step == 0], rows[rows.step > 0]
        first = decode[decode.differs]
        return {"stale_reads": int(rows.stale_reads.iloc[0]), "unordered_reads": int(rows.unordered_reads.iloc[0]),
                "prefill_bitwise_equal": bool(prefill.bitwise_equal.all()),
                "decode_differs_every_step": bool(len(decode) > 0 and decode.differs.all()),
                "first_step_beyond_floor": int(first.step.iloc[0]) if len(first) else None,
                "max_abs_diff": [float(v) for v in rows.max_abs_diff]}

    variants = {v: summary(rows) for v, rows in table.groupby("variant", sort=False)}
    full = {v: s for v, s in variants.items() if s["stale_reads"] > 0 and s["stale_reads"] == s["unordered_reads"]}
    partial = {v: s for v, s in variants.items() if 0 < s["stale_reads"] < s["unordered_reads"]}
    clean = {v: s for v, s in variants.items() if s["stale_reads"] == 0}
    drift_ok = bool(full) and all(s["prefill_bitwise_equal"] and s["decode_differs_every_step"] for s in full.values())
    clean_ok = bool(clean) and all(bool(rows.bitwise_equal.all()) for v, rows in table.groupby("variant") if v in clean)
    evidence = {"every_unordered_read_stale": full, "some_unordered_reads_stale": partial, "no_stale_read": clean,
                "without_stale_reads_bitwise_equal": clean_ok, "stale_value": STALE_VALUE,
                "lag_unit": "cache-update calls (Cache.update / update_conv_state / update_recurrent_state on the cache)"}
    if not full:
        why = "no lag served a stale read: every prefetch read is ordered after its copy, so the replay predicts no drift"
    else:
        v, s = next(iter(full.items()))
        why = (f"{v} (all {s['stale_reads']} unordered reads stale): prefill bitwise equal = {s['prefill_bitwise_equal']}, "
               f"every decode step beyond the floor = {s['decode_differs_every_step']} (max |diff| per step "
               f"{[round(x, 4) for x in s['max_abs_diff']]}); without stale reads ({', '.join(clean)}) bitwise equal = {clean_ok}")
    v, s = next(iter(full.items())) if full else (None, {"max_abs_diff": [None, None]})
    lag = int(table[table.variant == v].lag.iloc[0]) if v else None
    deciding = {"smallest lag with every unordered read stale": lag, "prefill max |logit diff|": s["max_abs_diff"][0],
                "decode 1 max |logit diff|": s["max_abs_diff"][1] if len(s["max_abs_diff"]) > 1 else None}
    return Decision(drift_ok and clean_ok, evidence, why, deciding=deciding, source=REPORT_VALUES)
