"""Notebook 08's factory and resume-state measurements: round trips per family, malformed inputs, fresh instances.

`factory_round_trips` rebuilds each of 07's family caches through `kv_cache_from_tensors` and compares it with
the original (layer classes, K/V bits, reported lengths, linear states, `get_seq_length()`). `refusals` feeds the
factory malformed inputs derived from those caches and records each FactoryError. `portability` saves a resume
state (helpers.resume), loads it into a fresh instance and continues, with and without the model-side hook.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from kvresume import compat, state as resume
from ..compare import NoiseFloor, max_abs_diff
from ..continuation import generate_first_step
from ..families import checks
from kvresume import layers
from kvresume.factory import FactoryError, export_tensors, kv_cache_from_tensors


def factory_round_trips(runs: dict[str, checks.Runner]) -> dict[str, dict[str, Any]]:
    """Per family: the factory's cache vs the original, layer by layer (bitwise) and by reported length."""
    out = {}
    for name, run in runs.items():
        fam, original = run.family, run.cache
        pairs, states, processed = export_tensors(original)
        built = kv_cache_from_tensors(pairs, fam.model.config, processed_length=processed, linear_states=states)
        out[name] = {"state_equal": layers.cache_state_equal(original, built),
                     "seq_length": [int(original.get_seq_length()), int(built.get_seq_length())],
                     "layer_classes": [type(l).__name__ for l in compat.cache_layers(built)],
                     "lengths": layers.lengths(built), "widths": layers.widths(built), "linear_layers": sorted(states)}
    return out


def _malformed(runs: dict[str, checks.Runner]) -> list[tuple[str, str, Any, Any, dict[str, Any]]]:
    """(what is wrong, a word the message must name, the factory's pairs, config and keywords) per malformed input."""
    d_pairs, _, d_len = export_tensors(runs["dense"].cache)
    s_pairs, _, s_len = export_tensors(runs["sliding"].cache)
    h_pairs, h_states, h_len = export_tensors(runs["hybrid"].cache)
    dc, sc, hc = (runs[n].family.model.config for n in ("dense", "sliding", "hybrid"))
    k, v = d_pairs[1]

    def dense(i: int, pair: Any) -> list[Any]:
        """The dense family's pairs with layer i's replaced by `pair`."""
        return [pair if j == i else p for j, p in enumerate(d_pairs)]

    full_window = [(k.new_zeros(1, k.shape[1], 20, k.shape[-1]),) * 2 if i % 2 == 0 else p for i, p in enumerate(s_pairs)]
    hybrid = {"processed_length": h_len, "linear_states": h_states}
    return [
        ("one layer too few", "layer count", d_pairs[:-1], dc, {}),
        ("keys of rank 3", "rank", dense(1, (k[0], v[0])), dc, {}),
        ("K/V heads other than the config's", "heads", dense(1, (k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1))), dc, {}),
        ("head_dim other than the config's", "head_dim", dense(1, (k[..., :8], v[..., :8])), dc, {}),
        ("keys and values of different lengths", "K vs V", dense(1, (k, v[:, :, :-1])), dc, {}),
        ("one layer in float16", "dtype", dense(2, (k.half(), v.half())), dc, {}),
        ("one layer on another device", "device", dense(2, (k.to("meta"), v.to("meta"))), dc, {}),
        ("one layer with batch 2", "batch size", dense(3, (k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1))), dc, {}),
        ("an attention layer given no K/V", "given no K/V", dense(0, None), dc, {}),
        ("a sliding layer given more slots than its window", "window", full_window, sc, {"processed_length": s_len}),
        ("a full sliding window without processed_length", "processed_length", s_pairs, sc, {}),
        ("a linear-attention layer given K/V", "linear-attention layer", [h_pairs[3], *h_pairs[1:]], hc, hybrid),
        ("a linear-attention layer given no states", "conv/recurrent", h_pairs, hc,
         {**hybrid, "linear_states": {i: s for i, s in h_states.items() if i != 0}}),
        ("processed_length smaller than the stored slots", "processed_length", d_pairs, dc,
         {"processed_length": d_len - 5}),
        ("a negative processed_length", "processed_length", d_pairs, dc, {"processed_length": -1}),
        ("a bare tensor instead of a (keys, values) pair", "pair", dense(1, k), dc, {}),
    ]


def refusals(runs: dict[str, checks.Runner]) -> list[dict[str, Any]]:
    """Each malformed input: refused with a FactoryError? its message, and whether it names the mismatch."""
    rows = []
    for what, word, pairs, config, kwargs in _malformed(runs):
        try:
            kv_cache_from_tensors(pairs, config, **kwargs)
            refused, message = False, ""
        except FactoryError as exc:
            refused, message = True, str(exc)
        except Exception as exc:  # noqa: BLE001 - another exception is not a refusal naming the mismatch
            refused, message = False, f"{type(exc).__name__}: {exc}"[:200]
        rows.append({"input": what, "refused": refused, "message": message, "expected_word": word,
                     "names_mismatch": refused and word.lower() in message.lower()})
    return rows


def _step(model: torch.nn.Module, cache: Any, state: resume.ResumeState) -> Any:
    return generate_first_step(model, state.suffix_ids, copy.deepcopy(cache), attention_mask=state.attention_mask)


def portability(run: checks.Runner, directory: Path, floor: NoiseFloor) -> dict[str, Any]:
    """Same instance vs a fresh instance from the saved state (hook restored), and a fresh one without the hook."""
    fam = run.family
    run._restore(fam.model)
    state = resume.capture(fam.model, run.cache, fam.suffix, fam.full_mask)
    same = _step(fam.model, run.cache, state)
    loaded = resume.round_trip(state, directory, device=fam.bundle.device)
    fresh = fam.bundle.fresh_instance()
    restored = _step(fresh, resume.restore(fresh, loaded), loaded)
    bare_model = fam.bundle.fresh_instance()
    bare_cache = kv_cache_from_tensors([(k, v) for k, v in loaded.kv], bare_model.config,
                                       processed_length=loaded.processed_length)
    bare = _step(bare_model, bare_cache, loaded)
    hook = sorted(state.model_metadata)
    return {"family": fam.name, "hook": hook, "same_ok": same.ok, "restored_ok": restored.ok, "bare_ok": bare.ok,
            "restored_vs_same": max_abs_diff(same.logits, restored.logits) if same.ok and restored.ok else None,
            "bare_vs_same": max_abs_diff(same.logits, bare.logits) if same.ok and bare.ok else None,
            "restored_bitwise": bool(same.ok and restored.ok and torch.equal(same.logits, restored.logits)),
            **{k: v for k, v in floor.evidence().items() if k in ("noise_threshold", "noise_floor", "noise_margin")}}
