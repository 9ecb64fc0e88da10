"""Notebook 05's GPU experiment (transformers issue #48947), also a plain module: `python -m helpers.offload.gpu`.

Arms, per model (the tiny hybrid and its dense twin), dtype (float32, bfloat16) and loop (the report's `run()` with
no host wait, the `.cpu()` loop, `generate()`): offloading=False twice (the noise floor), offloading=True, and
offloading=True with each fix edge (the 5.20.0 edge, which closes both hazards; an event per offload, host-buffer
only; `record_stream` on prefetched K/V, reuse only). Every arm runs under the same calibrated device lag
(helpers.offload.calibrate) and, when offloading, with CUDA timing events around every copy
(helpers.offload.devicetiming), so the race is observed on the device, not inferred from logits. The decisions are
in helpers.offload.gpu_decide. The plain module needs only torch, transformers, pandas and matplotlib and writes
`<out>/gpu-arms.json`; `make gpu-check` runs it per release; the notebook calls `experiment` and `decisions`.
`simulate=True` (`--simulate`) runs the same code on CPU under the recording stand-ins: a simulation, never a GPU result.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import compat
from . import gpu_decide as gd
from .arms import AGAIN, FIXES, OFF, OFF_AGAIN, Arm, run_arm
from .calibrate import busy_at_wrap, cycles_per_ms, host_ms_to_wrap, sleep_plan
from .loops import LOOPS, Decision, random_ids
from .states import compare_logits, compare_states
from .standins import recording_streams

CUDA_CLAIMS = ("offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
               "offload.ordering_edge_removes_drift", "offload.race_observed_on_device",
               "offload.offload_event_removes_drift", "offload.record_stream_removes_drift")
CLAIM_TEXT = {
    "offload.prefill_identical": "With DynamicCache(config=model.config, offloading=True) on CUDA, in the report's loop, the prefill logits equal offloading=False's within the noise floor (the same run twice without offloading).",
    "offload.decode_drifts": "On CUDA, in the report's loop, from the first decode step that reuses the offloaded cache, offloading=True logits differ from offloading=False by more than the noise floor.",
    "offload.first_differing_tensor_is_attention_kv": "On CUDA with a calibrated device lag, the first cache tensor that differs from offloading=False (earliest snapshot, then host write order) is an attention layer's K/V, not a linear-attention conv/recurrent state (refuting the report's hypothesis).",
    "offload.ordering_edge_removes_drift": "On CUDA with a calibrated device lag, adding the 5.20.0 edge (prefetch_stream.wait_stream(default_stream)) to the installed Cache.update removes the drift: every step within the noise floor, no state tensor differs.",
    "offload.race_observed_on_device": "On CUDA with a calibrated device lag, CUDA event timestamps show prefetch copies starting before the offload copy that fills their host buffer has ended (without a fix edge), and none with the 5.20.0 edge.",
    "offload.offload_event_removes_drift": "On CUDA, the host-buffer-only fix (an event recorded after each offload, waited by the prefetch stream) removes the drift in the report's loop, on the first model whose CPU record shows the fix arms narrow (the event closing only the host-buffer hazard, record_stream only the reuse one).",
    "offload.record_stream_removes_drift": "On CUDA, the reuse-only fix (record_stream(default stream) on the prefetched K/V) removes the drift in the report's loop, on the first model whose CPU record shows the fix arms narrow.",
}
CLAIM_KINDS = {"offload.prefill_identical": "reproduces", "offload.decode_drifts": "reproduces",
               "offload.first_differing_tensor_is_attention_kv": "refutes", "offload.ordering_edge_removes_drift": "beyond",
               "offload.race_observed_on_device": "beyond", "offload.offload_event_removes_drift": "beyond",
               "offload.record_stream_removes_drift": "beyond"}
MODELS = ("tiny hybrid", "tiny dense")
SIMULATED = "[simulated on CPU under recording stream stand-ins, not a GPU measurement] "


@dataclass
class GpuExperiment:
    """Every arm's tables, the calibration per model and dtype, and the settings."""

    steps: Any
    states: Any
    timing: Any
    counts: Any
    calibration: list[dict[str, Any]]
    memory: list[dict[str, Any]]
    settings: dict[str, Any]
    arms: list[Arm] = field(default_factory=list, repr=False)
    repeat: list[dict[str, Any]] = field(default_factory=list)
    edges: Any = None

    def primary(self) -> gd.Key:
        """The report's own arm: its loop, the hybrid, bfloat16 where it ran."""
        dtypes = self.settings["dtypes"]
        return ("report", self.settings["models"][0], "bfloat16" if "bfloat16" in dtypes else dtypes[0])


