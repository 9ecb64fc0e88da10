"""The triage tree's walk: control 0's differing cells pick the candidate leaves, each candidate's repair decides.

A leaf is named only when the repair it prescribes, run by the kit (`helpers.triage.repairs`), brings the step
back to the full forward within the noise floor; for the loss leaves (compression_information_loss,
reconstruction_copy), which no repair can fix, when every repair that applies has removed what it can, both
numbers shown. A repair that does not restore moves the walk on. Pure: numbers in, a leaf and its path out.
"""
from __future__ import annotations

from typing import Any

from .facts import (CHANGED, COMPRESSION, Controls, Repair, consistent, identical, metadata_differs, model_state_differs,
                    slot_layers, slot_verdict)

# repair names, in the order the walk tries them, and the leaf each one names when it restores
FULL_MASK, SAVED_STATE, REREGISTER, REFEED, CROP, AT_PROCESSED = (
    "full_mask", "saved_state", "reregister_via_update", "refeed_whole_ids", "crop_to_processed", "continue_at_processed_length")
POSITION_ORDER = "position_order"  # an eviction stored out of position order, put back in order: names no leaf
REPAIR_LEAF = {FULL_MASK: "resume_contract", SAVED_STATE: "model_side_state", REREGISTER: "cache_metadata",
               REFEED: "prefix_short", CROP: "extra_slots", AT_PROCESSED: "compression_positions"}

# (node id, depth, question, leaf reached when the answer is yes)
NODES = (
    ("identical", 0, "original and rebuilt behave identically under identical arguments", None),
    ("fresh_state", 1, "resumed on a fresh instance, it differs until the saved model-side state is restored "
     "(repair: saved state)", "model_side_state"),
    ("no_defect", 1, "the rebuild has no defect (what fails, fails for both: the resume contract, a note)", "no_defect"),
    ("only_rebuilt", 0, "only the rebuilt cache differs: control 0's differing cells pick the candidates, "
     "each candidate's repair is run", None),
    ("full_mask", 1, "repair: the full mask (cached slots + suffix) restores the full forward", "resume_contract"),
    ("model_state", 1, "control 0: the model-side state (rope_deltas) differs; repair: the saved state restored",
     "model_side_state"),
    ("metadata", 1, "control 0: layer class, is_initialized or reported length vs stored slots differ; repair: the "
     "same K/V re-registered through update() on DynamicCache(config=...)", "cache_metadata"),
    ("prefix_short", 1, "slot comparison: the original's first slots, N short (not compression); repair: re-feed the "
     "missing tokens (the whole ids to generate())", "prefix_short"),
    ("extra_slots", 1, "slot comparison: every original slot, then slots no original slot holds; repair: crop to the "
     "processed length", "extra_slots"),
    ("compressed", 1, "slot comparison: original slots evicted (first, middle, last), in position order or not; repair: "
     "continue at the processed length", None),
    ("order_harmless", 2, "the retained slots are stored out of position order; repair: put them back in position order: "
     "it changes nothing (each key carries its rotation), so the order is harmless", None),
    ("positions_restore", 2, "the repair restores the full forward", "compression_positions"),
    ("positions_and_loss", 2, "the repair changes generate()'s step (a position defect), what remains differs "
     "from the full forward (the compression's loss)", "compression_positions_and_loss"),
    ("information_lost", 2, "the repair changes nothing (generate() already continues at the processed length); "
     "what remains is the compression's loss", "compression_information_loss"),
    ("unresolved", 2, "the repair raised: no single mask fits the per-layer lengths", "compression_unresolved"),
    ("kv_differ", 1, "slot comparison: slots no original slot holds, another layer's slots, a slot stored twice, or an "
     "order that matters (no generic repair: localized)",
     "reconstruction_copy"),
    ("nothing_visible", 1, "no cell of control 0 explains it and no repair restores", "unexplained"),
)
QUESTIONS = {n[0]: n[2] for n in NODES}


