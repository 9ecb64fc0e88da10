"""The GPU experiment's runs (helpers.offload.gpu is its front: claims, decisions, command line).

Per model, dtype and loop (`model_runs`: the report's 64-layer layout in its dtype and loop only) the arms of
`arms_of`, under one calibrated device lag per model and dtype (after the clocks are warmed), each offloading arm
after the pinned pool is poisoned, the offload-event arm only where the device probe (helpers.offload.calibrate)
says its wait holds. `simulate=True` runs it on CPU under the recording stand-ins with a modelled pinned pool: a
simulation, never a GPU result.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kvresume import compat
from . import gpu_decide as gd
from .arms import AGAIN, BASE, FIXES, OFF, OFF_AGAIN, POISON, UNLAGGED, Arm, SimPool, run_arm, variant_name
from .calibrate import (busy_at_wrap, clamp_cycles, cycles_per_ms, event_wait_probe, gate_reason, host_ms_to_wrap,
                        sleep_plan, warm_clocks)
from .loops import LOOPS
from .standins import recording_streams
from .states import compare_logits, compare_states, tagged

EVENT = "offload event"
MODELS = ("tiny hybrid", "tiny dense", "report layout (64)")
RESTRICTED = {"report layout (64)": (("bfloat16",), ("report",))}  # the report's layout: its dtype and loop only
ArmPlan = tuple[str, bool, "str | None", bool]  # (variant, offloading, fix edge, lagged)
RECORD_LIMIT = 50_000_000  # parameters: models up to this size also get the CPU record of which edge closes which hazard


def arms_of(loop: str, fixes: tuple[str, ...] = FIXES, unlagged: bool = True) -> list[ArmPlan]:
    """The arms of one loop, in run order."""
    arms: list[ArmPlan] = [(BASE, False, None, True), (AGAIN, False, None, True), (OFF, True, None, True)]
    arms += [(variant_name(e), True, e, True) for e in fixes]
    if loop == "report":
        arms.append((OFF_AGAIN, True, None, True))
        if unlagged:
            arms.append((UNLAGGED, True, None, False))
    return arms


def model_runs(models: tuple[str, ...], dtypes: tuple[str, ...],
               loops: tuple[str, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(model, dtype, loops) in run order: dtypes outer, models inner; a RESTRICTED model only in its dtypes, loops."""
    out = []
    for dtype in dtypes:
        for model in models:
            only_dtypes, only_loops = RESTRICTED.get(model, (dtypes, loops))
            kept = tuple(l for l in loops if l in only_loops)
            if dtype in only_dtypes and kept:
                out.append((model, dtype, kept))
    return out


def primary_key(data: dict[str, Any]) -> tuple[str, str, str]:
    """The report's loop, the first model, bfloat16 where it ran (the primary arm of a GPU experiment)."""
    s = data["settings"]
    return ("report", s["models"][0], "bfloat16" if "bfloat16" in s["dtypes"] else s["dtypes"][0])


@dataclass
class GpuExperiment:
    """Every arm's tables, the calibration per model and dtype, and the settings."""

    steps: Any
    states: Any
    counts: Any
    calibration: list[dict[str, Any]]
    memory: list[dict[str, Any]]
    settings: dict[str, Any]
    repeat: list[dict[str, Any]] = field(default_factory=list)
    edges: Any = None

    def primary(self) -> gd.Key:
        """The report's own arm: its loop, the hybrid, bfloat16 where it ran (primary_key)."""
        return primary_key({"settings": self.settings})


def calibrate(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, rate: float, simulate: bool,
              pool: SimPool | None = None) -> dict[str, Any]:
    """Two offloading `.cpu()` runs with no sleep (the first a warm-up, the same for every model and dtype): the host
    time to the wrap prefetch in the second, and the sleep chosen from it."""
    run_arm(model, ids, n_steps, "cpu", True, 0, simulate=simulate, pool=pool)
    probe = run_arm(model, ids, n_steps, "cpu", True, 0, simulate=simulate, pool=pool)
    return sleep_plan(host_ms_to_wrap(probe.timing), rate)


def _loop_arms(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, loop: str, cycles: int, fixes: tuple[str, ...],
               simulate: bool, race_lag: int | None, pool: SimPool | None, poison: bool, unlagged: bool) -> list[Arm]:
    kw = dict(model=model, ids=ids, n_steps=n_steps, loop=loop, simulate=simulate, pool=pool, poison=poison)
    return [run_arm(offloading=offloading, edge=edge, cycles=cycles if lagged else 0, name=name,
                    race_lag=race_lag if lagged else None, **kw)
            for name, offloading, edge, lagged in arms_of(loop, fixes, unlagged)]


