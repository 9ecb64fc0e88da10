"""Notebook 05's GPU experiment (transformers issue #48947), also a plain module: `python -m helpers.offload.gpu`.

Arms (helpers.offload.gpu_run.arms_of), per model (the tiny hybrid, its dense twin, and the report's 64-layer 48/16
layout in bfloat16 and the report's loop only), dtype (float32, bfloat16) and loop (the report's `run()` with no host
wait, the `.cpu()` loop, `generate()`): offloading=False twice (the noise floor), offloading=True, and offloading=True
with each fix edge (the 5.20.0 edge, which closes both hazards; a torch.Event per offload, host-buffer only, run where
the device probe says its wait holds; `record_stream` on prefetched K/V, reuse only); in the report's loop also
offloading=True again and offloading=True with no injected lag. Every other arm runs under the same calibrated device
lag (helpers.offload.calibrate, after warming the clocks), each offloading arm after the pinned pool is poisoned
(helpers.offload.arms), with CUDA timing events around every copy (helpers.offload.calibrate), so the race is
observed on the device, not inferred from logits. The runs are in helpers.offload.gpu_run, the decisions in
helpers.offload.gpu_decide. The plain module needs only torch, transformers, pandas and matplotlib and writes
`<out>/gpu-arms.json` (and `<out>/arms.jsonl`, one line per arm as each loop's arms finish); `make gpu-check` runs it
per release and decides from two releases' results the claim that compares them (`releases_claim`); the notebook
calls `experiment` and `decisions`.
`simulate=True` (`--simulate`) runs the same code on CPU under the recording stand-ins: a simulation, never a GPU result.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvresume import compat
from . import gpu_decide as gd
from .arms import OFF
from .gpu_run import EVENT, MODELS, GpuExperiment, experiment, primary_key, usable_dtypes  # noqa: F401 - tests'
from .loops import LOOPS, Decision, random_ids
from .finding import FINDING

# Once the lag is injected these hold by construction (never counted as the report's statements: helpers/quotes.py
# says so in by_construction); GPU_DECIDES: what only a GPU decides, each able to fail, and the arms that feed it.
BY_CONSTRUCTION = {**{cid: FINDING.claims[cid].by_construction for cid in (
    "offload.prefill_identical", "offload.decode_drifts", "offload.first_differing_tensor_is_attention_kv",
    "offload.race_observed_on_device")},
    "offload.drift_only_without_ordering_edge": "the same lag on both releases, and 5.20.0's edge orders the reads it "
                                                "races"}
GPU_DECIDES = {
    "offload.ordering_edge_removes_drift": ("whether 5.20.0's ordering edge removes the logit drift",
                                            "offloading=True and + 5.20.0 edge, report loop, every model that drifts "
                                            "(the 64-layer layout's included)"),
    "offload.offload_event_removes_drift": ("whether an event after each offload removes it (host-buffer hazard only)",
                                            "+ offload event (where the device probe holds), report loop, every model"),
    "offload.record_stream_removes_drift": ("whether record_stream on the prefetched K/V removes it (reuse hazard "
                                            "only)", "+ record_stream, report loop, every model"),
    "offload.block_overwritten_under_pending_read": (
        "device-timed count of prefetches that overwrite a block whose read has not finished (the allocator's reuse), "
        "none with record_stream", "every offloading arm's CUDA events and data pointers (64-layer included)"),
    "offload.unlagged_run_drifts": ("whether a run with no injected lag drifts at all (logits; end state shown apart)",
                                    "offloading=True (unlagged), report loop, every model (64-layer included)"),
}


def claim_type(cid: str) -> dict[str, Any]:
    """Whether a GPU claim can fail on a GPU, and why not (by construction) or what it decides and from which arms."""
    if cid in BY_CONSTRUCTION:
        return {"can_fail": False, "by_construction": BY_CONSTRUCTION[cid]}
    what, arms = GPU_DECIDES[cid]
    return {"can_fail": True, "decides": what, "fed_by": arms}


CLAIM_TEXT = {
    "offload.prefill_identical": "With DynamicCache(config=model.config, offloading=True) on CUDA, in the report's loop, the prefill logits equal offloading=False's within the noise floor (the same run twice without offloading).",
    "offload.decode_drifts": "On CUDA, in the report's loop, from the first decode step that reuses the offloaded cache, offloading=True logits differ from offloading=False by more than the noise floor.",
    "offload.first_differing_tensor_is_attention_kv": "On CUDA with a calibrated device lag, the first cache tensor that differs from offloading=False (earliest snapshot, then host write order) is an attention layer's K/V, not a linear-attention conv/recurrent state (refuting the report's hypothesis).",
    "offload.ordering_edge_removes_drift": "On CUDA with a calibrated device lag, adding the 5.20.0 edge (prefetch_stream.wait_stream(default_stream)) to the installed Cache.update removes the drift: every step within the noise floor, no state tensor differs.",
    "offload.race_observed_on_device": "On CUDA with a calibrated device lag, CUDA event timestamps show prefetch copies starting before the offload copy that fills their host buffer has ended (without a fix edge), and none with the 5.20.0 edge.",
    "offload.offload_event_removes_drift": "On CUDA, the host-buffer-only fix (a torch.Event recorded after each offload, waited by the prefetch stream; run only where a device probe shows that wait holds) removes the drift in the report's loop, on the first model whose CPU record shows the fix arms narrow (the event closing only the host-buffer hazard, record_stream only the reuse one).",
    "offload.record_stream_removes_drift": "On CUDA, the reuse-only fix (record_stream(default stream) on the prefetched K/V) removes the drift in the report's loop, on the first model whose CPU record shows the fix arms narrow.",
    "offload.block_overwritten_under_pending_read": "On CUDA, device-timed: without a fix some prefetch copy writes a device block whose earlier read on the default stream has not finished (the allocator's reuse, seen from data_ptr and CUDA events), and none does with record_stream.",
    "offload.unlagged_run_drifts": "On CUDA with no injected lag, offloading=True in the report's loop drifts beyond the noise floor on some model (the 64-layer layout included where it ran); logits decide, end-state drift is shown apart.",
}
CUDA_CLAIMS = tuple(CLAIM_TEXT)  # the two decided from device timing / unlagged arms last
CLAIM_KINDS = {cid: FINDING.kinds()[cid] for cid in CUDA_CLAIMS}  # from their quotes' roles
SIMULATED = "[simulated on CPU under recording stream stand-ins, not a GPU measurement] "


def decisions(ex: GpuExperiment) -> dict[str, Decision]:
    """The CUDA claims, decided from one experiment's tables (a simulated run says so in every reason)."""
    key = ex.primary()
    narrow = gd.narrow_key(key, ex.edges)  # the narrow arms are decided where the record says they are narrow
    out = {"offload.prefill_identical": gd.decide_prefill_identical(ex.steps, key),
           "offload.decode_drifts": gd.decide_decode_drifts(ex.steps, key),
           "offload.first_differing_tensor_is_attention_kv": gd.decide_first_tensor(ex.states, ("cpu", *key[1:])),
           "offload.ordering_edge_removes_drift": gd.fix_everywhere(ex.steps, ex.states, key, "5.20.0 edge"),
           "offload.race_observed_on_device": gd.decide_race_observed(ex.counts),
           "offload.offload_event_removes_drift": _event_decision(ex, narrow),
           "offload.record_stream_removes_drift": gd.fix_everywhere(ex.steps, ex.states, narrow, "record_stream"),
           "offload.block_overwritten_under_pending_read": gd.decide_overwrote_pending_read(ex.counts),
           "offload.unlagged_run_drifts": gd.decide_unlagged_drift(ex.steps, ex.states)}
    for cid in ("offload.offload_event_removes_drift", "offload.record_stream_removes_drift"):
        out[cid].evidence["narrow_on_cpu_record"] = gd.narrow_models(ex.edges)
    if ex.settings.get("simulated_on_cpu"):
        for d in out.values():
            d.why = SIMULATED + d.why
    return out


