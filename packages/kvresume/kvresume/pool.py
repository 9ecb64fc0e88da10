"""A prefix pool for any `generate()` caller: caches kept under a token budget, each request resumed from the one
sharing its longest prefix.

`Pool(model)` tracks the model and keeps the caches its calls wrote (least recently used evicted past `max_tokens`,
or `max_bytes` of cache tensors).
`pool.generate(input_ids, **kwargs)` takes the arguments of `model.generate` for the whole sequence and returns what
it returns (the whole sequence and the reply): the pooled cache with the longest common prefix, written by the same
weights and active adapters (`identity`), is resumed with `resume()` (which keys images by pixels and re-feeds where
the ledger says so, settings that read the whole input or expand the rows among them: kvresume.whole), and the
resulting cache is kept. A call the pool cannot serve (`unpooled`: the caller's own cache or positions, several rows,
a cache implementation, images it cannot key, a model that restarts its SSM scan: compat.restarts_scan) is
re-prefilled by the model's own generate(), with the reason in the record; a resume the guard refuses, or that raises
anything else, is re-prefilled too (the pool never raises where generate() would not). `pool.last` holds the
`PoolRecord` of the last call (prompt tokens, reused, fed, why); `attach(model)` makes `model.generate` the pool's.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache

from . import compat, images
from .call import is_encoder_decoder
from .guard import ResumeInputError
from .ledger import ledger_of, ledger_owner
from .prefix import record_of
from .reuse import resume
from .tracking import is_tracked, track
from .whole import effective_config

log = logging.getLogger("kvresume.pool")

# settings a pooled call cannot take beside a pooled cache (generate() refuses a cache implementation beside a cache;
# the pool returns the sequences alone), re-prefilled by the model's own generate(); the settings that read the whole
# input or expand the rows are resume()'s to re-prefill (kvresume.whole), into a cache the pool keeps
UNSAFE = {"cache_implementation": None, "return_dict_in_generate": False}
CALLER_STATE = ("past_key_values", "cache", "cache_position", "position_ids", "assistant_model", "inputs_embeds",
                "negative_prompt_ids", "use_cache")


@dataclass
class PoolRecord:
    """One pooled call: prompt tokens, tokens reused from a pooled cache, tokens fed, and why reuse stopped there."""

    prompt: int
    reused: int
    fed: int
    reason: str
    detail: str = ""

    def line(self) -> str:
        """The log line: reused, fed, why."""
        return f"{self.prompt} prompt tokens: {self.reused} reused, {self.fed} fed ({self.reason}: {self.detail})"


def identity(model: torch.nn.Module) -> str:
    """A digest of the model's weights as they are now: each parameter's name, shape, dtype, storage and version
    counter (an in-place change, `load_state_dict` included, moves it), 16 of its values (another checkpoint), and
    its adapters' state (peft layers: active, disabled, merged). Two caches are interchangeable only under one."""
    h = hashlib.sha1()
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 16)][:16].float().cpu()
            h.update(f"{name}{tuple(p.shape)}{p.dtype}{p.data_ptr()}:{p._version}".encode())
            h.update(sample.numpy().tobytes())
    for name, m in model.named_modules():
        if hasattr(m, "active_adapters") and hasattr(m, "merged_adapters"):  # a peft tuner layer
            state = (getattr(m, "disable_adapters", None), tuple(m.active_adapters), tuple(m.merged_adapters))
            h.update(f"{name}{state}".encode())
    return h.hexdigest()