def _tag(frame: Any, **cols: Any) -> Any:
    for i, (k, v) in enumerate(cols.items()):
        frame.insert(i, k, v)
    return frame


def calibrate(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, rate: float, simulate: bool) -> dict[str, Any]:
    """Two offloading `.cpu()` runs with no sleep (the first a warm-up, the same for every model and dtype): the host
    time to the wrap prefetch in the second, and the sleep chosen from it."""
    run_arm(model, ids, n_steps, "cpu", True, 0, simulate=simulate)
    probe = run_arm(model, ids, n_steps, "cpu", True, 0, simulate=simulate)
    return sleep_plan(host_ms_to_wrap(probe.timing), rate)


def _loop_arms(model: torch.nn.Module, ids: torch.Tensor, n_steps: int, loop: str, cycles: int, fixes: tuple[str, ...],
               simulate: bool, race_lag: int | None) -> list[Arm]:
    kw = dict(model=model, ids=ids, n_steps=n_steps, loop=loop, cycles=cycles, simulate=simulate, race_lag=race_lag)
    base, again = run_arm(offloading=False, **kw), run_arm(offloading=False, **kw)
    again.name = AGAIN
    tested = [run_arm(offloading=True, edge=e, **kw) for e in (None, *fixes)]
    if loop == "report":  # run to run: the report calls its numbers exactly reproducible
        repeat = run_arm(offloading=True, **kw)
        repeat.name = OFF_AGAIN
        tested.append(repeat)
    return [base, again] + tested


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
    steps = [_tag(compare_logits(base.run, again.run, a.run, dtype, a.name), **tags) for a in tested]
    states = [_tag(compare_states(base.states, again.states, a.states, dtype, a.name, a.calls, a.order), **tags) for a in tested]
    timing = [_tag(a.timing.copy(), **tags, variant=a.name) for a in tested if a.timing is not None and len(a.timing)]
    return steps, states, timing


def usable_dtypes(dtypes: tuple[str, ...], device: torch.device) -> tuple[tuple[str, ...], dict[str, str]]:
    """The dtypes this device runs, and the ones left out with the reason (bfloat16 on a GPU without it, e.g. a T4)."""
    dropped: dict[str, str] = {}
    if device.type == "cuda" and "bfloat16" in dtypes and not torch.cuda.is_bf16_supported():
        dropped["bfloat16"] = f"{torch.cuda.get_device_name(device)}: torch.cuda.is_bf16_supported() is False"
    return tuple(d for d in dtypes if d not in dropped), dropped


