"""Notebook 08's five claims, each a function of measured cells and rows (never of typed verdicts)."""
from __future__ import annotations

from typing import Any

from ..compare import Decision
from . import blind
from .cells import Cell, confusion, counts

FAMILIES = ("dense", "multimodal", "sliding", "hybrid", "padded_batch")  # 07's families, every one required
MIN_REFUSALS = 10
SOURCE_API = {"control": "API directions: a validated from_kv_tensors()-style factory, validation in generate(), a "
                         "documented resume-state object, export/restore hooks, generation-equivalence tests (proposed, not built)"}


def _by_group(cells: list[Cell]) -> dict[str, dict[str, int]]:
    groups = list(dict.fromkeys(c.group for c in cells))
    return {g: counts([c for c in cells if c.group == g]) for g in groups}


def named(cells: list[Cell]) -> list[str]:
    return [f"{c.group}: {c.cell}" for c in cells]


def refused_calls(internal: list[dict[str, Any]] | None) -> list[str]:
    """The internal calls the guard refused, named."""
    return [f"{r['shape']} · {r['model']} call {r['call']}" for r in internal or [] if r.get("refused")]


def decide_guard_catches(cells: list[Cell]) -> Decision:
    """Every silently wrong cell (plain generate() ran and differs beyond the floor) is refused by the guard on
    generate()'s own inputs, or is a named blind spot (blind.BLIND_SPOTS: its inputs are those of a valid call)."""
    n = counts(cells)
    missed = blind.misses(cells)
    unnamed = [m["cell"] for m in missed if not m["why"]]
    holds = n["silently_wrong"] > 0 and not unnamed
    extra = [f"{c.group}: {c.cell}" for c in cells if not c.undecided and c.plain == "silently_wrong"
             and c.guard == "passed" and c.with_length == "raised"]
    why = (f"the guard raised on {n['caught']} of {n['silently_wrong']} silently wrong cells from generate()'s own "
           f"inputs; the {len(missed)} missed are named blind spots ({len(extra)} caught given processed_length)" if holds else
           "no cell was silently wrong: nothing to catch" if n["silently_wrong"] == 0 else
           f"{len(unnamed)} of {n['silently_wrong']} silently wrong cells passed the guard with no named reason: {unnamed}")
    return Decision(holds, why, {"counts": n, "counts_with_processed_length": counts(cells, "with_length"),
                                 "by_group": _by_group(cells), "confusion": confusion(cells),
                                 "confusion_with_processed_length": confusion(cells, "with_length"),
                                 "misses": missed, "caught_only_with_processed_length": extra},
                    {"silently_wrong": n["silently_wrong"], "caught": n["caught"], "named_misses": len(missed) - len(unnamed),
                     "unnamed_misses": len(unnamed)}, SOURCE_API)


def decide_guard_passes(cells: list[Cell], internal: list[dict[str, Any]] | None = None) -> Decision:
    """No working cell is refused (with or without processed_length), no internal call generate() makes is refused,
    and every call the guard passed gave the plain call's logits bit for bit."""
    n = counts(cells)
    alarms = [c for c in cells if not c.undecided and c.plain == "worked" and "raised" in (c.guard, c.with_length)]
    changed = [c for c in cells if c.guard == "passed" and c.guarded_equals_plain is not True]
    refused = refused_calls(internal)
    holds = n["worked"] > 0 and not alarms and not changed and not refused
    why = (f"all {n['worked']} working cells passed the guard (with and without processed_length), none of "
           f"{len(internal or [])} internal calls was refused, and every passed call equals the plain one bitwise" if holds else
           "no cell worked: nothing to pass" if n["worked"] == 0 else
           f"false alarms on {named(alarms)}; internal calls refused: {refused}; guarded call not identical to the "
           f"plain one on {named(changed)}")
    return Decision(holds, why, {"counts": n, "by_group": _by_group(cells), "false_alarms": named(alarms),
                                 "internal_calls": len(internal or []), "internal_refused": refused,
                                 "guarded_differs_from_plain": named(changed)},
                    {"worked": n["worked"], "false_alarms": len(alarms), "internal_refused": len(refused)}, SOURCE_API)


def decide_factory_matches(round_trips: dict[str, dict[str, Any]], families: tuple[str, ...] = FAMILIES) -> Decision:
    """On every family the factory's cache equals the original: classes, K/V bits, lengths, linear states, seq length."""
    missing = [f for f in families if f not in round_trips]
    unequal = [f for f, r in round_trips.items()
               if not r.get("state_equal") or len(set(r.get("seq_length") or [None, ()])) != 1]
    holds = not missing and not unequal and bool(round_trips)
    why = (f"bitwise equal on all {len(round_trips)} families ({', '.join(round_trips)})" if holds else
           f"families not covered: {missing}; not equal: {unequal}")
    return Decision(holds, why, {"round_trips": round_trips, "missing": missing, "unequal": unequal},
                    {"families_equal": f"{len(round_trips) - len(unequal)}/{len(families)}"}, SOURCE_API)


def decide_factory_refuses(rows: list[dict[str, Any]], minimum: int = MIN_REFUSALS) -> Decision:
    """At least `minimum` malformed inputs, each refused with a FactoryError whose message names the mismatch."""
    good = [r for r in rows if r.get("refused") and r.get("names_mismatch")]
    bad = [r["input"] for r in rows if r not in good]
    holds = len(rows) >= minimum and not bad
    why = (f"all {len(rows)} malformed inputs refused, each message naming the mismatch" if holds else
           f"{len(rows)} malformed inputs (at least {minimum} needed); not refused or not named: {bad}")
    return Decision(holds, why, {"refusals": rows, "not_refused_or_unnamed": bad},
                    {"refused_and_named": f"{len(good)}/{len(rows)}"}, SOURCE_API)


def decide_portable(rows: list[dict[str, Any]]) -> Decision:
    """A saved state loaded into a fresh instance continues as the same instance does (within the floor); where the
    model keeps state outside K/V (a hook), a fresh instance without it differs beyond the floor."""
    def ok(r: dict[str, Any]) -> bool:
        value = r.get("restored_vs_same")
        return bool(r.get("restored_ok")) and value is not None and value <= r["noise_threshold"]

    def hook_needed(r: dict[str, Any]) -> bool:
        value = r.get("bare_vs_same")
        return not r.get("hook") or (not r.get("bare_ok") or (value is not None and value > r["noise_threshold"]))

    hooked = [r for r in rows if r.get("hook")]
    failing = [r["family"] for r in rows if not ok(r)]
    unshown = [r["family"] for r in rows if not hook_needed(r)]
    holds = bool(rows) and bool(hooked) and not failing and not unshown
    why = (f"fresh instances continue as the same instance on {[r['family'] for r in rows]}; without the hook "
           f"{[r['family'] for r in hooked]} differ" if holds else
           "no model with model-side state was run" if rows and not hooked else
           f"restored differs or failed: {failing}; the hook made no difference on: {unshown}")
    worst = max((r.get("restored_vs_same") or 0.0 for r in rows), default=None)
    bare = [r.get("bare_vs_same") for r in hooked]
    return Decision(holds, why, {"rows": rows, "failing": failing, "hook_without_effect": unshown},
                    {"restored_vs_same": worst, "without_hook_vs_same": bare[0] if len(bare) == 1 else bare}, SOURCE_API)
