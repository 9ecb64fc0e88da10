"""Logit comparisons used by every notebook: max |diff|, cosine, top-1, top-5 overlap."""
from __future__ import annotations

from typing import Any

import torch


def last_logits(logits: torch.Tensor) -> torch.Tensor:
    """Float32 logits of the last position, batch flattened to 1-D when the batch is 1."""
    x = logits.detach().float()
    if x.dim() == 3:
        x = x[:, -1, :]
    return x.reshape(-1) if x.shape[0] == 1 else x


def logit_metrics(reference: torch.Tensor, other: torch.Tensor, k: int = 5) -> dict[str, Any]:
    """How far `other` is from `reference` (last-position logits)."""
    ref, oth = last_logits(reference), last_logits(other)
    if ref.shape != oth.shape:
        raise ValueError(f"logit shapes differ: {tuple(ref.shape)} vs {tuple(oth.shape)}")
    ref2, oth2 = ref.reshape(-1, ref.shape[-1]), oth.reshape(-1, oth.shape[-1])
    top_ref, top_oth = ref2.topk(k, dim=-1).indices, oth2.topk(k, dim=-1).indices
    overlap = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(top_ref, top_oth)]
    return {
        "max_abs_diff": float((ref2 - oth2).abs().max()),
        "cosine": float(torch.nn.functional.cosine_similarity(ref2, oth2, dim=-1).min()),
        "top1_reference": top_ref[:, 0].tolist() if ref2.shape[0] > 1 else int(top_ref[0, 0]),
        "top1": top_oth[:, 0].tolist() if oth2.shape[0] > 1 else int(top_oth[0, 0]),
        "top1_equal": bool((top_ref[:, 0] == top_oth[:, 0]).all()),
        f"top{k}_overlap": min(overlap),
        "bitwise_equal": bool(torch.equal(ref2, oth2)),
    }


def tensors_bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Same shape, dtype and bits (None only equals None)."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