def experiment(models: dict[str, torch.nn.Module], ids_of: dict[str, torch.Tensor], dtypes: tuple[str, ...] = ("float32", "bfloat16"),
               loops: tuple[str, ...] = LOOPS, n_steps: int = 4, fixes: tuple[str, ...] = FIXES, simulate: bool = False,
               race_lag: int | None = None, cycles: int | None = None) -> GpuExperiment:
    """Every arm on every model, dtype and loop; `cycles` overrides the calibrated sleep."""
    import pandas as pd

    device = next(iter(ids_of.values())).device
    dtypes, dropped = usable_dtypes(tuple(dtypes), device)
    if not dtypes:
        raise ValueError(f"no dtype left to run: {dropped}")
    with recording_streams() if simulate else nullcontext():
        rate = cycles_per_ms()
    steps, states, timing, calibration, memory, kept, repeat = [], [], [], [], [], [], []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for name, model in models.items():
            m = model if next(model.parameters()).dtype == dtype else copy.deepcopy(model).to(dtype)
            ids = ids_of[name]
            plan = calibrate(m, ids, n_steps, rate, simulate)
            sleep = plan["sleep_cycles"] if cycles is None else int(cycles)
            calibration.append({"model": name, "dtype": dtype_name, **plan, "sleep_cycles_used": sleep})
            for loop in loops:
                arms = _loop_arms(m, ids, n_steps, loop, sleep, fixes, simulate, race_lag)
                tags = {"loop": loop, "model": name, "dtype": dtype_name}
                s, st, t = _compare(arms, dtype, tags)
                repeat += repeat_rows(arms, tags)
                steps += s; states += st; timing += t
                memory += [{**tags, "variant": a.name, **a.memory, "stale_reads_served": a.stale_reads,
                            **({"wrap": busy_at_wrap(a.timing)} if a.timing is not None else {})} for a in arms]
                kept += arms
    timing_frame = pd.concat(timing, ignore_index=True) if timing else _empty_timing()
    edges = edge_record(models, ids_of, n_steps) if fixes else None
    settings = {"device": str(device), "dtypes": list(dtypes), "dtypes_left_out": dropped, "loops": list(loops), "models": list(models),
                "fixes": list(fixes), "n_steps": n_steps, "input_shape": {k: list(v.shape) for k, v in ids_of.items()},
                "simulated_on_cpu": simulate, "race_lag": race_lag, "cycles_override": cycles,
                "empty_cache_between_arms": False, "event_resolution_ms": gd.RESOLUTION_MS}
    return GpuExperiment(pd.concat(steps, ignore_index=True), pd.concat(states, ignore_index=True),
                         timing_frame, gd.race_counts(timing_frame),
                         calibration, memory, settings, kept, repeat, edges)


RECORD_LIMIT = 50_000_000  # parameters: models up to this size also get the CPU record of which edge closes which hazard


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


def _empty_timing() -> Any:
    import pandas as pd

    return pd.DataFrame(columns=["loop", "model", "dtype", "variant", "lead_ms", "cross_forward", "overwrote_pending_read",
                                 "default_busy_at_enqueue"])


def decisions(ex: GpuExperiment) -> dict[str, Decision]:
    """The CUDA claims, decided from one experiment's tables (a simulated run says so in every reason)."""
    key = ex.primary()
    narrow = gd.narrow_key(key, ex.edges)  # the narrow arms are decided where the record says they are narrow
    out = {"offload.prefill_identical": gd.decide_prefill_identical(ex.steps, key),
           "offload.decode_drifts": gd.decide_decode_drifts(ex.steps, key),
           "offload.first_differing_tensor_is_attention_kv": gd.decide_first_tensor(ex.states, ("cpu", *key[1:])),
           "offload.ordering_edge_removes_drift": gd.decide_fix_removes_drift(ex.steps, ex.states, key, "5.20.0 edge"),
           "offload.race_observed_on_device": gd.decide_race_observed(ex.counts),
           "offload.offload_event_removes_drift": gd.decide_fix_removes_drift(ex.steps, ex.states, narrow, "offload event"),
           "offload.record_stream_removes_drift": gd.decide_fix_removes_drift(ex.steps, ex.states, narrow, "record_stream")}
    for cid in ("offload.offload_event_removes_drift", "offload.record_stream_removes_drift"):
        out[cid].evidence["narrow_on_cpu_record"] = gd.narrow_models(ex.edges)
    if ex.settings.get("simulated_on_cpu"):
        for d in out.values():
            d.why = SIMULATED + d.why
    return out


