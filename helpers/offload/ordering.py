"""The loops x models ordering table of notebook 05, decided from the recorded stream events only.

`record_loop` runs one loop (helpers.offload.loops.LOOPS) on an offloading DynamicCache under the
recording stream stand-ins, with the loop's own host waits entered into the record: none for the
report's loop, a default-stream synchronize before every decode call for the `.cpu()` loop, and for
`generate()` one wherever transformers' stop check read the device (helpers.offload.loops.record_host_waits).
Each prefetch read is then judged: is its producing offload copy ordered before it, how far apart
(cache-update calls, decoder layers) and whether the producer ran in the same forward call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvresume import compat
from .loops import GreedyRun, run_loop
from .standins import recording_streams
from .streams import StreamLog
from .tracking import EDGES, track

PREFETCH = "prefetch copy (host->device)"


@dataclass
class LoopRecord:
    """One loop on one model: the stream record, the run, the model's depth, the fix edge and the replay's lag."""

    loop: str
    model: str
    log: StreamLog
    run: GreedyRun
    n_layers: int
    edge: str = "none"
    lag: int = 0

    @property
    def fix(self) -> bool:
        """Whether a fix edge was added (the race replay's 5.20.0 edge)."""
        return self.edge != "none"

    def stale(self) -> list[dict[str, Any]]:
        """The reads served stale (the race replay)."""
        return [r for r in self.log.reads() if r["served_stale"]]

    def check(self, **expected: Any) -> "LoopRecord":
        """This record, where its fields (and `calls`, its forward calls) are `expected`; else ValueError."""
        have = {k: len(self.run.logits) if k == "calls" else getattr(self, k) for k in expected}
        if have != expected:
            raise ValueError(f"recorded is {have}, not {expected}")
        return self


def stream_hooks(loop: str, log: StreamLog) -> dict[str, Any]:
    """run_loop's hooks that enter `loop`'s host waits into `log`: a default-stream synchronize before every `.cpu()`
    call after the first, and one wherever generate()'s stop check read the device."""
    kw: dict[str, Any] = {"before_call": lambda label: log.begin(label, host_synced=(loop == "cpu"))}
    if loop == "generate":
        kw["on_host_wait"] = lambda label: log.synchronize(log.default_stream(), "generate()'s stop check read the device")
    return kw


def record_loop(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, loop: str, name: str = "model",
                edge: str = "none", lag: int = 0) -> LoopRecord:
    """Run `loop` with `DynamicCache(config, offloading=True)` under the stand-ins, optionally with a fix edge and
    (the race replay) stale reads served `lag` cache-update calls behind; the run keeps no cache."""
    with recording_streams() as log:
        cache = compat.dynamic_cache(model.config, offloading=True)
        with track(cache, log, lag=lag), EDGES[edge](cache):
            run = run_loop(loop, model, ids, n_steps, cache=cache, **stream_hooks(loop, log))
    run.cache = None
    return LoopRecord(loop, name, log, run, n_layers(model), edge, lag)


def n_layers(model: torch.nn.Module) -> int:
    """The model's decoder layers."""
    return int(compat.text_config(model.config).num_hidden_layers)


def prefetch_reads(record: LoopRecord) -> list[dict[str, Any]]:
    """Every prefetch read with its distance to the producing copy and where that copy ran."""
    rows = []
    for r in record.log.reads():
        if r["reader"] != PREFETCH:
            continue
        forwards = r["call_index"] - r["producer_call_index"]
        rows.append({**r, "same_forward": forwards == 0, "forwards_back": forwards,
                     "layers_since_producer": forwards * record.n_layers + r["update_layer"] - r["producer_update_layer"]})
    return rows


def summary_row(record: LoopRecord) -> dict[str, Any]:
    """One table row: unordered / all prefetch reads, distances, same- vs earlier-forward producers."""
    reads = prefetch_reads(record)
    bad = [r for r in reads if not r["ordered"]]
    same = [r for r in bad if r["same_forward"]]
    return {"loop": record.loop, "model": record.model, "edge": record.edge,
            "unordered_prefetch_reads": len(bad), "prefetch_reads": len(reads),
            "unordered_same_forward": len(same), "unordered_earlier_forward": len(bad) - len(same),
            "calls_since_producer": sorted({r["calls_since_producer"] for r in bad}),
            "layers_since_producer": sorted({r["layers_since_producer"] for r in bad}),
            "host_waits": len(record.run.host_waits)}


def ordering_table(records: list[LoopRecord]) -> Any:
    """The loops x models table (pandas)."""
    import pandas as pd

    return pd.DataFrame([summary_row(r) for r in records])


def loops_by_models(models: dict[str, torch.nn.Module], ids_of: dict[str, torch.Tensor], n_steps: int,
                    loops: tuple[str, ...], errors: dict[str, str] | None = None) -> list[LoopRecord]:
    """Record every loop on every model (same ids per model); a model the installed release cannot run
    (e.g. 5.14.1's Qwen3.5 with no linear_attention layer) is left out, its error entered in `errors`."""
    records = []
    for name, model in models.items():
        try:
            records += [record_loop(model, ids_of[name], n_steps, loop, name) for loop in loops]
        except Exception as exc:  # a release limitation, reported with the table
            if errors is None:
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
    return records


# --- decisions (each from table rows only) ----------------------------------------------------------

def _rows(table: Any, **match: Any) -> list[dict[str, Any]]:
    rows = table.to_dict("records") if hasattr(table, "to_dict") else list(table)
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def decide_not_specific_to_hybrid(table: Any, dense_models: list[str]) -> tuple[bool, dict[str, Any]]:
    """`offload.race_not_specific_to_hybrid`: a dense (all full_attention) model has unordered reads too."""
    counts = {m: rows[0]["unordered_prefetch_reads"] for m in dense_models if (rows := _rows(table, loop="report", model=m))}
    if not counts:
        raise LookupError(f"no dense model ran on this release: {dense_models}")
    return any(n > 0 for n in counts.values()), {"dense_unordered_report_loop": counts}


def decide_report_loop_reads_previous_forward(table: Any, model: str) -> tuple[bool, dict[str, Any]]:
    """`offload.report_loop_reads_previous_forward`: some unordered reads' producers ran in an earlier forward."""
    row = _rows(table, loop="report", model=model)[0]
    return row["unordered_earlier_forward"] > 0, {"unordered_earlier_forward": row["unordered_earlier_forward"],
                                                  "unordered_same_forward": row["unordered_same_forward"]}


def decide_generate_orders_cross_forward(table: Any, model: str) -> tuple[bool, dict[str, Any]]:
    """`offload.generate_orders_cross_forward_reads`: under generate() no unordered read crosses a forward,
    while the report's loop on the same model has such reads (otherwise there is nothing to order)."""
    gen = _rows(table, loop="generate", model=model)[0]
    rep = _rows(table, loop="report", model=model)[0]
    holds = gen["unordered_earlier_forward"] == 0 and rep["unordered_earlier_forward"] > 0 and gen["host_waits"] > 0
    return holds, {"generate_unordered_earlier_forward": gen["unordered_earlier_forward"],
                   "generate_unordered_same_forward": gen["unordered_same_forward"],
                   "generate_host_waits": gen["host_waits"],
                   "report_unordered_earlier_forward": rep["unordered_earlier_forward"]}
