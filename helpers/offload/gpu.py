"""Notebook 05's GPU experiment: the report's runs with a controlled device lag, every layer's state compared
after every step, and the fix control (the 5.20.0 ordering edge added to the installed release).

On CUDA: real streams; `torch.cuda._sleep(cycles)` on the default stream at the start of every forward (a
forward pre-hook, as PyTorch's own stream tests delay a stream), so the host runs ahead of the device
deterministically even on a small model; `torch.cuda.synchronize()` after every step before the cache state is
copied to the host. `simulate=True` runs the same code on CPU under helpers.offload.streams' recording stand-ins (the
tests do), optionally serving the race replay's stale reads (`race_lag`), so none of it runs first on a GPU.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .. import compat
from ..compare import noise_floor
from .loops import Decision, GreedyRun, greedy_run, step_table
from .replay import REPORT_VALUES
from .tracking import ordering_edge, track
from .streams import recording_streams

ATTENTION_KV = "attention K/V"
LINEAR_STATE = "linear conv/recurrent state"


def state_tensors(cache: Any) -> dict[str, tuple[int, str, torch.Tensor]]:
    """Every state tensor a cache holds: name -> (layer, kind, tensor), in layer order."""
    out: dict[str, tuple[int, str, torch.Tensor]] = {}
    for i, layer in enumerate(compat.cache_layers(cache) if cache is not None else []):
        keys, values = compat.layer_kv(layer) if getattr(layer, "is_initialized", False) else (None, None)
        for name, tensor in (("keys", keys), ("values", values)):
            if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
                out[f"layer {i} {name}"] = (i, ATTENTION_KV, tensor)
        for kind in ("conv_states", "recurrent_states"):
            states = getattr(layer, kind, None)
            flags = getattr(layer, f"is_{kind}_initialized", None)
            items = states.items() if isinstance(states, dict) else enumerate(states or [])
            for j, tensor in items:
                ready = flags[j] if isinstance(flags, (dict, list)) else True
                if ready and isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
                    out[f"layer {i} {kind}[{j}]"] = (i, LINEAR_STATE, tensor)
    return out


def snapshot(cache: Any) -> dict[str, tuple[int, str, torch.Tensor]]:
    """After torch.cuda.synchronize(): every state tensor copied to the host as float32."""
    torch.cuda.synchronize()
    return {k: (i, kind, t.detach().float().cpu().clone()) for k, (i, kind, t) in state_tensors(cache).items()}


@contextmanager
def device_lag(model: torch.nn.Module, cycles: int) -> Iterator[None]:
    """`torch.cuda._sleep(cycles)` on the current (default) stream at the start of every forward."""
    handle = model.register_forward_pre_hook(lambda module, args: torch.cuda._sleep(int(cycles))) if cycles > 0 else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


@dataclass
class Arm:
    """One greedy run of the experiment: its logits, its cache state after every step, its cost."""

    name: str
    run: GreedyRun
    states: list[dict[str, tuple[int, str, torch.Tensor]]] = field(default_factory=list)
    peak_gpu_mib: float | None = None
    stale_reads: int = 0


def run_arm(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, name: str, offloading: bool, cycles: int,
            fix: bool = False, simulate: bool = False, race_lag: int | None = None) -> Arm:
    """The report's run (offloading or not), with the device lag, snapshots and (fix) the 5.20.0 edge."""
    on_cuda = ids.device.type == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ids.device)
    states: list[dict[str, tuple[int, str, torch.Tensor]]] = []
    with (recording_streams() if simulate else nullcontext()) as log:
        cache = compat.dynamic_cache(model.config, offloading=True) if offloading else None
        tracked = track(cache, log, lag=race_lag) if (simulate and cache is not None) else nullcontext()
        edge = ordering_edge(cache, ids.device) if (fix and cache is not None) else nullcontext()
        with tracked, edge, device_lag(model, cycles):
            begin = (lambda label: log.begin(label, True)) if log is not None else None
            run = greedy_run(model, ids, n_steps, cache=cache, before_call=begin,
                             after_call=lambda label, c: states.append(snapshot(c)))
    run.cache = None
    peak = torch.cuda.max_memory_allocated(ids.device) / 2**20 if on_cuda else None
    stale = sum(r["served_stale"] for r in log.reads()) if log is not None else 0
    return Arm(name, run, states, peak, stale)