def explain(ex: GpuExperiment) -> list[dict[str, Any]]:
    """Each explanation's prediction and whether the run matched it, per model in the primary dtype, with whether the
    CPU record says the narrow fix arms are narrow on that model (where they are not, (c) cannot be told from (a))."""
    dtype, narrow = ex.primary()[2], gd.narrow_models(ex.edges)
    return [{"model": model, "dtype": dtype, "fix_arms_narrow_on_cpu_record": model in narrow, **row}
            for model in ex.settings["models"] for row in gd.explanations(ex.steps, ex.states, ex.counts, model, dtype)]


def default_models(seed: int = 0, batch_size: int = 2, seq_len: int = 64, device: str = "cuda") -> tuple[dict[str, Any], dict[str, Any]]:
    """The tiny hybrid and its dense twin (seeded, built from config) and their random ids, on `device`."""
    from .. import hybrid

    models = {name: hybrid.build_layout(name, seed).to(device) for name in MODELS}
    return models, {name: random_ids(m, batch_size, seq_len, seed, device) for name, m in models.items()}


def results_json(ex: GpuExperiment, seconds: float) -> dict[str, Any]:
    """The plain module's results: claims with their kind and verdict, and the tables."""
    from ..results import verdict_for

    records = lambda f: json.loads(f.to_json(orient="records", default_handler=str))  # noqa: E731 - NaN -> null
    claims = [{"id": cid, "kind": CLAIM_KINDS[cid], "verdict": verdict_for(CLAIM_KINDS[cid], d.holds), "reason": d.why,
               "deciding": d.deciding, "source": d.source} for cid, d in decisions(ex).items()]
    return {"schema": "kvkit-gpu-arms/1", "release": compat.TRANSFORMERS_VERSION, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (simulated)",
            "seconds": round(seconds, 1), "settings": ex.settings, "claims": claims,
            "tables": {"steps": records(ex.steps), "race_counts": records(ex.counts),
                       "states_differing": records(ex.states[ex.states.differs]),
                       "explanations": json.loads(json.dumps(explain(ex), default=str)),
                       "edges_on_cpu_record": records(ex.edges) if ex.edges is not None else None,
                       "calibration": ex.calibration, "memory": json.loads(json.dumps(ex.memory, default=str)),
                       "run_to_run": ex.repeat}}


def main(argv: list[str] | None = None) -> int:
    """`python -m helpers.offload.gpu --out DIR [--dtypes ...] [--simulate]`: 0 ran, 2 refused (no CUDA), 1 error."""
    from ..pipeline.run.params import cuda_status

    p = argparse.ArgumentParser(prog="python -m helpers.offload.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for gpu-arms.json (default outputs/gpu/<release>)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    p.add_argument("--n-steps", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simulate", action="store_true", help="CPU under the recording stand-ins (a simulation; tests)")
    p.add_argument("--race-lag", type=int, default=None, help="with --simulate: serve stale reads this many cache-update calls")
    args = p.parse_args(argv)
    ok, why = cuda_status()
    if not args.simulate and not (ok and torch.cuda.is_available()):
        print(f"helpers.offload.gpu: refused, CUDA is not usable here ({why or 'torch.cuda.is_available() is False'}); nothing was run.")
        return 2
    out = Path(args.out) if args.out else _default_out()
    start = time.perf_counter()
    models, ids_of = default_models(args.seed, 2, args.seq_len, "cpu" if args.simulate else "cuda")
    ex = experiment(models, ids_of, tuple(args.dtypes), tuple(args.loops), args.n_steps, simulate=args.simulate,
                    race_lag=args.race_lag)
    data = results_json(ex, time.perf_counter() - start)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-arms.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    for c in data["claims"]:
        print(f"{c['id']}: {c['verdict']} - {c['reason'][:200]}")
    print(f"wrote {out.name}/gpu-arms.json in {data['seconds']} s")
    return 0


def _default_out() -> Path:
    from ..pipeline.paths import output_dir

    return output_dir("gpu", compat.TRANSFORMERS_VERSION)


if __name__ == "__main__":
    sys.exit(main())
