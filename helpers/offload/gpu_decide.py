"""The GPU arms' decisions, each a pure function of the experiment's tables (every one has a test that feeds it a
contradicting measurement), and each explanation's prediction beside what the run showed.

Tables (pandas, one row per ...): `steps` per arm and forward call (loop, model, dtype, variant, step, max_abs_diff,
noise_threshold, matches, differs, bitwise_equal); `states` per arm, snapshot and state tensor (step, layer, kind,
write_order, differs); `timing` per offloading arm and prefetch copy (lead_ms = producing copy's end minus the
prefetch's start on the device clock, cross_forward, overwrote_pending_read, default_busy_at_enqueue).
"""
from __future__ import annotations

from typing import Any

from .arms import OFF, UNLAGGED, variant_name
from .loops import Decision
from .replay import REPORT_VALUES
from .states import ATTENTION_KV, first_difference

RESOLUTION_MS = 0.001  # CUDA event timestamps resolve about 0.5 us: a lead below 1 us is not counted
Key = tuple[str, str, str]  # (loop, model, dtype)
COUNT_COLUMNS = ["loop", "model", "dtype", "variant", "prefetches", "started_before_producer_done", "same_forward",
                 "earlier_forward", "max_lead_ms", "overwrote_pending_read", "default_busy_at_enqueue"]  # race_counts


def _arm(table: Any, key: Key, variant: str) -> Any:
    loop, model, dtype = key
    return table.loc[(table.loop == loop) & (table.model == model) & (table.dtype == dtype) & (table.variant == variant)]


def decide_prefill_identical(steps: Any, key: Key) -> Decision:
    """`offload.prefill_identical`: the prefill logits of offloading=True are within the floor of offloading=False."""
    row = _arm(steps, key, OFF).sort_values("step").iloc[0]
    ev = {"arm": list(key), "prefill_max_abs_diff": float(row.max_abs_diff), "noise_threshold": float(row.noise_threshold),
          "bitwise_equal": bool(row.bitwise_equal)}
    return Decision(bool(row.matches), ev, f"{key[0]} loop, {key[1]}, {key[2]}: prefill max |diff| {row.max_abs_diff:.3g} "
                    f"vs noise threshold {row.noise_threshold:.3g}",
                    deciding={"prefill max |logit diff|": float(row.max_abs_diff), "noise threshold": float(row.noise_threshold)},
                    source={"prefill max |logit diff|": REPORT_VALUES["prefill max |logit diff|"]})


def decide_decode_drifts(steps: Any, key: Key) -> Decision:
    """`offload.decode_drifts`: the first decode call of offloading=True differs beyond the floor."""
    decode = _arm(steps, key, OFF).sort_values("step")
    decode = decode[decode.step > 0]
    ev = {"arm": list(key), "max_abs_diff": decode.max_abs_diff.tolist(), "noise_threshold": decode.noise_threshold.tolist(),
          "argmax_match": decode.argmax_match.tolist()}
    holds = len(decode) > 0 and bool(decode.differs.iloc[0])
    first = {"decode 1 max |logit diff|": float(decode.max_abs_diff.iloc[0]) if len(decode) else None,
             "noise threshold": float(decode.noise_threshold.iloc[0]) if len(decode) else None}
    why = (f"{key[0]} loop, {key[1]}, {key[2]}: decode max |diff| {[round(v, 4) for v in decode.max_abs_diff]} "
           f"vs thresholds {[float(f'{v:.3g}') for v in decode.noise_threshold]}")
    return Decision(holds, ev, why, deciding=first, source={"decode 1 max |logit diff|": REPORT_VALUES["decode 1 max |logit diff|"]})


def decide_first_tensor(states: Any, key: Key) -> Decision:
    """`offload.first_differing_tensor_is_attention_kv` (refutes the report's hypothesis when it holds)."""
    first = first_difference(_arm(states, key, OFF))
    if first is None:
        return Decision(False, {"arm": list(key), "first_differing_tensor": None},
                        "no state tensor differs from offloading=False beyond its floor", deciding={"first differing tensor": None})
    return Decision(first["kind"] == ATTENTION_KV, {"arm": list(key), "first_differing_tensor": first},
                    f"{key[0]} loop: first differing (host write order): {first['tensor']} ({first['kind']}) after {first['call']}",
                    deciding={"first differing tensor": f"{first['tensor']} after {first['call']}"},
                    source={"suspected tensor": "linear-attention recurrent/conv state"})


