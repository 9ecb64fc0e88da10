"""Notebook 10's resume calls as notebook 08's cells (group "10"): a cache rolled back with crop(-k), then continued by
generate() with the whole sequence (the 20 kept tokens + the next unseen one) and its mask; a hybrid rebuilt by hand and
by the factory, continued with the full ids; and transformers' own assisted decoding on the hybrid (internal calls).

Each rollback runs the way notebook 10 does (helpers.rollback.probes) on tracked models, where this release offers it
(a crop or a recording that raises is transformers' own refusal, no resume call: no cell). The reference is the
cache that never saw the k tokens (the rollback) or the original cache (the rebuilds); the floor notebook 10's.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from ..continuation import generate_first_step
from ..rollback import probes, setup
from ..rollback.generation import greedy, repetitive_ids
from .cells import Cell, run_cell
from .shapes import checked_calls

PROMPT, K = setup.PROMPT, 4


ROLLBACKS = (("dense", "plain"), ("sliding", "record"), ("static", "plain"), ("hybrid", "record"), ("hybrid", "record_keep"))


def _cell(name: str, family: setup.Family, ids: torch.Tensor, cache: Any, reference: torch.Tensor, floor: Any,
          processed: int) -> Cell:
    kwargs = {"attention_mask": torch.ones_like(ids)}
    return run_cell("10", name, family.model, ids, cache, kwargs, reference, floor, processed, whole=ids)


def rollback_cells(fams: dict[str, setup.Family], seed: int = 0) -> list[Cell]:
    """Each family's crop(-K) the way notebook 10 rolls it back, continued by generate() over the whole sequence."""
    cells = []
    for name, mode in ROLLBACKS:
        fam = fams[name]
        ids = setup.token_ids(PROMPT + K + 1, fam.model, seed)
        cache = probes.rolled_back(fam, ids, PROMPT, K, mode)[0]
        if cache is None:  # transformers' own refusal: no resume call to guard
            continue
        whole = torch.cat([ids[:, :PROMPT], ids[:, PROMPT + K:]], 1)
        reference = generate_first_step(fam.model, whole, fam.new_cache(), attention_mask=torch.ones_like(whole)).logits
        floor = setup.floor_of(fam.model, whole, fam.model.dtype, fam.new_cache)
        cells.append(_cell(f"{name} · crop(-{K}) · {probes.MODE_HOW[mode]}", fam, whole, cache, reference, floor, PROMPT))
    return cells


def rebuild_cells(fam: setup.Family, seed: int = 0) -> list[Cell]:
    """The hybrid's cache of ids[:-1] rebuilt by hand (no token count) and by the factory, continued with the full ids."""
    ids = setup.token_ids(PROMPT + K, fam.model, seed)
    original = fam.new_cache()
    setup.forward(fam.model, ids[:, :-1], original)
    reference = generate_first_step(fam.model, ids, copy.deepcopy(original), attention_mask=torch.ones_like(ids)).logits
    floor = setup.floor_of(fam.model, ids, fam.model.dtype, fam.new_cache)
    built = {"hand-written rebuild (layer methods, no token count)": probes.hand_rebuild(original, fam.model.config),
             "kit factory rebuild": probes._factory(original, fam.model.config)}
    return [_cell(f"hybrid · {name}", fam, ids, cache, reference, floor, PROMPT + K - 1) for name, cache in built.items()]


def assisted_calls(fam: setup.Family, seed: int = 0) -> list[dict[str, Any]]:
    """transformers' own assisted decoding on the hybrid (prompt lookup, the model as its own assistant): every
    internal call checked on its own arguments (none where the release refuses assisted decoding on it)."""
    rows: list[dict[str, Any]] = []
    ids = repetitive_ids(fam.model, seed)
    for way, kwargs in (("prompt lookup", {"prompt_lookup_num_tokens": 3}), ("own assistant", {"assistant_model": fam.model})):
        with checked_calls((fam.model,), rows, f"10 hybrid assisted · {way}"):
            greedy(fam.model, ids, **kwargs)
    return rows


def group_10(dense: torch.nn.Module, sliding: torch.nn.Module, hybrid: torch.nn.Module,
             seed: int = 0) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Notebook 10's cells (rollbacks, rebuilds) and the hybrid's assisted-decoding internal calls, on the models the
    notebook tracked (`track(model)`: the cells' caches carry their ledger)."""
    fams = setup.families(hybrid, seed, dense, sliding)
    return rollback_cells(fams, seed) + rebuild_cells(fams["hybrid"], seed), assisted_calls(fams["hybrid"], seed)