def _floors(reference: GreedyRun, again: GreedyRun, dtype: torch.dtype) -> list[Any]:
    return [noise_floor(r, [a], dtype, what="offloading=False run twice") for r, a in zip(reference.logits, again.logits)]


def compare_logits(base: Arm, again: Arm, other: Arm, dtype: torch.dtype) -> Any:
    """Per step: max |logit diff| of `other` vs offloading=False, the noise floor, matches/differs."""
    steps = step_table(base.run, other.run, noise=again.run)
    floors = _floors(base.run, again.run, dtype)
    steps["noise_threshold"] = [f.threshold for f in floors]
    steps["matches"] = [f.matches(v) for f, v in zip(floors, steps.max_abs_diff)]
    steps["differs"] = [f.differs(v) for f, v in zip(floors, steps.max_abs_diff)]
    steps.insert(0, "variant", other.name)
    return steps


def compare_states(base: Arm, again: Arm, other: Arm, dtype: torch.dtype) -> Any:
    """Per step and state tensor: max |diff| vs offloading=False against that tensor's noise floor."""
    import pandas as pd

    rows = []
    calls = ["prefill"] + [f"decode {k}" for k in range(1, len(base.states))]
    for step, (ref, rep, oth) in enumerate(zip(base.states, again.states, other.states)):
        for name, (layer, kind, tensor) in ref.items():
            mine = oth.get(name)
            floor = noise_floor(tensor, [rep[name][2]], dtype, what="offloading=False run twice")
            same_shape = mine is not None and mine[2].shape == tensor.shape
            diff = float((mine[2] - tensor).abs().max()) if same_shape and tensor.numel() else float("inf")
            rows.append({"variant": other.name, "step": step, "call": calls[step], "tensor": name, "layer": layer,
                         "kind": kind, "max_abs_diff": diff, "noise_threshold": floor.threshold,
                         "differs": (not same_shape) or floor.differs(diff)})
    return pd.DataFrame(rows)


def first_difference(states: Any) -> dict[str, Any] | None:
    """The first state tensor beyond its floor: earliest step, then lowest layer (data flows upwards)."""
    bad = states[states.differs].sort_values(["step", "layer"], kind="stable")
    return None if bad.empty else {k: bad.iloc[0][k] for k in ("variant", "call", "tensor", "layer", "kind", "max_abs_diff", "noise_threshold")}


@dataclass
class GpuExperiment:
    """Four arms (offloading=False twice, offloading=True, offloading=True + the 5.20.0 edge) and their comparisons."""

    arms: dict[str, Arm]
    steps: Any
    states: Any
    cost: Any
    settings: dict[str, Any]


def gpu_experiment(model: torch.nn.Module, ids: torch.Tensor, n_steps: int = 4, cycles: int = 0,
                   simulate: bool = False, race_lag: int | None = None) -> GpuExperiment:
    """Run the arms and compare logits and every layer's state with offloading=False."""
    import pandas as pd

    dtype = next(model.parameters()).dtype
    arm = dict(model=model, ids=ids, n_steps=n_steps, cycles=cycles, simulate=simulate, race_lag=race_lag)
    arms = {a.name: a for a in (run_arm(name="offloading=False", offloading=False, **arm),
                                run_arm(name="offloading=False (again)", offloading=False, **arm),
                                run_arm(name="offloading=True", offloading=True, **arm),
                                run_arm(name="offloading=True + 5.20.0 edge", offloading=True, fix=True, **arm))}
    base, again = arms["offloading=False"], arms["offloading=False (again)"]
    tested = [arms["offloading=True"], arms["offloading=True + 5.20.0 edge"]]
    steps = pd.concat([compare_logits(base, again, a, dtype) for a in tested], ignore_index=True)
    states = pd.concat([compare_states(base, again, a, dtype) for a in tested], ignore_index=True)
    cost = pd.DataFrame([{"variant": a.name, "peak_gpu_mib": a.peak_gpu_mib, "prefill_s": a.run.prefill_s,
                          "decode_s": a.run.decode_s, "stale_reads_served": a.stale_reads} for a in arms.values()])
    settings = {"device": str(ids.device), "dtype": str(dtype).replace("torch.", ""), "sleep_cycles_per_forward": cycles,
                "simulated_on_cpu": simulate, "race_lag": race_lag, "n_steps": n_steps, "input_shape": list(ids.shape)}
    return GpuExperiment(arms, steps, states, cost, settings)