def logit_drift(steps: Any, key: Key, variant: str) -> bool:
    """Some forward's logits beyond the floor: what a caller reads."""
    return bool(_arm(steps, key, variant).differs.any())


def state_drift(states: Any, key: Key, variant: str) -> bool:
    """Some state tensor beyond its floor; in the report's loop that is the end state only, which can hold a corrupted
    layer copy (the last wrap prefetch) that no logit read."""
    return first_difference(_arm(states, key, variant)) is not None


def drifts(steps: Any, states: Any, key: Key, variant: str) -> bool:
    """Some step beyond the floor, or some state tensor beyond its floor."""
    return logit_drift(steps, key, variant) or state_drift(states, key, variant)


def clean(steps: Any, states: Any, key: Key, variant: str) -> bool:
    """The arm ran and does not drift (an arm that did not run is not clean)."""
    return len(_arm(steps, key, variant)) > 0 and not drifts(steps, states, key, variant)


def unlagged_rows(steps: Any, states: Any) -> list[dict[str, Any]]:
    """Per key with an unlagged offloading arm: whether it drifts without the injected lag, its largest step diff."""
    rows = []
    for (loop, model, dtype), t in steps[steps.variant == UNLAGGED].groupby(["loop", "model", "dtype"], sort=False):
        key = (loop, model, dtype)
        rows.append({"loop": loop, "model": model, "dtype": dtype, "drifts_without_lag": drifts(steps, states, key, UNLAGGED),
                     "max_abs_diff": float(t.max_abs_diff.max()), "steps_beyond_floor": int(t.differs.sum()),
                     "drifts_with_lag": drifts(steps, states, key, OFF),
                     "logit_drift_without_lag": logit_drift(steps, key, UNLAGGED),
                     "end_state_drift_without_lag": state_drift(states, key, UNLAGGED)})
    return rows


def decide_unlagged_drift(steps: Any, states: Any) -> Decision:
    """`offload.unlagged_run_drifts` (a GPU decides it): with no injected lag, some report-loop arm's logits differ
    beyond the floor on some model (the 64-layer layout included); end-state drift is shown apart, not counted."""
    rows = unlagged_rows(steps, states)
    by = {f"{r['model']}/{r['dtype']}": r["logit_drift_without_lag"] for r in rows}
    ends = {f"{r['model']}/{r['dtype']}": r["end_state_drift_without_lag"] for r in rows}
    holds = any(by.values())
    why = ("no unlagged arm ran" if not rows else
           f"report loop, no injected lag: logits beyond the floor per model {by}; end state beyond its floor {ends}")
    return Decision(holds, {"unlagged": rows}, why, deciding={"unlagged logit drift per model": by},
                    skipped=not rows)


def _fixed_counts(counts: Any, column: str, edge: str, what: str, names: tuple[str, str], key: str,
                  **extra: Any) -> Decision:
    """Device-counted: some offloading=True prefetch copy `what` (`column` > 0), and none in the `edge` arm (which must
    have run); the `edge` arm's count is evidence `key`."""
    plain, fixed = counts[counts.variant == OFF], counts[counts.variant == variant_name(edge)]
    n, fixed_n = int(plain[column].sum()), int(fixed[column].sum())
    per_arm = {f"{r.loop}/{r.model}/{r.dtype}": int(getattr(r, column)) for r in plain.itertuples()}
    why = (f"without a fix {n} of {int(plain.prefetches.sum())} prefetch copies {what} (per arm {per_arm}); with "
           f"{edge} {fixed_n} of {int(fixed.prefetches.sum())}")
    return Decision(n > 0 and len(fixed) > 0 and fixed_n == 0, {"per_arm": per_arm, key: fixed_n, **extra}, why,
                    deciding={names[0]: n, names[1]: fixed_n}, skipped=len(plain) == 0)


