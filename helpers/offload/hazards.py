"""The second hazard: a prefetched device K/V released while a read of it on another stream is pending.

A prefetch copy allocates the layer's device K/V on the prefetch stream; the layer's update reads it on
the default stream (`torch.cat`) and rebinds the layer to the result, which releases the prefetched
block. Without `record_stream(default)` the caching allocator may hand that block to the next
allocation on the prefetch stream (the next prefetch copy) while the default stream's read is still
pending: write-after-read. In the record this is: the read is not ordered before the next allocation
on the owning stream, and no `record_stream` was entered for the block. Whether the allocator really
reuses the block (and the bytes change under the read) needs a GPU; the record shows only the exposure.
"""
from __future__ import annotations

from typing import Any

from .ordering import PREFETCH, LoopRecord, prefetch_reads, record_loop
from .streams import StreamLog

READER = "layer update (compute)"


def _next_allocation(events: list[dict[str, Any]], after: int, stream: str) -> dict[str, Any] | None:
    return next((e for e in events[after + 1:] if e["op"] == PREFETCH and e["stream"] == stream), None)


def _record_stream_called(events: list[dict[str, Any]], start: int, end: int, layer: int, reader_stream: str) -> bool:
    return any(e["op"] == "record_stream" and e.get("layer") == layer and e["stream"] == reader_stream
               for e in events[start:end + 1])


def released_blocks(log: StreamLog) -> list[dict[str, Any]]:
    """Per prefetched block read on another stream: its release, the next allocation on its stream, the verdict."""
    events, rows = log.events, []
    for read in events:
        if read["op"] != READER or read.get("producer_seq") is None:
            continue
        alloc = events[read["producer_seq"]]
        if alloc["op"] != PREFETCH or alloc["stream"] == read["stream"]:
            continue
        nxt = _next_allocation(events, read["seq"], alloc["stream"])
        rs = _record_stream_called(events, alloc["seq"], read["seq"], read["layer"], read["stream"])
        ordered = None if nxt is None else StreamLog.ordered(read, nxt)
        rows.append({"call": read["call"], "layer": read["layer"], "owning_stream": alloc["stream"],
                     "reading_stream": read["stream"], "next_allocation_layer": None if nxt is None else nxt["layer"],
                     "next_allocation_call": None if nxt is None else nxt["call"],
                     "read_ordered_before_next_allocation": ordered, "record_stream": rs,
                     "pending_read_at_reuse": nxt is not None and not ordered and not rs})
    return rows


def hazard_counts(record: LoopRecord) -> dict[str, Any]:
    """Both hazards in one record: unordered host-buffer reads and released-with-pending-read blocks."""
    reads = prefetch_reads(record)
    blocks = released_blocks(record.log)
    return {"loop": record.loop, "model": record.model, "edge": record.edge,
            "host_buffer_unordered": sum(not r["ordered"] for r in reads), "prefetch_reads": len(reads),
            "released_with_pending_read": sum(b["pending_read_at_reuse"] for b in blocks),
            "released_blocks": len(blocks)}


def edge_table(model: Any, ids: Any, n_steps: int, name: str, edges: tuple[str, ...], loop: str = "report",
               recorded: LoopRecord | None = None) -> Any:
    """Which edge closes which hazard on the installed release (one record per edge); `recorded`: this loop's
    record without an edge on the same model, ids and steps (ordering.loops_by_models made it), used for "none"."""
    import pandas as pd

    given = {"none": recorded.check(loop=loop, model=name, edge="none", calls=n_steps)} if recorded is not None else {}
    rows = []
    for edge in edges:
        counts = hazard_counts(given[edge] if edge in given else record_loop(model, ids, n_steps, loop, name, edge))
        counts["closes_host_buffer"] = counts["host_buffer_unordered"] == 0
        counts["closes_reuse"] = counts["released_with_pending_read"] == 0
        rows.append(counts)
    return pd.DataFrame(rows)


def decide_released_with_pending_read(counts: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """`offload.prefetched_block_released_with_pending_read`: some block is exposed to reuse under a pending read."""
    return counts["released_with_pending_read"] > 0, {k: counts[k] for k in ("released_with_pending_read", "released_blocks")}
