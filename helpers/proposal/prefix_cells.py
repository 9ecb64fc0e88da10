"""Notebook 08's prefix-caching cells: transformers' documented "Re-use Cache to continue generation" recipe, and a
left-padded prefix prefilled the way its snippet does.

The recipe: prefill a shared prefix once (`model(input_ids=prefix, past_key_values=DynamicCache(...))`), then for each
question `generate(prefix + question, past_key_values=copy.deepcopy(prompt_cache))`. Forgetting the deepcopy: the first
question's generate() extends the shared cache with its question and answer, and the second question gets it
(`recipe · no deepcopy`); with the deepcopy, the valid twin (`recipe · deepcopy`). At several (prefix, question 1,
question 2, answer) lengths. The padded prefix: two left-padded rows prefilled with `model(input_ids, attention_mask)`
and no positions (`padded prefix · no positions`), or with the mask's positions (`· mask positions`, the valid twin),
continued with generate() over the whole ids (prefix + 3 new tokens each). Each against the full forward over its
tokens (per row, unpadded) with the floor of the same model under the other attention kernel.
"""
from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

from .cells import Cell, run_cell
from ..families.setup import left_pad
from .shapes import VOCAB, floor_of, last_logits, per_row

# (prefix, question 1, question 2, answer tokens of question 1)
RECIPE_LENGTHS = ((8, 4, 10, 3), (16, 6, 12, 2), (8, 8, 4, 6), (12, 5, 5, 4))
PADDED_LENGTHS = (8, 14)


@torch.no_grad()
def recipe_cells(model: torch.nn.Module, seed: int = 0, lengths: tuple = RECIPE_LENGTHS) -> list[Cell]:
    """The documented recipe at each length, without the deepcopy (silently wrong or raising) and with it (valid)."""
    gen = torch.Generator().manual_seed(seed + 11)
    out = []
    for p, q1, q2, a in lengths:
        prefix, first, second = (torch.randint(10, VOCAB - 10, (1, n), generator=gen) for n in (p, q1, q2))
        shared = model(input_ids=prefix, past_key_values=DynamicCache(config=model.config)).past_key_values
        kept = copy.deepcopy(shared)
        ids1 = torch.cat([prefix, first], 1)
        model.generate(ids1, attention_mask=torch.ones_like(ids1), past_key_values=shared, max_new_tokens=a,
                       min_new_tokens=a, do_sample=False)
        ids = torch.cat([prefix, second], 1)
        ref = last_logits(model, input_ids=ids)
        floor = floor_of(model, {"input_ids": ids}, ref)
        mask = {"attention_mask": torch.ones_like(ids)}
        label = f"recipe P={p} Q1={q1} Q2={q2} A={a}"
        out += [run_cell("prefix", f"{label} · no deepcopy", model, ids, shared, mask, ref, floor, p, whole=ids),
                run_cell("prefix", f"{label} · deepcopy", model, ids, kept, mask, ref, floor, p, whole=ids)]
    return out


@torch.no_grad()
def padded_cells(model: torch.nn.Module, seed: int = 0, lengths: tuple = PADDED_LENGTHS) -> list[Cell]:
    """A left-padded prefix prefilled without positions (the padded row is wrong) and with the mask's (valid)."""
    gen = torch.Generator().manual_seed(seed + 13)
    rows = [torch.randint(10, VOCAB - 10, (n,), generator=gen) for n in lengths]
    ids, mask = left_pad(rows)
    new = torch.randint(10, VOCAB - 10, (len(rows), 3), generator=gen)
    whole, full = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new)], 1)
    ref, floor = per_row(model, [torch.cat([r, new[i]]).view(1, -1) for i, r in enumerate(rows)])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    bare = model(input_ids=ids, attention_mask=mask, past_key_values=DynamicCache(config=model.config)).past_key_values
    placed = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                   past_key_values=DynamicCache(config=model.config)).past_key_values
    processed = [len(r) for r in rows]
    kwargs = {"attention_mask": full}
    return [run_cell("prefix", "padded prefix · no positions", model, whole, bare, kwargs, ref, floor, processed, whole=whole),
            run_cell("prefix", "padded prefix · mask positions", model, whole, placed, kwargs, ref, floor, processed,
                     whole=whole)]


def population(model: torch.nn.Module, seed: int = 0) -> list[Cell]:
    """The recipe cells and the padded-prefix cells on one text model (tracked: `track(model)` first)."""
    return recipe_cells(model, seed) + padded_cells(model, seed)