def _event_decision(ex: GpuExperiment, key: gd.Key) -> Decision:
    """The offload-event fix, where the device probe let its arm run; else skipped with the probe's reason."""
    if EVENT in ex.settings.get("fixes", (EVENT,)):  # hand-made tables without settings: decided as they are
        return gd.fix_everywhere(ex.steps, ex.states, key, EVENT)
    return Decision(False, {"arm": list(key), "event_probe": ex.settings.get("event_probe")},
                    f"not run: {ex.settings.get('event_arm_gate') or 'the offload-event arm was not asked for'}", skipped=True)


def explain(ex: GpuExperiment) -> list[dict[str, Any]]:
    """Each explanation's prediction and whether the run matched it, per model in the primary dtype, with whether the
    CPU record says the narrow fix arms are narrow on that model (where they are not, (c) cannot be told from (a)). Only
    models that ran both the `.cpu()` loop and the report's loop in that dtype (the predictions read both)."""
    dtype, narrow = ex.primary()[2], gd.narrow_models(ex.edges)
    ran = {(r.model, r.loop) for r in ex.steps[ex.steps.dtype == dtype].itertuples()}
    models = [m for m in ex.settings["models"] if (m, "cpu") in ran and (m, "report") in ran]
    return [{"model": model, "dtype": dtype, "fix_arms_narrow_on_cpu_record": model in narrow, **row}
            for model in models for row in gd.explanations(ex.steps, ex.states, ex.counts, model, dtype)]