# --- decisions (pure functions of the tables: each has a test with a contradicting measurement) -------------

def _arm(table: Any, name: str) -> Any:
    return table[table.variant == name]


def decide_prefill_identical(steps: Any) -> Decision:
    row = _arm(steps, "offloading=True").iloc[0]
    ev = {"prefill_max_abs_diff": float(row.max_abs_diff), "noise_threshold": float(row.noise_threshold),
          "bitwise_equal": bool(row.bitwise_equal)}
    return Decision(bool(row.matches), ev, f"prefill max |diff| {row.max_abs_diff:.3g} vs noise threshold {row.noise_threshold:.3g}",
                    deciding={"prefill max |logit diff|": float(row.max_abs_diff), "noise threshold": float(row.noise_threshold)},
                    source={"prefill max |logit diff|": REPORT_VALUES["prefill max |logit diff|"]})


def decide_decode_drifts(steps: Any) -> Decision:
    decode = _arm(steps, "offloading=True")
    decode = decode[decode.step > 0]
    ev = {"max_abs_diff": decode.max_abs_diff.tolist(), "noise_threshold": decode.noise_threshold.tolist(),
          "argmax_match": decode.argmax_match.tolist()}
    holds = len(decode) > 0 and bool(decode.differs.iloc[0])
    why = f"decode steps max |diff| {[round(v, 4) for v in decode.max_abs_diff]} vs thresholds {[float(f'{v:.3g}') for v in decode.noise_threshold]}"
    first = {"decode 1 max |logit diff|": float(decode.max_abs_diff.iloc[0]) if len(decode) else None,
             "noise threshold": float(decode.noise_threshold.iloc[0]) if len(decode) else None}
    return Decision(holds, ev, why, deciding=first, source={"decode 1 max |logit diff|": REPORT_VALUES["decode 1 max |logit diff|"]})


def decide_first_tensor(states: Any) -> Decision:
    first = first_difference(_arm(states, "offloading=True"))
    if first is None:
        return Decision(False, {"first_differing_tensor": None}, "no state tensor differs from offloading=False beyond its floor",
                        deciding={"first differing tensor": None})
    return Decision(first["kind"] == ATTENTION_KV, {"first_differing_tensor": first},
                    f"first differing: {first['tensor']} ({first['kind']}) after {first['call']}",
                    deciding={"first differing tensor": f"{first['tensor']} after {first['call']}"},
                    source={"suspected tensor": "linear-attention recurrent/conv state"})


def decide_edge_removes_drift(steps: Any, states: Any) -> Decision:
    off, fixed = _arm(steps, "offloading=True"), _arm(steps, "offloading=True + 5.20.0 edge")
    drift = bool(off.differs.any()) or first_difference(_arm(states, "offloading=True")) is not None
    fixed_first = first_difference(_arm(states, "offloading=True + 5.20.0 edge"))
    clean = bool(fixed.matches.all()) and fixed_first is None
    ev = {"drift_without_edge": drift, "fixed_max_abs_diff": fixed.max_abs_diff.tolist(),
          "fixed_noise_threshold": fixed.noise_threshold.tolist(), "fixed_first_differing_tensor": fixed_first}
    why = ("no drift without the edge: nothing to remove" if not drift else
           f"with the 5.20.0 edge every step within the floor = {bool(fixed.matches.all())}, first differing tensor: {fixed_first}")
    return Decision(drift and clean, ev, why, deciding={"drift without the edge": drift,
                                                       "max |logit diff| with the edge": float(fixed.max_abs_diff.max())})


CUDA_CLAIMS = ("offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
               "offload.ordering_edge_removes_drift")


def decisions(ex: GpuExperiment) -> dict[str, Decision]:
    """The four CUDA claims, decided from one experiment's tables (a simulated run says so in every reason)."""
    out = dict(zip(CUDA_CLAIMS, (decide_prefill_identical(ex.steps), decide_decode_drifts(ex.steps),
                                 decide_first_tensor(ex.states), decide_edge_removes_drift(ex.steps, ex.states))))
    if ex.settings.get("simulated_on_cpu"):
        for d in out.values():
            d.why = f"[simulated on CPU under recording stream stand-ins, not a GPU measurement] {d.why}"
    return out