def unpooled(model: torch.nn.Module, input_ids: Any, kwargs: dict[str, Any]) -> str | None:
    """Why the pool cannot serve this call by resuming a cache (None: it can)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        return "not one row of input ids"
    if is_encoder_decoder(model):
        return "an encoder-decoder model"
    given = [k for k in CALLER_STATE if kwargs.get(k) is not None]
    if given:
        return f"the caller passed {given[0]}"
    pixels = [k for k, v in kwargs.items() if k.startswith("pixel_values") and v is not None]
    if pixels and images.spans(model, {**kwargs, "input_ids": input_ids}) is None:
        return f"{pixels[0]} without the grid kvresume keys images by (a LLaVA-style model): not keyed by pixels"
    if compat.restarts_scan(model):
        return f"{type(model).__name__} restarts its SSM scan on a multi-token forward over a filled cache"
    config = effective_config(model, kwargs)
    for name, neutral in UNSAFE.items():
        value = getattr(config, name, neutral)
        if value is not None and value != neutral:
            return f"{name}={value!r} beside a pooled cache"
    return None


class Pool:
    """Caches of one model kept under a token budget (least recently used evicted); thread-safe: one call at a time."""

    def __init__(self, model: torch.nn.Module, max_tokens: int = 1 << 16, enabled: bool = True,
                 on_record: Callable[[PoolRecord], None] | None = None, min_share: float = 0.25,
                 max_bytes: int | None = None):
        if not is_tracked(model):
            track(model)
        self.model, self.max_tokens, self.enabled, self.on_record = model, max_tokens, enabled, on_record
        self.max_bytes = max_bytes  # the tensors the pooled caches hold (None: tokens alone bound them)
        # a shared prefix under this share of the prompt is not resumed: the suffix's masked attention over a few
        # cached slots costs more than their prefill (1,235 tokens, 5 shared, 24.7M Llama on CPU: +24%,
        # helpers.pipeline.tools.serve_bench)
        self.min_share = min_share
        self.plain = compat.plain_generate(model)  # the class's generate(), whatever attach() puts on the instance
        self.entries: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self.lock = threading.RLock()
        self.last: PoolRecord | None = None
        self._next = 0

    @property
    def held(self) -> int:
        """Tokens held by the pooled caches."""
        return sum(_length(cache) for _, cache in self.entries.values())

    @property
    def held_bytes(self) -> int:
        """Bytes of the tensors the pooled caches hold (keys, values, linear layers' states)."""
        return sum(_bytes(cache) for _, cache in self.entries.values())

    def over(self) -> bool:
        """Whether the pooled caches hold more than a budget allows."""
        return self.held > self.max_tokens or (self.max_bytes is not None and self.held_bytes > self.max_bytes)

    def generate(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """model.generate(input_ids, **kwargs), resumed from the pooled cache with the longest common prefix."""
        if input_ids is None:
            input_ids = kwargs.pop("input_ids", None)
        with self.lock, torch.no_grad():
            why = "the pool is off" if not self.enabled else unpooled(self.model, input_ids, kwargs)
            if why is not None:
                return self._plain(input_ids, kwargs, why)
            return self._pooled(input_ids, kwargs)

    def _plain(self, input_ids: Any, kwargs: dict[str, Any], why: str) -> Any:
        """The model's own generate(), nothing reused nor kept."""
        n = int(input_ids.shape[-1]) if isinstance(input_ids, torch.Tensor) else 0
        self._record(PoolRecord(n, 0, n, "re-prefilled", why))
        return self.plain(input_ids, **kwargs)

    def _pooled(self, ids: torch.Tensor, kwargs: dict[str, Any]) -> Any:
        """Resume the best pooled cache (or a new one), keep what it wrote, return the whole sequences."""
        me = identity(self.model)
        key, cache, common = self._best(ids, me)
        n = int(ids.shape[1])
        short = cache is not None and common < self.min_share * n
        if cache is None or short:
            cache = DynamicCache(config=compat.text_config(self.model.config))
        elif common < _length(cache):  # a branch: the cached longer path stays pooled
            cache = copy.deepcopy(cache)
        else:
            self.entries.pop(key)
        try:
            out = resume(self.model, ids, cache, **kwargs)
        except ResumeInputError as exc:
            return self._plain(ids, kwargs, f"the guard refused the resume ({exc.check}): {exc}".split("\n")[0])
        except Exception as exc:  # noqa: BLE001 - never raise where generate() would not: a miss, its cause logged
            if kwargs.get("streamer") is not None:  # what it streamed cannot be taken back: raised, never sent twice
                raise
            log.warning("kvresume pool: resume() raised %s: %s; re-prefilled", type(exc).__name__, exc)
            return self._plain(ids, kwargs, f"resume() raised {type(exc).__name__}: {exc}".split("\n")[0])
        rec = record_of(out)
        fed = rec.fed if rec is not None else n
        reason, detail = (rec.reason, rec.detail) if rec is not None else ("new", (
            f"the longest pooled prefix ({common} tokens) is under {self.min_share:.0%} of the prompt: re-prefilled"
            if short else "no pooled cache shares a prefix"))
        self._record(PoolRecord(n, n - fed, fed, reason, detail))
        self._keep(me, compat.output_cache(out) or cache)
        return torch.cat([ids[:, : n - fed].to(out.device).expand(out.shape[0], -1), out], 1)

    def _best(self, ids: torch.Tensor, me: str) -> tuple[int | None, Any, int]:
        """(key, cache, common prefix) of the pooled cache of this identity sharing the longest prefix with ids."""
        best: tuple[int | None, Any, int] = (None, None, 0)
        for key, (who, cache) in self.entries.items():
            led = ledger_of(cache) if who == me else None
            common = led.common_prefix(ids) if led is not None and led.batch == 1 else 0
            if common > best[2]:
                best = (key, cache, common)
        if best[0] is not None:
            self.entries.move_to_end(best[0])
        return best

    def _keep(self, who: str, cache: Any) -> None:
        """Pool the cache a call wrote, then evict the least recently used past the budget (the new one last)."""
        if ledger_of(cache) is None:
            return
        self._next += 1
        self.entries[self._next] = (who, cache)
        while len(self.entries) > 1 and self.over():
            self.entries.popitem(last=False)
        if self.over():
            self.entries.clear()

    def _record(self, record: PoolRecord) -> None:
        self.last = record
        log.info("kvresume pool: %s", record.line())
        if self.on_record is not None:
            self.on_record(record)


def _bytes(cache: Any) -> int:
    return sum(v.nbytes for layer in compat.cache_layers(ledger_owner(cache)) for v in vars(layer).values()
               if isinstance(v, torch.Tensor))


def _length(cache: Any) -> int:
    led = ledger_of(cache)
    return led.length if led is not None else 0


def attach(model: torch.nn.Module, **options: Any) -> Pool:
    """A Pool for the model, whose `generate` it now is (`model.generate = pool.generate`)."""
    pool = Pool(model, **options)
    model.generate = pool.generate
    return pool
