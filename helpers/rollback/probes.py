"""The measurements of notebook 10: (a) rollback by crop(-k), (b) multi-token continuation on the hybrid,
(c) assisted decoding against greedy per family, (d) static caches reused across generate() calls (token ids compared
with a no-cache greedy run; a refusal is the error it raised), (e) what a rebuilt hybrid reports and what generate()
then feeds. Failures are rows, not exceptions. Two caches are compared by what they hold: K/V of the attention layers,
conv and recurrent states of the linear layers (max |diff|; inf where the shapes differ), and the length each reports."""
from __future__ import annotations

import copy
import math
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from kvresume import compat
from kvresume.factory import export_tensors, kv_cache_from_tensors
from ..compare import NoiseFloor, max_abs_diff
from ..continuation import generate_first_step
from ..families import rebuilds
from kvresume import layers
from .setup import Family, error_line, forward


def max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """max |a - b| in float32; inf where the shapes differ; None where either is missing."""
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return math.inf
    return float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0


def _worst(values: list[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def _held(t: torch.Tensor | None, held: int | None) -> torch.Tensor | None:
    return t if t is None or held is None else t[..., :held, :]


def state_diffs(cache: Any, reference: Any, held: int | None = None) -> dict[str, float | None]:
    """{'kv', 'kv_held', 'conv', 'recurrent'}: the largest max |diff| over the layers of that kind (None: no such
    layer); 'kv' over every stored slot, 'kv_held' over the first `held` slots (a static cache's slots past its length)."""
    kv, kv_held, conv, recurrent = [], [], [], []
    for a, b in zip(compat.cache_layers(cache), compat.cache_layers(reference)):
        if layers.has_kv(a) or layers.has_kv(b):
            ka, va = compat.layer_kv(a)
            kb, vb = compat.layer_kv(b)
            kv += [max_diff(ka, kb), max_diff(va, vb)]
            kv_held += [max_diff(_held(ka, held), _held(kb, held)), max_diff(_held(va, held), _held(vb, held))]
        if layers.has_linear_state(a) and layers.has_linear_state(b):
            conv += [max_diff(a.conv_states.get(i), b.conv_states.get(i)) for i in b.conv_states]
            recurrent += [max_diff(a.recurrent_states.get(i), b.recurrent_states.get(i)) for i in b.recurrent_states]
    return {"kv": _worst(kv), "kv_held": _worst(kv_held), "conv": _worst(conv), "recurrent": _worst(recurrent)}


def reported_length(cache: Any) -> int | None:
    """`get_seq_length()` as an int; None where it raises."""
    try:
        return int(cache.get_seq_length())
    except Exception:  # noqa: BLE001 - a cache that cannot say its length is a measurement
        return None


MODE_HOW = {"plain": "crop(-k), no recording", "record": "activate_past_recording() before the k tokens, crop(-k)",
            "record_keep": "activate_past_recording(recurrent_states_to_keep=k) before the k tokens, crop(-k)"}


def _start_recording(cache: Any, mode: str, k: int) -> str | None:
    """Switch recording on as `mode` says; the error where the release does not offer it."""
    try:
        if mode == "record":
            cache.activate_past_recording()
        elif mode == "record_keep":
            cache.activate_past_recording(recurrent_states_to_keep=k)
    except Exception as exc:  # noqa: BLE001 - not offered on this release
        return error_line(exc)
    return None


def fresh_of(family: Family, ids: torch.Tensor, prompt: int, k: int) -> tuple[Any, torch.Tensor]:
    """What every rollback is compared with: (the cache that never saw the k tokens (ids[:prompt] prefilled), the
    logits of the next unseen token ids[prompt + k] fed to a copy of it)."""
    cache = family.new_cache()
    forward(family.model, ids[:, :prompt], cache)
    return cache, forward(family.model, ids[:, prompt + k:prompt + k + 1], copy.deepcopy(cache))[:, -1]


def rolled_back(family: Family, ids: torch.Tensor, prompt: int, k: int, mode: str) -> tuple[Any, str, str]:
    """Prefill ids[:prompt], (recording as `mode` says) process k more, crop(-k): (the cache, '', ''), or (None, the
    outcome, the error) where the release refuses a step."""
    rolled = family.new_cache()
    forward(family.model, ids[:, :prompt], rolled)
    refused = _start_recording(rolled, mode, k)
    if refused:
        return None, "not offered", refused
    try:
        forward(family.model, ids[:, prompt:prompt + k], rolled)
    except Exception as exc:  # noqa: BLE001 - 5.25.0: a k-token forward after activate_past_recording() raises
        return None, "raised while recording", error_line(exc)
    try:
        rolled.crop(-k)
    except Exception as exc:  # noqa: BLE001 - a refusal is the measurement
        return None, "refused", error_line(exc)
    return rolled, "", ""


def rollback_row(family: Family, ids: torch.Tensor, prompt: int, k: int, mode: str, floor: NoiseFloor,
                 fresh: tuple[Any, torch.Tensor]) -> dict[str, Any]:
    """`rolled_back`, then the next unseen token fed; against `fresh`, a cache that never saw the k tokens: its
    states and the next token's logits."""
    row: dict[str, Any] = {"family": family.name, "mode": mode, "how": MODE_HOW[mode], "k": k}
    rolled, outcome, error = rolled_back(family, ids, prompt, k, mode)
    if rolled is None:
        return {**row, "outcome": outcome, "error": error}
    fresh_cache, fresh_logits = fresh
    held = reported_length(fresh_cache)
    row.update(length=reported_length(rolled), fresh_length=held,
               **{f"{name}_diff": v for name, v in state_diffs(rolled, fresh_cache, held).items()})
    try:
        diff = max_abs_diff(fresh_logits, forward(family.model, ids[:, prompt + k:prompt + k + 1], rolled)[:, -1])
    except Exception as exc:  # noqa: BLE001 - a continuation that raises after the crop
        return {**row, "outcome": "raised after crop", "error": error_line(exc)}
    row["next_logits_diff"] = diff
    row["outcome"] = "restored" if floor.matches(diff) else "silently wrong"
    return row


def rollback_rows(families: dict[str, Family], ids: torch.Tensor, prompt: int, k: int,
                  floors: dict[str, NoiseFloor]) -> list[dict[str, Any]]:
    """Every family in every mode."""
    rows = []
    for name, family in families.items():
        fresh = fresh_of(family, ids, prompt, k)
        rows += [rollback_row(family, ids, prompt, k, mode, floors[name], fresh) for mode in MODE_HOW]
    return rows


def continuation_rows(family: Family, ids: torch.Tensor, suffixes: tuple[int, ...]) -> list[dict[str, Any]]:
    """A suffix of s tokens on the cache of the rest, by forward() and by generate() with the full ids and mask,
    against the full forward's last logits (and, for forward(), all s positions)."""
    full = forward(family.model, ids)
    n, rows = int(ids.shape[1]), []
    for s in suffixes:
        cache = family.new_cache()
        forward(family.model, ids[:, :n - s], cache)
        gen_cache = copy.deepcopy(cache)
        out = forward(family.model, ids[:, n - s:], cache)
        rows.append({"suffix": s, "call": "forward()", "fed": s, "max_abs_diff": max_abs_diff(full[:, -1], out[:, -1]),
                     "all_positions_diff": max_abs_diff(full[:, -s:], out)})
        got = generate_first_step(family.model, ids, gen_cache, attention_mask=torch.ones_like(ids))
        fed = (got.first_call.get("input_ids_shape") or [None, None])[1]
        rows.append({"suffix": s, "call": "generate()", "fed": fed, "error": got.error_summary() or None,
                     "max_abs_diff": max_abs_diff(full[:, -1], got.logits) if got.ok else None})
    return rows


def hand_rebuild(cache: Any, config: Any) -> DynamicCache:
    """A hybrid rebuilt by hand the documented way: `DynamicCache(config=...)`, `update()` per attention layer,
    `update_conv_state` / `update_recurrent_state` per linear layer; no token count carried (nothing documents one)."""
    rebuilt = DynamicCache(config=compat.text_config(config))
    for i, (layer, target) in enumerate(zip(cache.layers, rebuilt.layers)):
        if layers.has_linear_state(layer):
            for idx, conv in layer.conv_states.items():
                if conv is not None:
                    target.update_conv_state(conv.clone(), idx, conv_kernel_size=layer.conv_kernel_size.get(idx))
                if layer.recurrent_states.get(idx) is not None:
                    target.update_recurrent_state(layer.recurrent_states[idx].clone(), idx)
        if layers.has_kv(layer):
            rebuilt.update(layer.keys.clone(), layer.values.clone(), i)
    return rebuilt


def _factory(cache: Any, config: Any) -> Any:
    pairs, linear, processed = export_tensors(cache)
    return kv_cache_from_tensors(pairs, config, processed_length=processed, linear_states=linear)


REBUILDS = {
    "control recipe": (lambda c, cfg: rebuilds.control_rebuild(c), rebuilds.CONTROL_HOW),
    "hand-written (layer methods)": (hand_rebuild, "DynamicCache(config) + update() / update_conv_state() / "
                                     "update_recurrent_state(), no token count"),
    "kit family rebuild": (rebuilds.family_rebuild, "helpers.families.rebuilds.family_rebuild (carries the linear count)"),
    "kit factory": (_factory, "kvresume.kv_cache_from_tensors(export_tensors(cache))"),
}


def rebuild_rows(family: Family, ids: torch.Tensor) -> list[dict[str, Any]]:
    """The cache of ids[:-1] rebuilt each way of REBUILDS: the length it reports, how many tokens generate() with
    the full ids and mask then feeds, its first-step logits against the original cache's (bitwise expected)."""
    original = family.new_cache()
    forward(family.model, ids[:, :-1], original)
    mask = torch.ones_like(ids)
    base = generate_first_step(family.model, ids, copy.deepcopy(original), attention_mask=mask)
    rows = [{"rebuild": "original", "length": reported_length(original), "fed": (base.first_call.get("input_ids_shape") or [None, None])[1],
             "max_abs_diff": 0.0, "how": "the cache of the prefill itself"}]
    for name, (build, how) in REBUILDS.items():
        row: dict[str, Any] = {"rebuild": name, "how": how}
        try:
            rebuilt = build(original, family.model.config)
        except Exception as exc:  # noqa: BLE001 - a rebuild that cannot be made is a measurement
            rows.append({**row, "error": error_line(exc)})
            continue
        row["length"] = reported_length(rebuilt)  # before generate() extends it
        got = generate_first_step(family.model, ids, rebuilt, attention_mask=mask)
        rows.append({**row, "fed": (got.first_call.get("input_ids_shape") or [None, None])[1],
                     "max_abs_diff": max_abs_diff(base.logits, got.logits) if got.ok else None,
                     "error": got.error_summary() or None})
    return rows


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
