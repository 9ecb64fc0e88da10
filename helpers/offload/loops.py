"""The three greedy loops of notebook 05 and their comparisons (transformers issue #48947).

`run_loop(loop, ...)` is the one entry point, `loop` in `LOOPS`:
* "report": the report's `run()` (`greedy_run(host_wait=False)`) -- logits and argmax stay on the device, no host
  wait, no per-step synchronize; logits go to the host only after the last call.
* "cpu": `greedy_run`, the kit's `.cpu()` loop -- every step's logits and tokens are copied to the host
  (a host wait per step on CUDA).
* "generate": `model.generate(...)` with an explicit greedy GenerationConfig (its own per-step host wait
  is recorded by `record_host_waits`, never assumed).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from unittest import mock

import torch

from kvresume import compat


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
    """Last-position logits (float32, CPU) and greedy tokens of every forward call."""

    logits: list[torch.Tensor]
    tokens: list[torch.Tensor]
    cache: Any = field(default=None, repr=False)
    loop: str = "cpu"
    host_waits: list[str] = field(default_factory=list)


def _call_hooks(before_call: Callable[[str], None] | None, after_call: Callable[[str, Any], None] | None,
                label: str, fn: Callable[[], Any]) -> Any:
    if before_call:
        before_call(label)
    out = fn()
    if after_call:
        after_call(label, compat.output_cache(out))
    return out


@torch.no_grad()
def greedy_run(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 4, cache: Any = None,
               before_call: Callable[[str], None] | None = None,
               after_call: Callable[[str, Any], None] | None = None, host_wait: bool = True) -> GreedyRun:
    """A prefill (logits_to_keep=1), then n_steps-1 greedy one-token decode steps. `host_wait` (the `.cpu()` loop):
    each step's logits and tokens copied to the host (a host wait per step); else the report's `run()` (loop
    "report"): logits cloned and argmax taken on the device, no host wait or synchronize between calls, the logits
    moved to the host after the last call. `host_waits` names the calls a host wait precedes.

    `cache=None` lets the model make its own cache (the seed's offloading=False arm);
    `before_call(label)` / `after_call(label, cache)` run around every forward call.
    """
    name = compat.cache_kwarg(model)
    keep = {"logits_to_keep": 1} if compat.accepts(model.forward, "logits_to_keep") else {}
    logits, tokens = [], []
    if host_wait:  # the `.cpu()` loop synchronizes the device before and after its prefill
        _sync(ids.device)
    kwargs = {name: cache} if cache is not None else {}
    out = _call_hooks(before_call, after_call, "prefill", lambda: model(input_ids=ids, use_cache=True, **kwargs, **keep))
    if host_wait:
        _sync(ids.device)
    for step in range(n_steps):
        last = out.logits[:, -1, :]
        next_ids = last.argmax(-1, keepdim=True)
        logits.append(last.detach().float().cpu().clone() if host_wait else last.clone())
        tokens.append(next_ids.detach().cpu().clone() if host_wait else next_ids)
        cache = compat.output_cache(out)
        if step == n_steps - 1:
            break
        out = _call_hooks(before_call, after_call, f"decode {step + 1}",
                          lambda: model(input_ids=next_ids, use_cache=True, **{name: cache}))
    if not host_wait:
        logits, tokens = [h.float().cpu() for h in logits], [t.cpu() for t in tokens]
    _sync(ids.device)
    return GreedyRun(logits, tokens, cache, "cpu" if host_wait else "report",
                     [f"decode {k}" for k in range(1, n_steps)] if host_wait else [])


LOOPS = ("report", "cpu", "generate")


@contextmanager
def record_host_waits(calls: Callable[[], int], on_wait: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """Yield a list that fills with one label per host-side read of generate()'s device stop flag (never assumed).

    From 5.17.0 `generate()` decides whether to stop with `StopCheck.__call__`, which reads
    `bool(unfinished_sequences.max() == 0)` on the host: a host wait on the device every step (`DeferredStopCheck`,
    which does not wait and overrides it, is enabled only on MPS). Earlier releases compute
    `this_peer_finished = unfinished_sequences.max() == 0` (a tensor) and `_has_unfinished_sequences` turns it into a
    Python bool: the same wait. The one that exists is wrapped for the duration. `calls()` returns how many forward
    calls have run so far: a wait after call n precedes "decode n"; `on_wait(label)` runs at the wait (the stream
    record enters it as a host synchronize there).
    """
    from transformers.generation import utils

    waits: list[str] = []
    stop = getattr(utils, "StopCheck", None)
    owner, name = (stop, "__call__") if stop is not None else (utils.GenerationMixin, "_has_unfinished_sequences")
    inner = getattr(owner, name)

    def wrapper(self: Any, flag: Any, *args: Any, **kwargs: Any) -> bool:
        if (type(self).__call__ is wrapper) if stop is not None else isinstance(flag, torch.Tensor):
            waits.append(f"decode {calls()}")
            if on_wait:
                on_wait(waits[-1])
        return inner(self, flag, *args, **kwargs)

    with mock.patch.object(owner, name, wrapper):
        yield waits


def greedy_config(n_steps: int) -> Any:
    """An explicit greedy GenerationConfig: n_steps new tokens (= n_steps forward calls), no EOS stop."""
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n_steps, min_new_tokens=n_steps,
                            eos_token_id=None, pad_token_id=0, output_logits=True,
                            return_dict_in_generate=True, use_cache=True)


@torch.no_grad()
def generate_run(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 4, cache: Any = None,
                 before_call: Callable[[str], None] | None = None,
                 after_call: Callable[[str, Any], None] | None = None,
                 on_host_wait: Callable[[str], None] | None = None) -> GreedyRun:
    """`model.generate(...)` greedy with `past_key_values=cache`; hooks run around every forward call
    (the forward is shadowed on the instance only for the duration)."""
    calls = {"n": 0}
    inner = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        label = "prefill" if calls["n"] == 0 else f"decode {calls['n']}"
        calls["n"] += 1
        return _call_hooks(before_call, after_call, label, lambda: inner(*args, **kwargs))

    extra = {compat.generate_cache_kwarg(model): cache} if cache is not None else {}
    model.forward = forward
    try:
        with record_host_waits(lambda: calls["n"], on_host_wait) as waits:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 generation_config=greedy_config(n_steps), **extra)
    finally:
        del model.forward
    logits = [l.detach().float().cpu().clone() for l in compat.generate_logits(out)]
    tokens = [t[:, None].cpu() for t in out.sequences[:, ids.shape[1]:].unbind(1)]
    cache_out = getattr(out, "past_key_values", None) or cache
    return GreedyRun(logits, tokens, cache_out, loop="generate", host_waits=list(waits))


def run_loop(loop: str, model: torch.nn.Module, ids: torch.Tensor, n_steps: int, cache: Any = None,
             **kw: Any) -> GreedyRun:
    """Run one of `LOOPS` ("report", "cpu", "generate"); `kw`: before_call / after_call hooks
    (and, for "generate", on_host_wait)."""
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r}; expected one of {LOOPS}")
    if loop == "generate":
        return generate_run(model, ids, n_steps, cache=cache, **kw)
    return greedy_run(model, ids, n_steps, cache=cache, host_wait=loop == "cpu", **kw)


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
    skipped: bool = False  # not measured (the arm did not run): `why` says why

    def record(self, res: Any, claim_id: str, **extra: Any) -> str:
        """`res.decide(...)` with everything this decision holds (`extra` joins the evidence); `res.skip` if skipped."""
        if self.skipped:
            return res.skip(claim_id, self.why, {**self.evidence, **extra})
        return res.decide(claim_id, self.holds, {**self.evidence, **extra}, why=self.why,
                          deciding=self.deciding, source=self.source)
