"""What the installed release does on its own: the source the schedule chart explains (shown, and stored as facts;
never used to decide), and `try_unpatched_offloading`, the real offloading=True path with nothing patched."""
from __future__ import annotations

import inspect
import os
import traceback
from typing import Any

import torch

from kvresume import compat
from .loops import greedy_run, step_table


SOURCE_TARGETS = (("Cache", "update"), ("Cache", "offload"), ("Cache", "prefetch"), ("Cache", "is_linear"),
                  ("Cache", "update_conv_state"), ("Cache", "update_recurrent_state"),
                  ("CacheLayerMixin", "offload"), ("CacheLayerMixin", "prefetch"),
                  ("LinearAttentionCacheLayerMixin", "offload"), ("LinearAttentionCacheLayerMixin", "prefetch"))


def offloading_source() -> list[dict[str, Any]]:
    """inspect.getsource of the installed cache_utils methods the schedule chart explains (SOURCE_TARGETS)."""
    from transformers import cache_utils as cu

    rows = []
    for cls_name, attr in SOURCE_TARGETS:
        name, obj = f"{cls_name}.{attr}", vars(getattr(cu, cls_name, object)).get(attr)
        obj = obj.fget if isinstance(obj, property) else obj
        if obj is None:
            rows.append({"name": name, "line": None, "source": f"# {name}: not defined on transformers {compat.TRANSFORMERS_VERSION}"})
            continue
        lines, start = inspect.getsourcelines(obj)
        rows.append({"name": name, "line": start, "source": "".join(lines)})
    return rows


def source_facts(sources: list[dict[str, Any]] | None = None) -> dict[str, bool]:
    """What the installed source says, as booleans (stored with the verdict)."""
    src = {row["name"]: row["source"] for row in (sources or offloading_source())}
    update, prefetch = src.get("Cache.update", ""), src.get("Cache.prefetch", "")
    return {
        "Cache.update offloads and prefetches": "self.offload(" in update and "self.prefetch(" in update,
        "Cache.update_conv_state offloads or prefetches": any(k in src.get("Cache.update_conv_state", "") for k in ("offload(", "prefetch(")),
        "Cache.update_recurrent_state offloads or prefetches": any(k in src.get("Cache.update_recurrent_state", "") for k in ("offload(", "prefetch(")),
        "Cache.prefetch skips linear layers": "is_linear" in prefetch,
        "Cache.update waits on torch.cuda.default_stream": "torch.cuda.default_stream" in update,
        "prefetch stream waits for the default stream before prefetching": "self.prefetch_stream.wait_stream" in update,
        "default stream waits for the prefetch stream": ".wait_stream(self.prefetch_stream)" in update,
    }


def print_source(sources: list[dict[str, Any]]) -> None:
    for row in sources:
        print(f"# ---- transformers/cache_utils.py:{row['line']}  {row['name']}")
        print(row["source"])


# --- the real path, unpatched ---------------------------------------------------------------------

def try_unpatched_offloading(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 2) -> dict[str, Any]:
    """Run the real offloading=True path with nothing patched; what happened, as data."""
    stage = "construct DynamicCache(config=..., offloading=True)"
    try:
        cache = compat.dynamic_cache(model.config, offloading=True)
        stage = "greedy run (prefill + decode) with the offloading cache"
        run = greedy_run(model, ids, n_steps, cache=cache)
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        frames = traceback.extract_tb(exc.__traceback__)
        tf = [f for f in frames if f"{os.sep}transformers{os.sep}" in f.filename]
        where = tf[-1] if tf else frames[-1]
        rel = where.filename.split(f"{os.sep}transformers{os.sep}")[-1]
        return {"raised": True, "stage": stage, "exception_type": type(exc).__name__,
                "message": str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "",
                "raised_in": f"{frames[-1].name} ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})",
                "transformers_frame": f"transformers/{rel}:{where.lineno} in {where.name}",
                "transformers_line": (where.line or "").strip()}
    baseline = greedy_run(model, ids, n_steps)
    table = step_table(baseline, run)
    return {"raised": False, "stage": "completed", "forward_calls": len(run.logits),
            "max_abs_diff_vs_offloading_false": float(table.max_abs_diff.max()),
            "argmax_match_every_step": bool(table.argmax_match.all())}


def mentions_cuda(outcome: dict[str, Any]) -> bool:
    """Whether a caught failure names CUDA (in its message or in the transformers line that raised)."""
    text = f"{outcome.get('message', '')} {outcome.get('transformers_line', '')}".lower()
    return "cuda" in text
