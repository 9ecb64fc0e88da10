"""The race replay of notebook 05: stale host reads served for every unordered prefetch read (a simulation),
and the ordering decision from the recorded stream log.

Assumptions, stated with the results: an unordered read enqueued fewer than `lag` cache-update calls after
its copy sees zeros -- what a freshly allocated pinned host page holds; a recycled pinned block would hold
older bytes (an earlier layer's or step's K/V), which the replay does not model. It cannot show whether a GPU
runs that far behind, whether the allocator reuses a prefetched device block (the second hazard), or the
size of a real drift: only which tensors the host-buffer explanation corrupts, in which loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .loops import Decision, GreedyRun, greedy_run
from .ordering import LoopRecord, n_layers, record_loop
from .states import compare_logits, tagged
from .streams import STALE_VALUE, StreamLog

# transformers issue #48947, Qwen3.8-27B, bf16, batch 2 x 4096 random tokens
REPORT_VALUES = {"prefill max |logit diff|": 0.0, "decode 1 max |logit diff|": 2.1171875}


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
    """The race replay: offloading=False twice (the floor), then the offloading path at each lag (ordering.record_loop)."""

    reference: GreedyRun
    again: GreedyRun
    dtype: torch.dtype
    runs: list[LoopRecord] = field(default_factory=list)

    def table(self) -> Any:
        """Per lag (and fix) and step: max |logit diff| vs offloading=False, bitwise, beyond the floor (compare_logits)."""
        import pandas as pd

        frames = []
        for rr in self.runs:
            variant = ("" if rr.loop == "cpu" else f"{rr.loop} loop, ") + f"lag {rr.lag}" + " + 5.20.0 edge" * rr.fix
            frames.append(tagged(compare_logits(self.reference, self.again, rr.run, self.dtype, variant), 1, lag=rr.lag,
                                 fix=rr.fix, stale_reads=len(rr.stale()), unordered_reads=len(rr.log.unordered_reads()),
                                 loop=rr.loop))
        return pd.concat(frames, ignore_index=True)


def race_replay(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, lags: list[int], dtype: torch.dtype,
                fix_lag: int | None = None, loops: tuple[str, ...] = ("cpu",),
                floor: tuple[GreedyRun, GreedyRun] | None = None,
                recorded: dict[str, tuple[GreedyRun, StreamLog]] | None = None) -> Replay:
    """The report's experiment against offloading=False at each lag and loop, plus the 5.20.0 edge at `fix_lag`.

    Runs already made on the same model, ids and steps are taken instead of repeated: `floor`, the
    offloading=False pair (another replay's reference and again); `recorded[loop]`, that loop's (run, log)
    under the stand-ins with no lag and no edge (ordering.record_loop, schedule.record_schedule) for lag 0.
    """
    if floor is not None and {len(r.logits) for r in floor} != {n_steps}:
        raise ValueError(f"floor runs have {[len(r.logits) for r in floor]} calls, not {n_steps}")
    replay = Replay(*(floor or (greedy_run(model, ids, n_steps), greedy_run(model, ids, n_steps))), dtype)
    given = {loop: LoopRecord(run.loop, "model", log, run, n_layers(model)).check(loop=loop, calls=n_steps)
             for loop, (run, log) in (recorded or {}).items()}
    replay.runs = [given[loop] if lag == 0 and loop in given else
                   record_loop(model, ids, n_steps, loop, "model", "none", lag) for loop in loops for lag in lags]
    if fix_lag is not None:
        replay.runs += [record_loop(model, ids, n_steps, loop, "model", "5.20.0 edge", fix_lag) for loop in loops]
    return replay


ASSUMPTIONS = {
    "stale_value": STALE_VALUE,
    "recycled_block": "a recycled pinned block would hold older bytes (not modelled)",
    "cannot_show": "whether a GPU lags that far; allocator reuse of prefetched device blocks; the size of a real drift",
}


def replay_decision(table: Any) -> Decision:
    """offload.race_replay_drifts_by_construction: at every lag where every unordered read is served stale, the
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

    lags = {v: int(rows.lag.iloc[0]) for v, rows in table.groupby("variant", sort=False)}
    # the smallest lag first (ties in table order), so "smallest lag" is what the table holds, not its row order
    variants = {v: summary(table[table.variant == v]) for v in sorted(lags, key=lags.__getitem__)}
    full = {v: s for v, s in variants.items() if s["stale_reads"] > 0 and s["stale_reads"] == s["unordered_reads"]}
    partial = {v: s for v, s in variants.items() if 0 < s["stale_reads"] < s["unordered_reads"]}
    clean = {v: s for v, s in variants.items() if s["stale_reads"] == 0}
    drift_ok = bool(full) and all(s["prefill_bitwise_equal"] and s["decode_differs_every_step"] for s in full.values())
    clean_ok = bool(clean) and all(bool(rows.bitwise_equal.all()) for v, rows in table.groupby("variant") if v in clean)
    evidence = {"every_unordered_read_stale": full, "some_unordered_reads_stale": partial, "no_stale_read": clean,
                "without_stale_reads_bitwise_equal": clean_ok, "stale_value": STALE_VALUE,
                "lag_unit": "cache-update calls (Cache.update / update_conv_state / update_recurrent_state on the cache)"}
    v, s = next(iter(full.items())) if full else (None, {"max_abs_diff": [None, None]})
    why = ("no lag served a stale read: every prefetch read is ordered after its copy, so the replay predicts no drift"
           if not full else
           f"{v} (all {s['stale_reads']} unordered reads stale): prefill bitwise equal = {s['prefill_bitwise_equal']}, "
           f"every decode step beyond the floor = {s['decode_differs_every_step']} (max |diff| per step "
           f"{[round(x, 4) for x in s['max_abs_diff']]}); without stale reads ({', '.join(clean)}) bitwise equal = {clean_ok}")
    deciding = {"smallest lag with every unordered read stale": lags[v] if v else None,
                "prefill max |logit diff|": s["max_abs_diff"][0],
                "decode 1 max |logit diff|": s["max_abs_diff"][1] if len(s["max_abs_diff"]) > 1 else None}
    return Decision(drift_ok and clean_ok, evidence, why, deciding=deciding, source=REPORT_VALUES)