def default_models(seed: int = 0, batch_size: int = 2, seq_len: int = 64, device: str = "cuda",
                   names: tuple[str, ...] = MODELS) -> tuple[dict[str, Any], dict[str, Any]]:
    """The layouts `names` (seeded, built from config: the tiny hybrid, its dense twin, the report's 64-layer layout)
    and their random ids, on `device`."""
    from .. import hybrid

    models = {name: hybrid.build_layout(name, seed).to(device) for name in names}
    return models, {name: random_ids(m, batch_size, seq_len, seed, device) for name, m in models.items()}


def results_json(ex: GpuExperiment, seconds: float) -> dict[str, Any]:
    """The plain module's results: claims with their kind and verdict, and the tables."""
    from ..results import verdict_for

    records = lambda f: json.loads(f.to_json(orient="records", default_handler=str))  # noqa: E731 - NaN -> null
    claims = [{"id": cid, "kind": CLAIM_KINDS[cid], "verdict": "skipped" if d.skipped else verdict_for(CLAIM_KINDS[cid], d.holds),
               "reason": d.why, "deciding": d.deciding, "source": d.source, **claim_type(cid)}
              for cid, d in decisions(ex).items()]
    return {"schema": "kvkit-gpu-arms/1", "release": compat.TRANSFORMERS_VERSION, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (simulated)",
            "seconds": round(seconds, 1), "settings": ex.settings, "claims": claims,
            "tables": {"steps": records(ex.steps), "race_counts": records(ex.counts),
                       "states_differing": records(ex.states[ex.states.differs]),
                       "explanations": json.loads(json.dumps(explain(ex), default=str)),
                       "edges_on_cpu_record": records(ex.edges) if ex.edges is not None else None,
                       "calibration": ex.calibration, "memory": json.loads(json.dumps(ex.memory, default=str)),
                       "unlagged": gd.unlagged_rows(ex.steps, ex.states),
                       "run_to_run": ex.repeat}}


