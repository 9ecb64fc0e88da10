"""(c) assisted decoding against greedy per family, (d) static caches reused across generate() calls: token ids
compared with a no-cache greedy run; a refusal is the error it raised. Failures are rows, not exceptions."""
from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from kvresume import compat, layers
from .setup import Family, error_line

NEW_TOKENS = 6


def repetitive_ids(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    """[1, 21] ids: a 6-token phrase three times and its first half, so prompt lookup has drafts to verify."""
    vocab = int(compat.text_config(model.config).vocab_size)
    phrase = torch.randint(10, vocab - 10, (1, 6), generator=torch.Generator().manual_seed(seed))
    return torch.cat([phrase, phrase, phrase, phrase[:, :3]], 1)


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
    """{'tokens', 'cache', 'calls', 'first_call_drafts', 'multi_token_calls'} of a greedy generate(), or {'error'}; calls:
    forward calls of `model`; drafts verified with the prefill (prompt lookup), multi-token calls after it."""
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: calls.append(int(kw["input_ids"].shape[1])), with_kwargs=True)
    try:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0, return_dict_in_generate=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a refusal is the measurement
        return {"error": error_line(exc)}
    finally:
        hook.remove()
    return {"tokens": out.sequences[0, ids.shape[1]:].tolist(), "cache": compat.output_cache(out), "calls": len(calls),
            "first_call_drafts": calls[0] - int(ids.shape[1]) if calls else None,
            "multi_token_calls": sum(n > 1 for n in calls[1:])}


def assisted_rows(families: dict[str, Family], seed: int = 0) -> list[dict[str, Any]]:
    """Per family: plain greedy, prompt lookup (3 tokens) and the model as its own assistant, against no-cache greedy."""
    rows = []
    for name, family in families.items():
        model, ids = family.model, repetitive_ids(family.model, seed)
        extra = {"cache_implementation": "static"} if name == "static" else {}
        reference = greedy(model, ids, use_cache=False)
        for way, kwargs in (("greedy", {}), ("prompt lookup", {"prompt_lookup_num_tokens": 3}),
                            ("own assistant", {"assistant_model": model})):
            got = greedy(model, ids, **extra, **kwargs)
            row = {"family": name, "way": way, "error": got.get("error"), "calls": got.get("calls"),
                   "drafts_in_prefill": got.get("first_call_drafts"),
                   "verifications": got.get("multi_token_calls"), "tokens": got.get("tokens"),
                   "no_cache_tokens": reference.get("tokens")}
            row["outcome"] = "refused" if got.get("error") else ("equal" if got["tokens"] == reference.get("tokens") else "differs")
            rows.append(row)
    return rows


def _capacity(cache: Any) -> int | None:
    """Slots the cache's first attention layer allocates (a static cache's capacity); None without one."""
    return next((w for w in layers.widths(cache) if w is not None), None) if cache is not None else None


def static_rows(family: Family, seed: int = 0) -> list[dict[str, Any]]:
    """The static family's model: a short call then a longer one (30 prompt tokens) each way a static cache is reused."""
    model = family.model
    gen = torch.Generator().manual_seed(seed + 1)
    short, long = torch.randint(10, 2000, (1, 10), generator=gen), torch.randint(10, 2000, (1, 30), generator=gen)
    expected = greedy(model, long, use_cache=False).get("tokens")
    key = compat.generate_cache_kwarg(model)
    user = StaticCache(config=model.config, max_cache_len=20)
    cases = [("user StaticCache(max_cache_len=20), reused for a call past it",
              lambda: (greedy(model, short, **{key: user}), user.reset(), greedy(model, long, **{key: user}))[-1]),
             ("cache_implementation='static', a second, longer call",
              lambda: (greedy(model, short, cache_implementation="static"), greedy(model, long, cache_implementation="static"))[-1]),
             ("cache_implementation='static', cache_config max_cache_len=64",
              lambda: greedy(model, long, cache_implementation="static", cache_config={"max_cache_len": 64})),
             ("a user DynamicCache while generation_config.cache_implementation='static'", lambda: _beside_config(model, long, key))]
    rows = []
    for what, call in cases:
        got = call()
        outcome = "raises" if got.get("error") else ("matches" if got["tokens"] == expected else "silently wrong")
        rows.append({"case": what, "outcome": outcome, "error": got.get("error"), "capacity": _capacity(got.get("cache")),
                     "needed": int(long.shape[1]) + NEW_TOKENS - 1, "requested": 64 if "64" in what else None})
    return rows


def _beside_config(model: torch.nn.Module, ids: torch.Tensor, key: str) -> dict[str, Any]:
    before = model.generation_config.cache_implementation
    model.generation_config.cache_implementation = "static"
    try:
        return greedy(model, ids, **{key: DynamicCache(config=model.config)})
    finally:
        model.generation_config.cache_implementation = before
