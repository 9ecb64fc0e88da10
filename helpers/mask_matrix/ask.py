"""The resume-contract control (notebooks 01-04, 07, 08 answer it): its SOURCE and Ask writer, for the report."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines, claim_of, error_head, first_change, joined, num

SOURCE = Source("control", "The Qwen3-VL resume-contract control (transformers 5.14.1)",
                {"release": "5.14.1", "dtype": "float16", "device": "cuda (Tesla T4)",
                 "model": "Qwen/Qwen3-VL-2B-Instruct @ 89644892"},
                "the real 2B checkpoint in fp16 on a T4 (no hub access and no GPU here: the tiny random-weight default "
                "stands in; pass `-p model_id ...` online), the 8B MMBench-Video result and video prompts (outside the "
                "control's own scope too).",
                "examples/repro/resume_contract_qwen3_vl.py",
                "expected vs got first model call without and with the full mask (the source: [1, 0] and a failure, [1, 1] and it works)",
                "Qwen3-VL control")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """The mask contract: what the no-mask resume does per release; the full mask as the measured repair."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        neither, mask = claim_of(claims, "matrix.neither_fails"), claim_of(claims, "matrix.mask_only_works")
        ev = neither.get("evidence") or {}
        if neither.get("verdict") == "reproduced":
            err = next(iter((ev.get("errors") or {}).values()), "")
            shape = (ev.get("first_call_input_ids") or [None])[0]
            symptom[rel] = (f"its first model call gets `input_ids` {shape} and raises {error_head(err)}" if shape and err
                            else f"fails ({str(neither.get('reason', ''))[:110]})")
        elif neither:
            symptom[rel] = f"not as the source says: {neither.get('reason', '')[:110]}"
        diff = (mask.get("evidence") or {}).get("max_abs_diff_vs_full_forward") or {}
        if mask.get("verdict") == "reproduced" and diff:
            thr = (mask.get("evidence") or {}).get("noise_threshold")
            repair[rel] = f"{num(max(diff.values()))} (noise threshold {num(thr)})"
    text = ("`generate()` resumed from a cached prefix with a one-token suffix and no full-length mask: "
            + joined(symptom)) if symptom else ""
    ask = ("pass the full attention mask (cached + new tokens); the kit applied it: the first call gets "
           f"`input_ids` [1, 1] and matches one forward within {joined(repair)}. Upstream: raise on a non-empty "
           "cache with a suffix-only mask instead of slicing the input to [1, 0]") if repair else ""
    bisect = first_change(out, "02", "matrix.neither_fails", list(by_release), len(set(symptom.values())) > 1)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))