def main(argv: list[str] | None = None) -> int:
    """`python -m helpers.offload.gpu --out DIR [--dtypes ...] [--simulate]`: 0 ran, 2 refused (no CUDA), 1 error."""
    from ..pipeline.paths import output_dir
    from ..pipeline.run.params import cuda_status

    p = argparse.ArgumentParser(prog="python -m helpers.offload.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="folder for gpu-arms.json (default outputs/gpu/<release>)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=list(LOOPS))
    p.add_argument("--n-steps", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--simulate", action="store_true", help="CPU under the recording stand-ins (a simulation; tests)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--lag-from", default=None, help="another run's gpu-arms.json: use its sleep per model and dtype (same lag)")
    args = p.parse_args(argv)
    ok, why = cuda_status()
    if not args.simulate and not (ok and torch.cuda.is_available()):
        print(f"helpers.offload.gpu: refused, CUDA is not usable here ({why or 'torch.cuda.is_available() is False'}); nothing was run.")
        return 2
    out = Path(args.out) if args.out else output_dir("gpu", compat.TRANSFORMERS_VERSION)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models, ids_of = default_models(0, 2, args.seq_len, "cpu" if args.simulate else "cuda", tuple(args.models))
    other = lags(json.loads(Path(args.lag_from).read_text())) if args.lag_from else None  # None: calibrate here
    ex = experiment(models, ids_of, tuple(args.dtypes), tuple(args.loops), args.n_steps, simulate=args.simulate,
                    cycles_of=other, on_arms=arms_writer(out / ARMS_LOG))
    data = results_json(ex, time.perf_counter() - start)
    (out / "gpu-arms.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    for c in data["claims"]:
        print(f"{c['id']}: {c['verdict']} - {c['reason'][:200]}")
    print(f"wrote {out.name}/gpu-arms.json in {data['seconds']} s")
    return 0


ARMS_LOG = "arms.jsonl"  # one line per arm, written as each loop's arms finish


def arms_writer(path: Path) -> Any:
    """A callback that appends each finished arm to `path` (emptied first) and flushes it, with a line on stdout."""
    path.write_text("")

    def write(rows: list[dict[str, Any]]) -> None:
        with path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")
        for row in rows:
            print(f"arm done: {row['loop']} / {row['model']} / {row['dtype']} / {row['variant']}", flush=True)
    return write


# --- the claim that compares releases (`make gpu-check`): a pure function of two of this module's results (gpu-arms.json,
# as loaded): the report's loop on the primary model and dtype, offloading=True beyond the noise floor measured in the
# same run (logits) or a state tensor beyond its floor, on the release without the prefetch-stream ordering edge and
# on the one with it (5.20.0). Not the same models or not the same lag: not like with like, skipped.

RELEASE_CLAIM = "offload.drift_only_without_ordering_edge"
RELEASE_KIND = "beyond"
RELEASE_STATEMENT = ("On CUDA, with the same models and the same calibrated device lag, offloading=True drifts in the "
                     "report's loop on the release without the prefetch-stream ordering edge and does not on the first "
                     "release with it (5.20.0).")


def release_drift(data: dict[str, Any], key: tuple[str, str, str]) -> bool | None:
    """offloading=True beyond the floor at `key` (a step or a state tensor); None: that arm is not in the run."""
    match = lambda r: (r["loop"], r["model"], r["dtype"]) == key and r["variant"] == OFF  # noqa: E731
    steps = [r for r in data["tables"]["steps"] if match(r)]
    if not steps:
        return None
    return any(bool(r["differs"]) for r in steps) or any(match(r) for r in data["tables"].get("states_differing") or [])


def lags(data: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(model, dtype) -> the sleep per forward the run used (cycles)."""
    rows = data.get("tables", {}).get("calibration", [])
    return {(r["model"], r["dtype"]): int(r["sleep_cycles_used"]) for r in rows}


def releases_claim(without: dict[str, Any], with_edge: dict[str, Any]) -> dict[str, Any]:
    """The claim's record (id, kind, verdict, reason, evidence) from the two releases' results ({}: not run)."""
    out = {"id": RELEASE_CLAIM, "kind": RELEASE_KIND, "statement": RELEASE_STATEMENT}
    missing = [r for r, d in (("without the edge", without), ("with the edge", with_edge)) if not d.get("tables")]
    if missing:
        return {**out, "verdict": "skipped", "reason": f"no GPU arms result for the release {' and '.join(missing)}", "evidence": {}}
    key, lag_a, lag_b = primary_key(without), lags(without), lags(with_edge)
    same_models = without["settings"].get("runs") == with_edge["settings"].get("runs")
    common = sorted(set(lag_a) & set(lag_b))
    same_lag = bool(common) and all(lag_a[k] == lag_b[k] for k in common)
    ev = {"key": list(key), "release_without": without.get("release"), "release_with": with_edge.get("release"),
          "same_models": same_models, "same_lag": same_lag,
          "lag_cycles": {f"{m}/{d}": [lag_a[(m, d)], lag_b[(m, d)]] for m, d in common},
          "drift_without_edge": release_drift(without, key), "drift_with_edge": release_drift(with_edge, key)}
    simulated = without["settings"].get("simulated_on_cpu") or with_edge["settings"].get("simulated_on_cpu")
    prefix = "[simulated on CPU] " if simulated else ""
    unlike = [w for w, bad in (("different models", not same_models), ("different lag", not same_lag),
                               ("the arm is missing", None in (ev["drift_without_edge"], ev["drift_with_edge"]))) if bad]
    if unlike:
        return {**out, "verdict": "skipped", "reason": prefix + "not like with like: " + ", ".join(unlike), "evidence": ev}
    holds = bool(ev["drift_without_edge"]) and not ev["drift_with_edge"]
    why = (f"{'/'.join(key)}: drift on {ev['release_without']} = {ev['drift_without_edge']}, on {ev['release_with']} = "
           f"{ev['drift_with_edge']} (same models, same lag)")
    return {**out, "verdict": "holds" if holds else "fails", "reason": prefix + why, "evidence": ev}

if __name__ == "__main__":
    sys.exit(main())
