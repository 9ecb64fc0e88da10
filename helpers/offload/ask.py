"""transformers issue #48947 (notebook 05 answers it): its SOURCE and Ask writer, for the report only."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines, claim_of, first_change, joined

SOURCE = Source("48947", "transformers issue #48947: hybrid offloading drift",
                {"release": "5.17.0", "dtype": "bfloat16", "device": "cuda (RTX PRO 6000 Blackwell)",
                 "model": "Qwen/Qwen3.8-27B"},
                "the 27B checkpoint and the CUDA copy streams themselves where no GPU is present: those claims are "
                "skipped with the reason, and the race is replayed as a simulation.",
                "examples/repro/offloading_48947.py",
                "on CPU the prefetch reads left unordered after their offload copy; with CUDA max |logit diff| per step, offloading on vs off (the report: 0.0, 2.1171875, 7.625, 17.4375)",
                "#48947")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """#48947: the drift needs CUDA; the CPU record's unordered prefetch reads per release decide the ordering edge."""
    reads, drift, waits = {}, {}, {}
    for rel, claims in by_release.items():
        c = claim_of(claims, "offload.prefetch_reads_unordered_copy")
        d = c.get("deciding") or {}
        if "unordered prefetch reads" in d:
            reads[rel] = f"{d['unordered prefetch reads']} of {d.get('prefetch reads', '?')}"
        waits[rel] = ((c.get("evidence") or {}).get("wait_stream_calls") or {}).get("waits for default", 0)
        dec = claim_of(claims, "offload.decode_drifts")
        drift[rel] = {"reproduced": "drifts from the first decode step", "not_reproduced": "does not drift"}.get(
            dec.get("verdict"), "drift not measured (needs CUDA)")
    releases = list(by_release)
    ordered = [r for r, v in reads.items() if v.startswith("0 of")]
    text = f"`DynamicCache(offloading=True)`: {joined(drift)}"
    if reads:
        text += "; prefetch reads unordered after their offload copy (CPU record): " + joined(reads)
    bisect = first_change(out, "05", "offload.prefetch_reads_unordered_copy", releases, len(set(reads.values())) > 1)
    ask = ""
    if ordered and len(ordered) < len(reads):
        edge = [r for r in ordered if waits.get(r)]
        how = (f"the prefetch stream waits for the compute stream "
               f"({waits[edge[-1]]} `wait_stream` calls on {edge[-1]}, none on "
               f"{', '.join(r for r in reads if r not in ordered)})" if edge else "an ordering edge")
        ask = (f"reporter: rerun on {ordered[-1]}: there {how}, which orders every prefetch read; "
               f"`make gpu-check RELEASES_GPU=\"{' '.join(releases)}\"` decides whether it removes the drift")
    elif reads:
        ask = ("order each prefetch read after the copy that fills its host buffer (the CPU record names the reads); "
               "`make gpu-check` decides whether that removes the drift")
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))
