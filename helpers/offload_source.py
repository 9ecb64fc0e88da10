"""The installed transformers source the schedule chart explains (shown, and stored as facts; never used to decide)."""
from __future__ import annotations

import inspect
from typing import Any

from . import compat


def _source_targets() -> list[tuple[str, Any]]:
    from transformers import cache_utils as cu

    names = [("Cache", "update"), ("Cache", "offload"), ("Cache", "prefetch"), ("Cache", "is_linear"),
             ("Cache", "update_conv_state"), ("Cache", "update_recurrent_state"),
             ("CacheLayerMixin", "offload"), ("CacheLayerMixin", "prefetch"),
             ("LinearAttentionCacheLayerMixin", "offload"), ("LinearAttentionCacheLayerMixin", "prefetch")]
    out = []
    for cls_name, attr in names:
        cls = getattr(cu, cls_name, None)
        obj = None if cls is None else vars(cls).get(attr)
        if isinstance(obj, property):
            obj = obj.fget
        out.append((f"{cls_name}.{attr}", obj))
    return out


def offloading_source() -> list[dict[str, Any]]:
    """inspect.getsource of the installed cache_utils methods the schedule chart explains."""
    rows = []
    for name, obj in _source_targets():
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
