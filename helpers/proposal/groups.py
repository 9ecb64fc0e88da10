"""The kit's own resume calls, as notebook 08's cells: 02's matrix, 03's rope_deltas, 04's boundary, 06's one-token
case, 07's families, 09's new-image turn, 10's rollbacks and rebuilds.

Each group builds its calls with the helpers of the notebook it comes from (caches.build_variants,
continuation.generation_kwargs, boundary.splits.run_all, triage.controls.arg_kwargs, regress.checks.Runner,
rollback.probes) and judges every plain call against that notebook's reference with a noise floor measured in the
same run. The caller's processed length given to the guard is what the caller of that notebook knows: the tokens
before the suffix. Group 10: a cache rolled back with crop(-k) the way notebook 10 does, where this release offers it
(a crop or a recording that raises is transformers' own refusal: no cell), continued by generate() with the whole
sequence (the 20 kept tokens + the next unseen one) and its mask, against the cache that never saw the k tokens; a
hybrid rebuilt by hand and by the factory, continued with the full ids, against the original; and transformers' own
assisted decoding on the hybrid (internal calls).
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from .. import caches
from ..boundary import splits

from kvresume import compat
from ..compare import NoiseFloor, noise_floor
from ..continuation import GENERATION_VARIANTS, current_position_ids, generate_first_step, generation_kwargs, prefill
from ..inputs import Prompt
from ..newimage import repair, shapes as turn_shapes, turns
from ..families import checks, rebuilds, setup as family_setup
from ..rollback import probes, setup
from ..rollback.probes import greedy, repetitive_ids
from ..triage import controls as triage_controls, facts as triage_facts, slots as triage_slots
from ..triage import patterns as triage_patterns, run as triage_run
from .cells import Cell, run_cell
from .shapes import checked_calls, kernel_floor


def _state(model: torch.nn.Module) -> Any:
    """The model-side position state as it is now (a copy), or "keep" for a model that keeps none."""
    state = compat.get_rope_state(model) if compat.rope_state_owner(model) is not None else "keep"
    return state.clone() if isinstance(state, torch.Tensor) else state


def group_02(model: torch.nn.Module, prompt: Prompt, dtype: torch.dtype) -> tuple[list[Cell], dict[str, Any]]:
    """02's four cache variants x four argument sets, against the full forward (floor: sdpa vs eager)."""
    reference, floor, prefix = kernel_floor(model, prompt, dtype)
    positions = current_position_ids(model, prompt)
    variants = {n: v for n, v in caches.build_variants(prefix, model.config).items() if v.cache is not None}
    processed, state = prompt.length - 1, _state(model)
    cells = [run_cell("02", f"{name} · {g}", model, prompt.last_token, v.cache, generation_kwargs(g, prompt, positions),
                      reference, floor, processed, whole=prompt, state=state)
             for g in GENERATION_VARIANTS for name, v in variants.items()]
    return cells, floor.evidence()


def _boundary_kwargs(run: splits.Run, prompt: Prompt, positions: torch.Tensor) -> dict[str, Any]:
    """The arguments 04's generate() run was given (its `args` label read back)."""
    length = prompt.length + (1 if run.boundary == "double processing" else 0)
    kwargs: dict[str, Any] = {}
    if "mask" in run.args and run.args != "no mask":
        kwargs["attention_mask"] = torch.ones(prompt.attention_mask.shape[0], length, dtype=prompt.attention_mask.dtype,
                                              device=prompt.attention_mask.device)
    if "positions" in run.args:
        kwargs["position_ids"] = positions
    return kwargs


def group_04(model: torch.nn.Module, prompt: Prompt, dtype: torch.dtype) -> tuple[list[Cell], dict[str, Any]]:
    """04's generate() runs (valid split; prompt[-1] re-fed to a cache of the whole prompt), the plain outcomes 04's own."""
    reference, runs, _ = splits.run_all(model, prompt)
    valid = [r.outcome.logits for r in runs if r.boundary == "valid split" and r.outcome.ok]
    floor = noise_floor(reference, valid, dtype, what="valid split vs full forward")
    _, full_cache = prefill(model, prompt, end=None)
    _, prefix = prefill(model, prompt)  # the model-side state of the valid split's prefill, as 04 leaves it
    rebuilt = compat.cache_from_pairs(compat.kv_pairs(full_cache), compat.text_config(model.config))
    cache_of = {"original": full_cache, "rebuilt_update": rebuilt}
    positions, state = current_position_ids(model, prompt), _state(model)
    cells = []
    for r in runs:
        if r.call != "generate":
            continue
        cache = prefix if r.boundary == "valid split" else cache_of[r.cache]
        cells.append(run_cell("04", f"{r.boundary} · {r.cache} · {r.args}", model, prompt.last_token, cache,
                              _boundary_kwargs(r, prompt, positions), reference, floor, prompt.length - 1, plain=r.outcome,
                              whole=prompt, state=state))
    return cells, floor.evidence()


