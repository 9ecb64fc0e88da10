"""The report's greedy loop and the comparisons of notebook 05 (transformers issue #48947)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import compat


# --- inputs and the greedy loop of the seed -------------------------------------------------------

def random_ids(model: torch.nn.Module, batch_size: int = 2, seq_len: int = 64, seed: int = 0,
               device: str | torch.device = "cpu") -> torch.Tensor:
    """Random token ids from a seeded CPU generator, moved to `device` (the seed drew from [1000, 50000))."""
    vocab = int(compat.text_config(model.config).vocab_size)
    low, high = (1000, 50000) if vocab > 50000 else (0, vocab)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (batch_size, seq_len), generator=gen).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class GreedyRun:
    """Last-position logits (float32, CPU) and greedy tokens of every forward call, with timings."""

    logits: list[torch.Tensor]
    tokens: list[torch.Tensor]
    prefill_s: float
    decode_s: float
    cache: Any = field(default=None, repr=False)


@torch.no_grad()
def greedy_run(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 4, cache: Any = None,
               before_call: Callable[[str], None] | None = None,
               after_call: Callable[[str, Any], None] | None = None) -> GreedyRun:
    """The seed's `run()`: a prefill (logits_to_keep=1), then n_steps-1 greedy one-token decode steps.

    `cache=None` lets the model make its own cache (the seed's offloading=False arm);
    `before_call(label)` / `after_call(label, cache)` run around every forward call.
    """
    name = compat.cache_kwarg(model)
    keep = {"logits_to_keep": 1} if compat.accepts(model.forward, "logits_to_keep") else {}
    logits, tokens = [], []
    _sync(ids.device)
    start = time.perf_counter()
    if before_call:
        before_call("prefill")
    kwargs = {name: cache} if cache is not None else {}
    out = model(input_ids=ids, use_cache=True, **kwargs, **keep)
    if after_call:
        after_call("prefill", compat.output_cache(out))
    _sync(ids.device)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(n_steps):
        last = out.logits[:, -1, :]
        logits.append(last.detach().float().cpu().clone())
        next_ids = last.argmax(-1, keepdim=True)
        tokens.append(next_ids.detach().cpu().clone())
        cache = compat.output_cache(out)
        if step == n_steps - 1:
            break
        if before_call:
            before_call(f"decode {step + 1}")
        out = model(input_ids=next_ids, use_cache=True, **{name: cache})
        if after_call:
            after_call(f"decode {step + 1}", compat.output_cache(out))
    _sync(ids.device)
    return GreedyRun(logits, tokens, prefill_s, time.perf_counter() - start, cache)


# --- comparisons ----------------------------------------------------------------------------------

def step_table(reference: GreedyRun, other: GreedyRun, noise: GreedyRun | None = None) -> Any:
    """Per forward call: max |logit diff| vs reference, argmax agreement, and the noise floor."""
    import pandas as pd

    rows = []
    for step, (ref, oth) in enumerate(zip(reference.logits, other.logits)):
        row = {"step": step, "call": "prefill" if step == 0 else f"decode {step}",
               "max_abs_diff": float((ref - oth).abs().max()),
               "argmax_match": bool(torch.equal(ref.argmax(-1), oth.argmax(-1))),
               "bitwise_equal": bool(torch.equal(ref, oth)),
               "reference_top1_logit": float(ref.max(-1).values.max())}
        if noise is not None:
            row["noise_floor"] = float((ref - noise.logits[step]).abs().max())
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class Decision:
    """A computed verdict with its evidence, the deciding values and the report's value for them."""

    holds: bool
    evidence: dict[str, Any]
    why: str
    deciding: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def record(self, res: Any, claim_id: str, **extra: Any) -> str:
        """`res.decide(...)` with everything this decision holds (`extra` joins the evidence)."""
        return res.decide(claim_id, self.holds, {**self.evidence, **extra}, why=self.why,
                          deciding=self.deciding, source=self.source)