class _Walk:
    """The path taken and the repairs tried, in order."""

    def __init__(self, c: Controls) -> None:
        self.c, self.path, self.tried = c, [], []

    def step(self, node: str, answer: bool, **numbers: Any) -> bool:
        self.path.append({"node": node, "question": QUESTIONS[node], "answer": bool(answer), "numbers": numbers})
        return bool(answer)

    def repair(self, name: str) -> Repair | None:
        """A repair the kit ran (recorded as tried), None when it did not apply to this cache."""
        r = self.c.repairs.get(name)
        if r is not None and name not in [t.name for t in self.tried]:
            self.tried.append(r)
        return r

    def restores(self, name: str) -> bool:
        r = self.repair(name)
        return r is not None and r.restores(self.c.floor)

    def numbers(self, name: str) -> dict[str, Any]:
        r = self.c.repairs.get(name)
        return {f"{name}_max_abs_diff": None if r is None else r.max_abs_diff,
                **({f"{name}_error": r.error} if r is not None and not r.ok else {}), "noise_threshold": self.c.floor.threshold}

    def done(self, leaf: str, **extra: Any) -> dict[str, Any]:
        return {"branch": leaf, "path": self.path, "repairs": [r.record(self.c.floor) for r in self.tried],
                "notes": notes(self.c, leaf), **extra}


LOSS = ("compression_positions_and_loss", "compression_information_loss")
SLOT_LEAVES = ("prefix_short", "extra_slots", "compression_positions", *LOSS, "compression_unresolved", "reconstruction_copy")


def notes(c: Controls, leaf: str) -> dict[str, Any]:
    """What a leaf without a restoring repair tells the user: what remains against the identity rebuild's, where the
    copy differs and whether top-1/top-5 survive, and why per-layer lengths cannot share one mask."""
    out: dict[str, Any] = {}
    r = c.repairs.get(AT_PROCESSED)
    if leaf in LOSS and r is not None:
        ident = c.identity_remaining
        out["remaining"] = {"after_continue_at_processed_length": r.max_abs_diff, "identity_vs_full_forward": ident,
                            "noise_threshold": c.floor.threshold,
                            "times_identity": None if not ident or r.max_abs_diff is None else r.max_abs_diff / ident}
    if leaf == "reconstruction_copy":
        out["localized"], out["topk"] = c.localized, c.topk
    differing = slot_layers(c.slots, *COMPRESSION, "extra", *CHANGED)
    if leaf in SLOT_LEAVES and differing and c.rebuilt_state is not None and c.rebuilt_state.slots:
        out["slots"] = {"layers": differing, "first": c.rebuilt_state.slots[differing[0]]}
    stored = {s.stored for s in c.rebuilt_state.layers if s.stored is not None} if c.rebuilt_state else set()
    if len(stored) > 1 and slot_verdict(c.slots) in COMPRESSION:  # a compression that left the layers different lengths
        raised = r is not None and not r.ok
        out["per_layer"] = {"stored_slots": [s.stored for s in c.rebuilt_state.layers],
                            "why": "no single attention mask fits different per-layer lengths under eager attention or "
                                   "a multi-token suffix (the mask is sized from one layer)",
                            "this_run": f"continuing at the processed length raised {r.error}" if raised else
                            "this run's steps ran (a one-token suffix under sdpa needs no real mask)"}
    return out