def exact_prefix(original: Any, cache: Any) -> bool:
    """06's slot comparison: the cache holds the original's slots as a prefix one short or with slots of another request
    after them (crop_short, reused_no_copy), nothing evicted or changed: the prompt's full forward is what a resume of it
    must give (06's repairs restore it), not the explicit-position forward over what it holds."""
    return triage_facts.slot_verdict(triage_slots.compare(original, cache)) in ("prefix_short", "extra")


def group_06(bundle: Any, prompt: Prompt, sink: int = 4, window: int = 16) -> tuple[list[Cell], dict[str, Any]]:
    """06's one-token case: each built-in rebuild x the four argument sets, against that rebuild's explicit-position
    forward (logical positions, full mask: an engine's resume of the same cache; an exact prefix short or extended:
    the full forward), 06's floor."""
    prompt = triage_patterns.resume_of(prompt, prompt.length - 1)  # 06's one_token pattern on a dynamic cache
    base = triage_run.prepare(bundle, prompt)
    applied = triage_run.apply_all(base, triage_run.load_specs("all", sink, window))
    model, processed = base.model, prompt.length - 1
    cells = []
    for name, a in applied.items():
        cache = a.rebuilt.cache
        logical = a.rebuilt.processed_length if a.rebuilt.processed_length is not None else processed
        compat.put_rope_state(model, base.saved_state)
        explicit = triage_controls.explicit_step(model, prompt, cache, triage_controls.logical_positions(model, prompt, logical))
        reference = explicit.logits if explicit.ok else None
        if exact_prefix(base.prefix_cache, cache):  # nothing compressed: the engine's resume is the full forward's
            reference = base.reference
        physical = int(cache.get_seq_length())
        for arg_set in triage_controls.ARG_SETS:
            kwargs = triage_controls.arg_kwargs(arg_set, prompt, physical, base.positions)
            compat.put_rope_state(model, base.saved_state)
            cell = run_cell("06", f"{name} · {arg_set}", model, prompt.last_token, cache, kwargs, reference, base.floor, logical,
                            whole=prompt, state=base.saved_state)
            if cell.guard_check in ("uneven_layers", "positions_at_processed"):  # its message: positions at `logical`
                cell.fix = {"position_ids": triage_controls.logical_positions(model, prompt, logical)}
            if reference is None and cell.plain != "raised":
                cell.undecided = f"no reference: the explicit-position forward raised ({explicit.error_type})"
            cells.append(cell)
    return cells, base.floor.evidence()


def family_cells(run: checks.Runner) -> tuple[list[Cell], NoiseFloor]:
    """One family: the original cache under the four argument sets, the rebuilds (full mask), the padded masks."""
    fam = run.family
    reference = family_setup.reference(fam)
    full = {"attention_mask": fam.full_mask}
    agreeing = [checks.other_attention_reference(fam)]
    floor = noise_floor(reference, agreeing, fam.bundle.dtype, what="full forward vs the other attention kernel's")
    # the caller's processed length; a left-padded batch's caller knows each row's own (unpadded) count
    processed: Any = [int(r.numel()) - 1 for r in fam.rows] if fam.padded else fam.processed_length
    model = fam.model

    def cell(name: str, cache: Any, kwargs: dict[str, Any]) -> Cell:
        plain = run.generate(cache, **kwargs)  # from the prefill's model-side state (Runner.generate puts it back)
        run._restore(model)
        made = run_cell("07", f"{fam.name} · {name}", model, fam.suffix, cache, kwargs, reference, floor, processed, plain=plain,
                        whole=fam.prompt, state=_state(model))
        if made.guard_check == "linear_state":  # its message: rebuild it with its states (the family's own rebuild)
            made.fix = {"cache": rebuilds.family_rebuild(run.cache, model.config)}
        run._restore(model)
        return made

    out = [cell(f"original · {v}", run.cache, run.arg_kwargs(v)) for v in GENERATION_VARIANTS]
    try:
        out.append(cell("control_rebuild · mask_only", rebuilds.control_rebuild(run.cache), full))
    except AttributeError:
        pass  # a hybrid cache: the control's loop cannot read linear layers (07's finding); no resume call to guard
    if any(l is None for l in checks.layers.widths(run.cache)):
        out.append(cell("attention_only_rebuild · mask_only", rebuilds.attention_only_rebuild(run.cache, model.config), full))
    out.append(cell("family_rebuild · mask_only", rebuilds.family_rebuild(run.cache, model.config), full))
    if fam.padded:
        masks = checks.resume_masks(fam.full_mask)
        out += [cell(f"original · {label} mask", run.cache, {"attention_mask": masks[label]}) for label in ("suffix_only", "all_ones")]
    return out, floor


