"""The controls' tables and the summary figure of notebook 06 (one table per control, every rebuild in it)."""
from __future__ import annotations

from typing import Any

import pandas as pd

import torch

from .. import plots
from ..compare import logit_metrics
from .tree import ArgSet, slot_kind
from .controls import ARG_SETS, FULL, Step, diff
from .run import Baseline, Triaged, rope_offset


def step_row(step: Step, original: Step | None, reference: torch.Tensor) -> dict[str, Any]:
    """One table row: result, what reached the model, and max |diff| vs the original and the full forward."""
    c, m = step.call, logit_metrics(reference, step.logits) if step.ok else {}
    return {"result": "worked" if step.ok else f"failed ({step.error_type})",
            "input_ids_shape": c.get("input_ids_shape"), "attention_mask_shape": c.get("attention_mask_shape"),
            "position_ids": c.get("position_ids"), "cache_position": c.get("cache_position"),
            "rotary_position": c.get("rotary_position"), "past_length": c.get("past_length"),
            "vs_original": diff(step, original), "vs_full_forward": m.get("max_abs_diff"),
            "top1_equal_full_forward": m.get("top1_equal"), "stage": step.stage, "error": step.error[:120]}


def slot_table(results: dict[str, Triaged]) -> pd.DataFrame:
    """Control 1 for every rebuild: per layer, its K/V slots by content against the original's (kind and which)."""
    return pd.DataFrame([{"rebuild": name, "layer": i, "slots": slot_kind(i, s), "held": t.controls.rebuilt_state.slots[i]}
                         for name, t in results.items() for i, s in enumerate(t.controls.slots)]).set_index(["rebuild", "layer"])


def first_step_table(base: Baseline, results: dict[str, Triaged]) -> pd.DataFrame:
    """Control 2: first-step logits per argument set, original and every rebuild, with the captured first call."""
    caches = {"original": (base.original, {}), **{name: (t.steps, base.original) for name, t in results.items()}}
    return pd.DataFrame([{"cache": c, "args": n, **step_row(steps[n], against.get(n), base.reference)}
                         for c, (steps, against) in caches.items() for n in ARG_SETS]).set_index(["cache", "args"])


def positions_table(base: Baseline, results: dict[str, Triaged]) -> pd.DataFrame:
    """Control 3: generate() vs a direct forward at explicit logical positions, to split position effects from loss."""
    rows = []
    delta = rope_offset(base)
    for name, t in results.items():
        e, c = t.controls.extra, t.controls
        gen_ref = diff(t.steps[FULL], Step(True, base.reference))
        rows.append({"rebuild": name, "layer_lengths": c.rebuilt_lengths, "processed_length": c.processed_length,
                     "logical_length_used": t.rebuilt.processed_length if t.rebuilt.processed_length is not None else c.processed_length,
                     "generate_position": e["generate_position"], "explicit_position": e["logical_position"],
                     "positions_include_rope_deltas": delta is not None, "rope_deltas": delta,
                     "generate_position_logical": _minus(e["generate_position"], delta),
                     "explicit_position_logical": _minus(e["logical_position"], delta),
                     "explicit_vs_generate": e["explicit_vs_generate"], "generate_vs_full_forward": gen_ref,
                     "explicit_vs_full_forward": e["explicit_vs_full_forward"],
                     "position_effect": e["explicit_vs_generate"] is not None and base.floor.differs(e["explicit_vs_generate"]),
                     "information_loss": e["explicit_vs_full_forward"] is not None and base.floor.differs(e["explicit_vs_full_forward"])})
    return pd.DataFrame(rows).set_index("rebuild")


def _minus(position: int | None, delta: int | None) -> int | None:
    return None if position is None else position - (delta or 0)


def instance_table(base: Baseline, results: dict[str, Triaged]) -> pd.DataFrame:
    """Control 4: same instance vs fresh instance, without and with the model-side state restored."""
    rows = []
    for name, t in results.items():
        rows.append({"rebuild": name, "instance": "same instance", **step_row(t.steps[FULL], None, base.reference)})
        rows += [{"rebuild": name, "instance": k, **step_row(s, t.steps[FULL], base.reference)}
                 for k, s in t.fresh.items()]
    cols = ["result", "rotary_position", "vs_original", "vs_full_forward", "top1_equal_full_forward"]
    return pd.DataFrame(rows).set_index(["rebuild", "instance"])[cols].rename(columns={"vs_original": "vs_same_instance"})


def per_layer_mechanism(t: Triaged) -> dict[str, Any]:
    """What generate() did with per-layer lengths: stage and layer of an error, or the mask and positions it used."""
    call = t.steps[FULL].call
    return {"stage": t.steps[FULL].stage, "error_layer": call.get("error_layer"), "error": t.steps[FULL].error,
            "layer_lengths_at_call": call.get("layer_lengths"), "attention_mask_shape": call.get("attention_mask_shape"),
            "attention_masks": call.get("attention_masks"), "generate_position": call.get("rotary_position"),
            "past_length_reported": call.get("past_length"), "layers_run": call.get("layers_run")}


def full_arg_set(t: Triaged) -> ArgSet:
    """The full-mask argument set (the working path) of one triaged rebuild."""
    return next(a for a in t.controls.arg_sets if a.name == FULL)


def position_numbers(t: Triaged) -> dict[str, Any]:
    """generate()'s captured position, the explicit logical one, and the max |diff| between their steps."""
    e = t.controls.extra
    return {"generate_position": e["generate_position"], "logical_position": e["logical_position"],
            "explicit_vs_generate": e["explicit_vs_generate"]}


def plot_branches(base: Baseline, results: dict[str, Triaged], positions: pd.DataFrame, stem: str) -> Any:
    """Bars per rebuild: generate(full mask) vs original, explicit logical positions vs full forward; values labelled
    (n/a: not run), the noise threshold on each panel (helpers.plots.metric_bars)."""
    names = list(results)
    series = {"generate(full mask) vs original": [full_arg_set(results[n]).max_abs_diff for n in names],
              "explicit logical positions vs full forward": [positions.loc[n, "explicit_vs_full_forward"] for n in names]}
    return plots.metric_bars(names, series, "First-step logits per rebuild", stem, "branches", log=True,
                             thresholds=dict.fromkeys(series, base.floor.threshold))