def choose_branch(c: Controls) -> dict[str, Any]:
    """Walk the tree; {'branch', 'path' (decisions with their numbers), 'repairs' (tried: name, max_abs_diff, restores)}."""
    w = _Walk(c)
    same, numbers = identical(c)
    if w.step("identical", same, **numbers):
        if c.resume_on == "fresh_instance" and c.fresh_bare_diff is not None:
            fresh = c.floor.differs(c.fresh_bare_diff) and w.restores(SAVED_STATE)
            if w.step("fresh_state", fresh, fresh_without_state=c.fresh_bare_diff, **w.numbers(SAVED_STATE)):
                return w.done("model_side_state")
        w.repair(FULL_MASK)
        failing = [a.name for a in c.arg_sets if not a.original_ok]
        w.step("no_defect", True, fail_for_both=failing, work_for_both=[a.name for a in c.arg_sets if a.original_ok],
               **w.numbers(FULL_MASK))
        return w.done("no_defect", note="resume_contract")
    w.step("only_rebuilt", True, differing=[a.name for a in c.arg_sets if not consistent(a, c.floor)])
    if w.step("full_mask", w.restores(FULL_MASK), **w.numbers(FULL_MASK)):
        return w.done("resume_contract")
    state = model_state_differs(c)
    if w.step("model_state", state and w.restores(SAVED_STATE), state_differs=state, **(w.numbers(SAVED_STATE) if state else {})):
        return w.done("model_side_state")
    meta = metadata_differs(c)
    if w.step("metadata", bool(meta) and w.restores(REREGISTER), layers_differing=meta,
              **(w.numbers(REREGISTER) if meta else {})):
        return w.done("cache_metadata")
    kind, shown = slot_verdict(c.slots), _slot_numbers(c)
    for node, fix, of_kind in (("prefix_short", REFEED, "prefix_short"), ("extra_slots", CROP, "extra")):
        if kind == of_kind and w.step(node, w.restores(fix), **shown, **w.numbers(fix)):  # asked only of its kind
            return w.done(node)
    if w.step("compressed", kind in COMPRESSION, **shown, processed_length=c.processed_length,
              stored_slots=[s.stored for s in c.rebuilt_state.layers] if c.rebuilt_state else None):
        if kind != "reordered" or _order_harmless(c, w):
            return w.done(_compression_leaf(c, w))
        w.step("kv_differ", True, **shown, **w.numbers(POSITION_ORDER))
        return w.done("reconstruction_copy")
    if w.step("kv_differ", kind in CHANGED, **shown, **w.numbers(FULL_MASK)):
        return w.done("reconstruction_copy")
    restoring = [name for name in REPAIR_LEAF if w.restores(name)]  # every repair shown; none names a leaf here
    w.step("nothing_visible", True, slots=kind, restoring_repairs_without_a_table_cell=restoring)
    return w.done("unexplained")


def _slot_numbers(c: Controls) -> dict[str, Any]:
    """The slot comparison's verdict and the layers of each kind (what the slot decisions show)."""
    kinds = ("prefix_short", "extra", "evicted", "reordered", *CHANGED)
    return {"slots": slot_verdict(c.slots), **{f"layers_{k}": slot_layers(c.slots, k) for k in kinds if slot_layers(c.slots, k)}}


def _order_harmless(c: Controls, w: _Walk) -> bool:
    """An eviction stored out of position order: putting the slots back in order leaves generate()'s step within the
    floor (measured; not run or raised: the order is not shown harmless)."""
    r = w.repair(POSITION_ORDER)
    harmless = r is not None and r.ok and r.vs_unrepaired is not None and c.floor.matches(r.vs_unrepaired)
    return w.step("order_harmless", harmless, position_order_vs_generate=None if r is None else r.vs_unrepaired,
                  **w.numbers(POSITION_ORDER))


def _compression_leaf(c: Controls, w: _Walk) -> str:
    """Continue at the processed length: restores, raises, changes the step (positions + loss) or not (loss)."""
    r = w.repair(AT_PROCESSED)
    e = c.extra
    numbers = {"generate_position": e.get("generate_position"), "logical_position": e.get("logical_position"),
               "repaired_vs_generate": None if r is None else r.vs_unrepaired, **w.numbers(AT_PROCESSED),
               "identity_vs_full_forward": c.identity_remaining}
    if w.step("positions_restore", r is not None and r.restores(c.floor), **numbers):
        return "compression_positions"
    raised = r is None or not r.ok
    if w.step("unresolved", raised, **({"error": "not run" if r is None else r.error} if raised else {})):
        return "compression_unresolved"
    moved = r.vs_unrepaired is None or c.floor.differs(r.vs_unrepaired)
    if w.step("positions_and_loss", moved, **({"repaired_vs_generate": r.vs_unrepaired} if moved else {})):
        return "compression_positions_and_loss"
    w.step("information_lost", True, repaired_vs_generate=r.vs_unrepaired, noise_threshold=c.floor.threshold)
    return "compression_information_loss"