def decide_overwrote_pending_read(counts: Any) -> Decision:
    """`offload.block_overwritten_under_pending_read` (a GPU decides it): device-timed, some prefetch without a fix
    wrote a block whose earlier read had not finished, and none with record_stream (which keeps the block)."""
    return _fixed_counts(counts, "overwrote_pending_read", "record_stream", "overwrote a block under a pending read",
                         ("overwritten under a pending read", "same, with record_stream"), "with_record_stream")


def decide_fix_removes_drift(steps: Any, states: Any, key: Key, edge: str) -> Decision:
    """The fix arm `edge` removes the drift: offloading=True drifts, offloading=True + edge has every step within the
    floor and no state tensor beyond its floor."""
    fixed_name = variant_name(edge)
    drift = drifts(steps, states, key, OFF)
    fixed = _arm(steps, key, fixed_name)
    fixed_first = first_difference(_arm(states, key, fixed_name))
    clean = len(fixed) > 0 and bool(fixed.matches.all()) and fixed_first is None
    ev = {"arm": list(key), "edge": edge, "drift_without_edge": drift, "logit_drift_without_edge": logit_drift(steps, key, OFF),
          "end_state_drift_without_edge": state_drift(states, key, OFF), "fixed_max_abs_diff": fixed.max_abs_diff.tolist(),
          "fixed_noise_threshold": fixed.noise_threshold.tolist(), "fixed_first_differing_tensor": fixed_first}
    why = ("no drift without the edge: nothing to remove" if not drift else
           f"{key[0]} loop with {edge}: every step within the floor = {bool(fixed.matches.all())}, first differing tensor: {fixed_first}")
    return Decision(drift and clean, ev, why, deciding={"drift without the edge": drift,
                                                       f"max |logit diff| with {edge}": float(fixed.max_abs_diff.max()) if len(fixed) else None})


def report_keys(steps: Any, variant: str) -> list[Key]:
    """Every (report loop, model, dtype) where `variant` ran, in run order (the 64-layer layout's included)."""
    t = steps[(steps.loop == "report") & (steps.variant == variant)]
    return list(dict.fromkeys((r.loop, r.model, r.dtype) for r in t.itertuples()))


def fix_everywhere(steps: Any, states: Any, primary: Key, edge: str) -> Decision:
    """The primary arm's fix decision, also read on every other report-loop arm where the edge ran: it holds only
    where each of them that drifts without the edge (logits) is clean with it."""
    first = decide_fix_removes_drift(steps, states, primary, edge)
    per = {}
    for key in report_keys(steps, variant_name(edge)):
        if key != primary and logit_drift(steps, key, OFF):
            per["/".join(key[1:])] = clean(steps, states, key, variant_name(edge))
    first.evidence["other_report_arms_fixed"] = per
    left = sorted(k for k, ok in per.items() if not ok)
    if left:
        first.why += f"; still drifting with {edge} on {left}"
    return Decision(first.holds and not left, first.evidence, first.why, first.deciding, first.source, first.skipped)


def race_counts(timing: Any, resolution_ms: float = RESOLUTION_MS) -> Any:
    """Per arm: prefetch copies, those that started before their producing copy ended (same / earlier forward),
    the largest lead, blocks overwritten under a pending read, and wrap prefetches enqueued while the default stream was busy."""
    import pandas as pd

    rows = []
    for (loop, model, dtype, variant), t in timing.groupby(["loop", "model", "dtype", "variant"], sort=False):
        early = t[pd.to_numeric(t.lead_ms) > resolution_ms]  # no producer (None/NaN): not early
        rows.append({"loop": loop, "model": model, "dtype": dtype, "variant": variant, "prefetches": int(len(t)),
                     "started_before_producer_done": int(len(early)),
                     "same_forward": int((~early.cross_forward).sum()), "earlier_forward": int(early.cross_forward.sum()),
                     "max_lead_ms": float(t.lead_ms.max()) if t.lead_ms.notna().any() else None,
                     "overwrote_pending_read": int(t.overwrote_pending_read.sum()),
                     "default_busy_at_enqueue": int(t.default_busy_at_enqueue.sum())})
    return pd.DataFrame(rows, columns=COUNT_COLUMNS)


