"""Notebook 08's ledger claims, each a function of measured cells and advice rows (never of typed verdicts).

`decide_ledger_refuses`: with `track(model)`, every silently wrong cell whose cache has a ledger is refused, and no
working tracked cell or internal call is. `decide_advice_restores`: every refusal's fix, applied, matches the reference
within the floor. `decide_resume_matches`: every silently wrong tracked cell, called through `kvresume.resume` on
the whole sequence, matches the reference within the floor. Untracked cells (caches rebuilt without a ledger) are
counted apart: the guard treats them as it did before the ledger.
"""
from __future__ import annotations

from typing import Any

from ..compare import Decision
from . import blind
from .cells import Cell, counts
from .decisions import named, refused_calls

SOURCE_LEDGER = {"transformers docs": "Re-use Cache to continue generation: copy.deepcopy the prompt cache for each "
                                      "new prompt (the prefix-caching recipe); llama.cpp / vLLM / SGLang key cached "
                                      "slots by their tokens (the engines' design, not measured here)"}


def decide_ledger_refuses(cells: list[Cell], internal: list[dict[str, Any]] | None = None) -> Decision:
    """Every silently wrong tracked cell refused by the tracked guard or a named blind spot (helpers.proposal.blind: even
    its ledger is a valid call's), no working tracked cell refused, no internal call refused."""
    tracked = [c for c in cells if c.tracked and not c.undecided]
    wrong = [c for c in tracked if c.plain == "silently_wrong"]
    passed = [c for c in wrong if c.guard != "raised"]
    missed = [c for c in passed if not blind.reason(c)]  # a named blind spot: its inputs and ledger are a valid call's
    alarms = [c for c in tracked if c.plain == "worked" and c.guard == "raised"]
    refused = refused_calls(internal)
    holds = bool(wrong) and not missed and not alarms and not refused
    why = (f"{len(wrong) - len(passed)} of {len(wrong)} silently wrong tracked cells refused, the other {len(passed)} "
           f"named blind spots ({named(passed)}); 0 of {sum(c.plain == 'worked' for c in tracked)} "
           f"working tracked cells and 0 of {len(internal or [])} internal calls refused" if holds else
           "no tracked cell was silently wrong: nothing to refuse" if not wrong else
           f"missed: {named(missed)}; false alarms: {named(alarms)}; internal calls refused: {refused}")
    untracked = [c for c in cells if not c.tracked and not c.undecided]
    return Decision(holds, why, {"tracked": counts(tracked), "tracked_untracked_guard": counts(tracked, "untracked"),
                                 "untracked_caches": counts(untracked), "missed": named(missed),
                                 "false_alarms": named(alarms), "internal_refused": refused,
                                 "named_blind_spots": {f"{c.group}: {c.cell}": blind.reason(c) for c in passed}},
                    {"silently_wrong_tracked": len(wrong), "refused": len(wrong) - len(passed),
                     "named_blind_spots": len(passed) - len(missed), "unnamed_misses": len(missed),
                     "refused_without_ledger": sum(c.untracked == "raised" for c in wrong),
                     "false_alarms": len(alarms), "internal_refused": len(refused)}, SOURCE_LEDGER)


def decide_advice_restores(all_rows: list[dict[str, Any]]) -> Decision:
    """Every refusal's fix on a tracked cache, applied, matches the reference within the floor (untracked caches'
    refusals, the shape rules' advice, are counted apart)."""
    rows = [r for r in all_rows if r.get("tracked")]
    apart = [r for r in all_rows if not r.get("tracked")]
    bad = [r["cell"] for r in rows if not r.get("restores")]
    holds = bool(rows) and not bad
    worst = max((r["max_abs_diff"] for r in rows if r.get("restores") and r.get("max_abs_diff") is not None), default=None)
    why = (f"all {len(rows)} refusals' fixes restore (largest max |diff| {worst:.3g})" if holds and worst is not None else
           f"all {len(rows)} refusals' fixes restore" if holds else
           "no refusal: no advice to run" if not rows else
           f"{len(bad)} of {len(rows)} refusals' advice does not restore (defects): {bad}")
    apart_bad = [r["cell"] for r in apart if not r.get("restores")]
    return Decision(holds, why, {"advice": rows, "defects": bad, "untracked_advice": apart,
                                 "untracked_defects": apart_bad},
                    {"refusals": len(rows), "restored": len(rows) - len(bad), "defects": len(bad),
                     "untracked_refusals": len(apart), "untracked_restored": len(apart) - len(apart_bad)}, SOURCE_LEDGER)


def decide_resume_matches(cells: list[Cell]) -> Decision:
    """Every silently wrong tracked cell, called through resume on its whole sequence, matches the reference."""
    wrong = [c for c in cells if c.tracked and not c.undecided and c.plain == "silently_wrong"]
    run = [c for c in wrong if c.resume_status]
    scope = [c for c in wrong if c.resume_status == "" and c.resume_scope]
    bad = [c for c in run if c.resume_status != "worked"]
    unrun = [c for c in wrong if not c.resume_status and not c.resume_scope]
    holds = bool(run) and not bad and not unrun
    worst = max((c.resume_diff for c in run if c.resume_diff is not None), default=None)
    why = (f"all {len(run)} silently wrong tracked cells match the full forward through resume (largest max |diff| "
           f"{worst:.3g})" if holds and worst is not None else
           "no silently wrong tracked cell ran through resume" if not run else
           f"through resume: differs or raised on {named(bad)}; not run (no whole sequence) on {named(unrun)}")
    return Decision(holds, why, {"rows": [{"cell": f"{c.group}: {c.cell}", "resume": c.resume_status,
                                           "max_abs_diff": c.resume_diff, "threshold": c.threshold} for c in wrong],
                                 "differs": named(bad), "not_run": named(unrun),
                                 "out_of_scope": {f"{c.group}: {c.cell}": c.resume_scope for c in scope}},
                    {"silently_wrong_tracked": len(wrong), "resume_matches": len(run) - len(bad),
                     "worst": worst}, SOURCE_LEDGER)
