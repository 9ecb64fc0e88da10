"""Logit comparisons used by every notebook: max |diff|, cosine, top-1, top-5 overlap."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    top_ref, top_oth = ref2.topk(k, dim=-1).indices, oth2.topk(k, dim=-1).indices  # pragma: no mutate (2-D: dim -1, 1 and the default are one axis)
    overlap = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(top_ref, top_oth)]
    return {
        "max_abs_diff": float((ref2 - oth2).abs().max()),
        "cosine": float(torch.nn.functional.cosine_similarity(ref2, oth2, dim=-1).min()),  # pragma: no mutate (2-D: dim -1, 1 and the default are one axis)
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


# --- noise floors: what "matches" and "differs" mean in this run, model and dtype -------------------
#
# Tuned on the tiny default (max |logit| ~0.93) in float32/float16/bfloat16 x sdpa/eager on CPU:
# * two computations that must agree disagree by 0-1 ulp of the largest logit in float16/bfloat16
#   (valid split vs full forward: 1 ulp fp16, 0 bf16; sdpa vs eager full forward: 1.5 ulp fp16,
#   1.5 ulp bf16) and by ~8-9 ulps in float32 (accumulation order dominates there), so the measured
#   disagreement is the floor and one ulp at the logits' magnitude is only its lower bound (a lucky
#   bitwise agreement must not make the floor 0);
# * a margin of 4 leaves room for the floor's pair and the claim's pair differing in noise
#   (fp16: 1 vs 1.5 ulp) while the smallest effect any notebook claims (double processing with the
#   most favourable positions, bfloat16: 0.026 = 6.6 ulps) stays 1.66x above margin x floor.
RESOLUTION_ULPS = 1.0  # units in the last place at max |logit| that count as noise even when none is measured
DEFAULT_MARGIN = 4.0   # a difference must exceed margin x floor to count as "differs"


@dataclass(frozen=True)
class NoiseFloor:
    """The noise floor one decision is made against, with everything needed to check it by hand.

    floor = max(measured, resolution): `measured` is the max |diff| between computations that must agree
    (measured in the same run, model and dtype), `resolution` is RESOLUTION_ULPS ulps of the dtype at
    max |logit| (`scale`). "matches" means value <= margin x floor; "differs" means value > margin x floor.
    """

    measured: float
    resolution: float
    margin: float
    dtype: str
    scale: float
    what: str = ""

    @property
    def floor(self) -> float:
        return max(self.measured, self.resolution)

    @property
    def threshold(self) -> float:
        return self.margin * self.floor

    def matches(self, value: float) -> bool:
        """`value` (a max |diff|) is within the noise: value <= margin x floor."""
        return value is not None and math.isfinite(value) and value <= self.threshold

    def differs(self, value: float) -> bool:
        """`value` (a max |diff|) is beyond the noise: value > margin x floor (never true for a floor of 0)."""
        return value is not None and math.isfinite(value) and value > self.threshold and self.threshold > 0

    def evidence(self, value: float | None = None) -> dict[str, Any]:
        """The floor, margin and (when given) the measured value, for a claim's evidence."""
        out: dict[str, Any] = {"noise_floor": self.floor, "noise_measured": self.measured,
                               "noise_resolution": self.resolution, "noise_margin": self.margin,
                               "noise_threshold": self.threshold, "noise_dtype": self.dtype,
                               "noise_scale": self.scale, "noise_from": self.what}
        if value is not None:
            out["value"] = value
            out["value_over_threshold"] = value / self.threshold if self.threshold > 0 else None
        return out


def dtype_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (float32's for any other)."""
    return float(torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps)


def ulp(scale: float, dtype: torch.dtype) -> float:
    """One unit in the last place of `dtype` at magnitude `scale` (eps x the power of two at or below it)."""
    if not scale or not math.isfinite(scale):
        return 0.0
    return dtype_eps(dtype) * 2.0 ** math.floor(math.log2(abs(scale)))


def noise_floor(reference: torch.Tensor, agreeing: list[torch.Tensor] | torch.Tensor, dtype: torch.dtype,
                margin: float = DEFAULT_MARGIN, what: str = "") -> NoiseFloor:
    """The floor from `agreeing` tensors (computations that must equal `reference`) and the dtype's resolution.

    All differences are taken in float32; the scale is max |reference|.
    """
    ref = reference.detach().float()
    others = [agreeing] if isinstance(agreeing, torch.Tensor) else list(agreeing)
    measured = max((float((ref - o.detach().float().reshape(ref.shape)).abs().max()) for o in others), default=0.0)
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    resolution = RESOLUTION_ULPS * ulp(scale, dtype)
    return NoiseFloor(measured, resolution, margin, str(dtype).replace("torch.", ""), scale, what)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| taken in float32."""
    return float((a.detach().float() - b.detach().float().reshape(a.shape)).abs().max())


# --- decisions: a verdict is a function of measurements ---------------------------------------------

@dataclass
class Decision:
    """A computed verdict: whether the claim holds, why, the evidence, the deciding values, the source's values."""

    holds: bool
    why: str
    evidence: dict[str, Any]
    deciding: dict[str, Any]
    source: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # shown under the claim's row in SUMMARY.md