def decide_race_observed(counts: Any) -> Decision:
    """`offload.race_observed_on_device`: without a fix edge some prefetch started before its producing copy ended
    (device timestamps), and with the 5.20.0 edge none did (else the timing itself is not trustworthy)."""
    return _fixed_counts(counts, "started_before_producer_done", "5.20.0 edge",
                         "started before their producing copy ended", ("prefetches started before their copy ended",
                                                                       "same, with the 5.20.0 edge"),
                         "with_5_20_0_edge", resolution_ms=RESOLUTION_MS)


def narrow_models(edges: Any) -> list[str]:
    """Models on whose CPU record the narrow fix arms are narrow: the offload event closes only the host-buffer hazard
    and record_stream only the reuse one (on a model with two offloaded layers the event orders the reuse too)."""
    if edges is None:
        return []
    out = []
    for model, rows in edges.groupby("model", sort=False):
        by = {r.edge: r for r in rows.itertuples()}
        event, reuse = by.get("offload event"), by.get("record_stream")
        if event is not None and reuse is not None and event.closes_host_buffer and not event.closes_reuse \
                and reuse.closes_reuse and not reuse.closes_host_buffer:
            out.append(model)
    return out


def narrow_key(primary: Key, edges: Any) -> Key:
    """The report's loop and dtype on the first model whose fix arms are narrow (the primary model if none is)."""
    narrow = narrow_models(edges)
    return (primary[0], primary[1] if primary[1] in narrow or not narrow else narrow[0], primary[2])


def explanations(steps: Any, states: Any, counts: Any, model: str, dtype: str) -> list[dict[str, Any]]:
    """Each explanation's prediction on `model`/`dtype`, what the run showed, and whether it matched."""
    cpu, rep = ("cpu", model, dtype), ("report", model, dtype)
    first = first_difference(_arm(states, cpu, OFF))
    prefill_bitwise = bool(_arm(steps, cpu, OFF).sort_values("step").bitwise_equal.iloc[0]) if len(_arm(steps, cpu, OFF)) else None
    attention_first = first is not None and first["kind"] == ATTENTION_KV
    event_fixes = {k: clean(steps, states, k, variant_name("offload event")) for k in (cpu, rep)}
    reuse_fixes = {k: clean(steps, states, k, variant_name("record_stream")) for k in (cpu, rep)}
    same, over = (int(_arm(counts, cpu, OFF)[c].sum()) for c in ("same_forward", "overwrote_pending_read"))
    earlier = int(_arm(counts, rep, OFF).earlier_forward.sum())  # an arm that did not run counts 0
    rows = [
        ("(a) host-buffer race within a forward (wrap)",
         "cpu loop: first offloaded layer differs at the prefill snapshot while prefill logits are bitwise equal; "
         "same-forward prefetches start before their copy ends; the offload-event arm is clean",
         {"first": first, "prefill_logits_bitwise": prefill_bitwise, "same_forward_early": same,
          "offload_event_clean": event_fixes[cpu]},
         attention_first and first["call"] == "prefill" and prefill_bitwise is True and same > 0 and event_fixes[cpu]),
        ("(b) host-buffer race across forwards (the report's loop)",
         "report loop: decode-1 prefetches of the prefill's buffers start before their copies end; the offload-event arm is clean",
         {"earlier_forward_early": earlier, "offload_event_clean": event_fixes[rep]},
         earlier > 0 and event_fixes[rep] and drifts(steps, states, rep, OFF)),
        ("(c) reuse of a released prefetched block",
         "cpu loop: clean prefill snapshot, first offloaded layer differs at decode 1; a prefetch overwrites a block under a "
         "pending read; the record_stream arm is clean and the offload-event arm is not",
         {"first": first, "overwrote_pending_read": over, "record_stream_clean": reuse_fixes[cpu],
          "offload_event_clean": event_fixes[cpu]},
         attention_first and first["call"] == "decode 1" and over > 0 and reuse_fixes[cpu] and not event_fixes[cpu]),
        ("(d) the report's hypothesis: linear-attention state does not round-trip",
         "the first differing tensor is a linear-attention conv/recurrent state",
         {"first": first}, first is not None and first["kind"] != ATTENTION_KV),
    ]
    return [{"explanation": e, "predicts": p, "observed": o, "matched": bool(m)} for e, p, o, m in rows]