def repeat_rows(arms: list[Arm], tags: dict[str, Any]) -> list[dict[str, Any]]:
    """offloading=True against its own second run, per forward call: max |logit diff| and bitwise equality."""
    by = {a.name: a for a in arms}
    if OFF not in by or OFF_AGAIN not in by:
        return []
    pairs = zip(by[OFF].run.logits, by[OFF_AGAIN].run.logits)
    return [{**tags, "step": i, "max_abs_diff": float((a - b).abs().max()), "bitwise_equal": bool(torch.equal(a, b))}
            for i, (a, b) in enumerate(pairs)]


def _compare(arms: list[Arm], dtype: torch.dtype, tags: dict[str, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    base, again, tested = arms[0], arms[1], arms[2:]
    steps = [tagged(compare_logits(base.run, again.run, a.run, dtype, a.name), **tags) for a in tested]
    states = [tagged(compare_states(base.states, again.states, a.states, dtype, a.name, a.calls, a.order), **tags)
              for a in tested]
    timing = [tagged(a.timing.copy(), **tags, variant=a.name) for a in tested if a.timing is not None and len(a.timing)]
    return steps, states, timing


def arm_rows(steps: list[Any], states: list[Any], timing: list[Any], calibration: dict[str, Any]) -> list[dict[str, Any]]:
    """One loop's compared arms as plain rows: per arm its steps, its differing state tensors, its race counts, the sleep."""
    import json

    import pandas as pd

    rec = lambda f: json.loads(f.to_json(orient="records", default_handler=str))  # noqa: E731 - NaN -> null
    counts = gd.race_counts(pd.concat(timing, ignore_index=True)) if timing else pd.DataFrame(columns=gd.COUNT_COLUMNS)
    return [{**{k: s[k].iloc[0] for k in ("loop", "model", "dtype", "variant")}, "steps": rec(s),
             "states_differing": rec(st[st.differs]), "race_counts": rec(counts[counts.variant == s.variant.iloc[0]]),
             "sleep_cycles_used": calibration["sleep_cycles_used"]} for s, st in zip(steps, states)]


def usable_dtypes(dtypes: tuple[str, ...], device: torch.device) -> tuple[tuple[str, ...], dict[str, str]]:
    """The dtypes this device runs, and the ones left out with the reason: bfloat16 below compute capability 8.0 (a T4
    is 7.5; `torch.cuda.is_bf16_supported()` is True there, by emulation, so it is not what decides)."""
    dropped: dict[str, str] = {}
    if device.type == "cuda" and "bfloat16" in dtypes:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 0):
            dropped["bfloat16"] = (f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}): no native "
                                   "bfloat16 (is_bf16_supported() is True there, emulated)")
    return tuple(d for d in dtypes if d not in dropped), dropped


def device_facts(model: torch.nn.Module, fixes: tuple[str, ...]) -> dict[str, Any]:
    """Warm clocks, the rate of `_sleep`, and the event probe on the installed release's prefetch stream."""
    warm = warm_clocks()
    rate = cycles_per_ms()
    probe = event_wait_probe(compat.dynamic_cache(model.config, offloading=True).prefetch_stream, rate) if EVENT in fixes else None
    return {"rate": rate, "warm": warm, "probe": probe}