def group_07(runs: dict[str, checks.Runner]) -> tuple[list[Cell], dict[str, NoiseFloor]]:
    """07's families (one Runner each: its prefix cache), each through `family_cells`; cells and each family's floor."""
    measured = {name: family_cells(run) for name, run in runs.items()}
    return [c for cells, _ in measured.values() for c in cells], {name: floor for name, (_, floor) in measured.items()}


def group_03(model: torch.nn.Module, prompt: Prompt, dtype: torch.dtype) -> tuple[list[Cell], dict[str, Any]]:
    """03's silent case on Qwen3-VL: a mask-only resume with the model's rope_deltas missing (a fresh instance) or
    stale (a text-only prompt's zeros), against the full forward (floor: sdpa vs eager). The model's state is put
    back before each call and after the group."""
    reference, floor, prefix = kernel_floor(model, prompt, dtype)
    saved = compat.get_rope_state(model)
    kwargs = {"attention_mask": prompt.attention_mask}
    cells = [run_cell("03", name, model, prompt.last_token, prefix, kwargs, reference, floor, prompt.length - 1,
                      whole=prompt, state=state, reset=True)
             for name, state in (("rope_deltas missing · mask_only", None),
                                 ("rope_deltas stale · mask_only", None if saved is None else torch.zeros_like(saved)))]
    compat.put_rope_state(model, saved)
    return cells, floor.evidence()


def group_09(bundle: Any, seed: int = 0) -> tuple[list[Cell], dict[str, Any]]:
    """09's new image in a resumed Qwen3-VL chat: every call shape this release takes (helpers.newimage.shapes) and the
    repair (generate() at turn 2's positions from the full sequence), each from a copy of turn 1's cache with
    rope_deltas at turn 1's value, against one forward over both turns (the text-only turn: over its own), 09's floor.
    None on a model without multimodal position state; the model's state is put back afterwards."""
    model = bundle.model
    if not bundle.is_multimodal or compat.rope_state_owner(model) is None:
        return [], {}
    saved = compat.get_rope_state(model)
    chat = turns.build(bundle, seed)
    reference = turns.reference(model, chat)
    text_reference = prefill(model, chat.text_turn()[1], end=None)[0]
    floor = turns.noise_floor(model, chat, reference, bundle.dtype)
    cache = turns.turn1_cache(model, chat)
    turn1 = compat.get_rope_state(model).clone()
    calls = [(s.label, *turn_shapes.call_kwargs(model, s, chat), text_reference if s.ids == "text" else reference)
             for s in turn_shapes.SHAPES if not turn_shapes.unsupported(model, s, chat)]
    calls.append(("repair: generate() at the full-sequence positions",
                  *repair.call_kwargs(chat, repair.full_positions(model, chat)), reference))
    own = dict(chat.full_prompt().mm_kwargs)  # resume: the whole conversation, both images
    cells = [run_cell("09", name, model, ids, cache, kwargs, ref, floor, chat.cached, state=turn1, reset=True,
                      whole=chat.full_ids if ref is reference else None, resume_kwargs=own)
             for name, ids, kwargs, ref in calls]
    for cell in cells:  # new_vision_tokens names 09's route: generate() at the full-sequence positions
        if cell.guard_check == "new_vision_tokens":
            cell.fix = {"call": calls[-1][1:3]}
    compat.put_rope_state(model, saved)
    return cells, floor.evidence()


PROMPT, K = setup.PROMPT, 4


ROLLBACKS = (("dense", "plain"), ("sliding", "record"), ("static", "plain"), ("hybrid", "record"), ("hybrid", "record_keep"))


def _cell(name: str, family: setup.Family, ids: torch.Tensor, cache: Any, reference: torch.Tensor, floor: Any,
          processed: int) -> Cell:
    """One group-10 cell: generate() over `ids` with its mask from `cache`."""
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