def experiment(models: dict[str, torch.nn.Module], ids_of: dict[str, torch.Tensor], dtypes: tuple[str, ...] = ("float32", "bfloat16"),
               loops: tuple[str, ...] = LOOPS, n_steps: int = 4, fixes: tuple[str, ...] = FIXES, simulate: bool = False,
               race_lag: int | None = None, cycles: int | None = None, poison: bool = True, unlagged: bool = True,
               cycles_of: dict[tuple[str, str], int] | None = None,
               on_arms: Callable[[list[dict[str, Any]]], None] | None = None) -> GpuExperiment:
    """Every arm on every model, dtype and loop; `cycles` (or `cycles_of[(model, dtype)]`) overrides the calibrated sleep;
    `on_arms(rows)` gets each loop's arms as soon as they finish (arm_rows), so a later crash or timeout keeps them."""
    import pandas as pd

    device = next(iter(ids_of.values())).device
    dtypes, dropped = usable_dtypes(tuple(dtypes), device)
    if not dtypes:
        raise ValueError(f"no dtype left to run: {dropped}")
    pool = SimPool() if simulate else None
    with recording_streams() if simulate else nullcontext():
        facts = device_facts(next(iter(models.values())), tuple(fixes))
    gate = gate_reason(facts["probe"]) if facts["probe"] else ""
    fixes = tuple(f for f in fixes if not (f == EVENT and gate))
    steps, states, timing, calibration, memory, repeat = [], [], [], [], [], []
    runs = model_runs(tuple(models), dtypes, tuple(loops))
    for name, dtype_name, run_loops in runs:
        dtype = getattr(torch, dtype_name)
        model = models[name]
        m = model if next(model.parameters()).dtype == dtype else copy.deepcopy(model).to(dtype)
        ids = ids_of[name]
        plan = calibrate(m, ids, n_steps, facts["rate"], simulate, pool)
        asked = int((cycles_of or {}).get((name, dtype_name), plan["sleep_cycles"] if cycles is None else cycles))
        sleep = clamp_cycles(asked, facts["rate"])  # never more than the cap at the checked rate
        calibration.append({"model": name, "dtype": dtype_name, **plan, "sleep_cycles_asked": asked, "sleep_cycles_used": sleep})
        for loop in run_loops:
            arms = _loop_arms(m, ids, n_steps, loop, sleep, fixes, simulate, race_lag, pool, poison, unlagged)
            tags = {"loop": loop, "model": name, "dtype": dtype_name}
            s, st, t = _compare(arms, dtype, tags)
            if on_arms is not None:
                on_arms(arm_rows(s, st, t, calibration[-1]))
            repeat += repeat_rows(arms, tags)
            steps += s; states += st; timing += t
            memory += [{**tags, "variant": a.name, **a.memory, "stale_reads_served": a.stale_reads, "pool": a.poisoned,
                        **({"wrap": busy_at_wrap(a.timing)} if a.timing is not None else {})} for a in arms]
        del m  # a dtype copy is freed before the next model's
    ran = [m for m in models if any(r[0] == m for r in runs)]
    recorded = {m: models[m] for m in ran if m not in RESTRICTED}
    edges = edge_record(recorded, ids_of, n_steps) if fixes else None  # the report's layout: notebook 05's CPU record
    settings = {"device": str(device), "dtypes": list(dtypes), "dtypes_left_out": dropped, "loops": list(loops), "models": ran,
                "models_left_out": [m for m in models if m not in ran], "runs": [list(r) for r in runs],
                "fixes": list(fixes), "event_arm_gate": gate or "ran: the device probe's wait held",
                "event_probe": facts["probe"], "clock_warm_up": facts["warm"], "n_steps": n_steps,
                "input_shape": {k: list(v.shape) for k, v in ids_of.items()}, "simulated_on_cpu": simulate,
                "race_lag": race_lag, "cycles_override": cycles, "lag_from_other_run": bool(cycles_of),
                "unlagged_report_arm": unlagged, "pool_poisoned_before_each_offloading_arm": poison,
                "pool_poison_value": POISON if poison else None,
                "empty_cache_between_arms": False, "event_resolution_ms": gd.RESOLUTION_MS}
    counts = gd.race_counts(pd.concat(timing, ignore_index=True)) if timing else pd.DataFrame(columns=gd.COUNT_COLUMNS)
    return GpuExperiment(pd.concat(steps, ignore_index=True), pd.concat(states, ignore_index=True), counts, calibration,
                         memory, settings, repeat, edges)


def edge_record(models: dict[str, torch.nn.Module], ids_of: dict[str, torch.Tensor], n_steps: int) -> Any:
    """Per model (a float32 CPU copy, tiny models only): which fix edge closes which hazard in the CPU record of the
    report's loop (helpers.offload.hazards.edge_table); larger models are left out, with the reason."""
    import pandas as pd

    from .hazards import edge_table
    from .tracking import EDGES

    frames = []
    for name, model in models.items():
        if sum(p.numel() for p in model.parameters()) > RECORD_LIMIT:
            continue
        cpu = copy.deepcopy(model).float().cpu()
        frames.append(edge_table(cpu, ids_of[name].cpu(), n_steps, name, tuple(EDGES), loop="report"))
    return pd.concat(frames, ignore_index=True) if frames else None
