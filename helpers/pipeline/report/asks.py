"""Per source, in a maintainer's words: the symptom and where it shows (per release), and the Ask (what to change
upstream or what the reporter should do) with its evidence: the first release where the behaviour changed (a bisect
record of this kit, else the `make bisect` command that finds it) and the repair the kit applied and its number.
Every phrase is read from the claims' recorded values. Each finding names its source's writer (helpers.findings)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...findings import writer
from .paste import fmt_scalar
from .records import load_json

Claims = list[tuple[str, dict[str, Any]]]  # (notebook, claim) of one source on one release


@dataclass(frozen=True)
class Lines:
    """A source's symptom (per release, joined) and its ask; '' where its claims say nothing."""

    symptom: str
    ask: str


def _claim(claims: Claims, cid: str) -> dict[str, Any]:
    return next((c for _, c in claims if c.get("id") == cid), {})


def _num(value: Any) -> str:
    return fmt_scalar(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def joined(values: dict[str, str]) -> str:
    """'X on 5.17.0 and 5.25.0' when every release says the same, else 'X on 5.17.0; Y on 5.25.0'."""
    groups: dict[str, list[str]] = {}
    for rel, text in values.items():
        if text:
            groups.setdefault(text, []).append(rel)
    return "; ".join(f"{text} on {' and '.join(rels)}" for text, rels in groups.items())


def bisect_record(out: Path, notebook: str, claim: str) -> dict[str, Any]:
    """The bisect this kit ran for the claim (outputs/bisect/<nb>-<claim>.json), {} where none ran."""
    found = (load_json(path) for path in sorted((out / "bisect").glob(f"{notebook}*-{claim}.json")))
    return next((data for data in found if data.get("status") == "complete" and data.get("changes")), {})


def first_change(out: Path, notebook: str, claim: str, releases: list[str], differs: bool, prefer: str = "") -> str:
    """'first changed in 5.20.0 (after 5.19.0): `+ line`' from a bisect record; else the command that finds it
    where the claim differs between the releases measured; '' where it does not."""
    if data := bisect_record(out, notebook, claim):
        change = data["changes"][0]
        line = ""
        diffs = sorted((change.get("source_diff") or {}).items(), key=lambda kv: prefer not in kv[0] if prefer else 0)
        for name, diff in diffs:
            added = [ln[1:].strip() for ln in str(diff.get("diff") or "").splitlines()
                     if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()
                     and not ln[1:].strip().startswith("#")]
            added = [ln for ln in added if not ln.endswith(":")] or added  # a statement over its bare `if ...:`
            added = [ln for ln in added if len(ln) <= 60]  # a line is quoted whole or not at all, never cut
            if added:
                line = f"; `{'.'.join(name.split('.')[-2:])}`: `+ {added[0]}`"
                break
        return f"first changed in {change['first_different']} (`make bisect`: same through {change['last_same']}{line})"
    if differs and len(releases) > 1:
        return (f"first release that changed: `make bisect NB={notebook} CLAIM={claim} GOOD={releases[0]} "
                f"BAD={releases[-1]}`")
    return ""


def _error(text: str) -> str:
    """'RuntimeError: cannot reshape tensor of 0 elements' (the message up to its first shape or clause)."""
    head = re.split(r" into | because |\(inside", str(text))[0].strip()
    where = re.search(r"raised in ([\w.]+)", str(text))
    return f"`{head}`" + (f" in `{where.group(1)}`" if where else "")


def control(by_release: dict[str, Claims], out: Path) -> Lines:
    """The mask contract: what the no-mask resume does per release; the full mask as the measured repair."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        neither, mask = _claim(claims, "matrix.neither_fails"), _claim(claims, "matrix.mask_only_works")
        ev = neither.get("evidence") or {}
        if neither.get("verdict") == "reproduced":
            err = next(iter((ev.get("errors") or {}).values()), "")
            shape = (ev.get("first_call_input_ids") or [None])[0]
            symptom[rel] = (f"its first model call gets `input_ids` {shape} and raises {_error(err)}" if shape and err
                            else f"fails ({str(neither.get('reason', ''))[:110]})")
        elif neither:
            symptom[rel] = f"not as the source says: {neither.get('reason', '')[:110]}"
        diff = (mask.get("evidence") or {}).get("max_abs_diff_vs_full_forward") or {}
        if mask.get("verdict") == "reproduced" and diff:
            thr = (mask.get("evidence") or {}).get("noise_threshold")
            repair[rel] = f"{_num(max(diff.values()))} (noise threshold {_num(thr)})"
    text = ("`generate()` resumed from a cached prefix with a one-token suffix and no full-length mask: "
            + joined(symptom)) if symptom else ""
    ask = ("pass the full attention mask (cached + new tokens); the kit applied it: the first call gets "
           f"`input_ids` [1, 1] and matches one forward within {joined(repair)}. Upstream: raise on a non-empty "
           "cache with a suffix-only mask instead of slicing the input to [1, 0]") if repair else ""
    bisect = first_change(out, "02", "matrix.neither_fails", list(by_release), len(set(symptom.values())) > 1)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))


def offload(by_release: dict[str, Claims], out: Path) -> Lines:
    """#48947: the drift needs CUDA; the CPU record's unordered prefetch reads per release decide the ordering edge."""
    reads, drift, waits = {}, {}, {}
    for rel, claims in by_release.items():
        c = _claim(claims, "offload.prefetch_reads_unordered_copy")
        d = c.get("deciding") or {}
        if "unordered prefetch reads" in d:
            reads[rel] = f"{d['unordered prefetch reads']} of {d.get('prefetch reads', '?')}"
        waits[rel] = ((c.get("evidence") or {}).get("wait_stream_calls") or {}).get("waits for default", 0)
        dec = _claim(claims, "offload.decode_drifts")
        drift[rel] = {"reproduced": "drifts from the first decode step", "not_reproduced": "does not drift"}.get(
            dec.get("verdict"), "drift not measured (needs CUDA)")
    releases = list(by_release)
    ordered = [r for r, v in reads.items() if v.startswith("0 of")]
    text = f"`DynamicCache(offloading=True)`: {joined(drift)}"
    if reads:
        text += "; prefetch reads unordered after their offload copy (CPU record): " + joined(reads)
    bisect = first_change(out, "05", "offload.prefetch_reads_unordered_copy", releases, len(set(reads.values())) > 1)
    ask = ""
    if ordered and len(ordered) < len(reads):
        edge = [r for r in ordered if waits.get(r)]
        how = (f"the prefetch stream waits for the compute stream "
               f"({waits[edge[-1]]} `wait_stream` calls on {edge[-1]}, none on "
               f"{', '.join(r for r in reads if r not in ordered)})" if edge else "an ordering edge")
        ask = (f"reporter: rerun on {ordered[-1]}: there {how}, which orders every prefetch read; "
               f"`make gpu-check RELEASES_GPU=\"{' '.join(releases)}\"` decides whether it removes the drift")
    elif reads:
        ask = ("order each prefetch read after the copy that fills its host buffer (the CPU record names the reads); "
               "`make gpu-check` decides whether that removes the drift")
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))


def new_image(by_release: dict[str, Claims], out: Path) -> Lines:
    """A new image after a cached turn: the natural call's error per release; the positions repair's number."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        nat, pos = _claim(claims, "newimage.natural_call_silently_wrong"), _claim(claims, "newimage.positions_explain_it")
        d = nat.get("deciding") or {}
        if nat.get("verdict") == "holds":
            rows = " on one text position row" if (pos.get("verdict") == "holds") else ""
            symptom[rel] = f"runs and is silently wrong (max |logit diff| {_num(d.get('max_abs_diff'))}, image B{rows})"
        elif nat:
            symptom[rel] = f"{nat.get('verdict')}: {str(nat.get('reason', ''))[:100]}"
        fix, carry = _claim(claims, "newimage.repair_generate_restores"), _claim(claims, "newimage.rope_deltas_carried_forward")
        if fix.get("verdict") == "holds":
            repair[rel] = _num((fix.get("deciding") or {}).get("max_abs_diff")) + (
                f", stale `rope_deltas` {_num((carry.get('deciding') or {}).get('max_abs_diff_stale'))}"
                if carry.get("verdict") == "holds" else "")
    text = ("the natural turn-2 `generate()` (new image, turn 1's cache, full mask) " + joined(symptom)) if symptom else ""
    ask = ("compute turn 2's positions with `get_rope_index` over the full ids and both grids and carry `rope_deltas` "
           f"forward: the kit's repair restores the one-forward logits to {joined(repair)}; upstream: derive them so in "
           "`generate()`, or raise") if repair else ""
    bisect = first_change(out, "09", "newimage.natural_call_silently_wrong", list(by_release), len(set(symptom.values())) > 1)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))


def triage(by_release: dict[str, Claims], out: Path) -> Lines:
    """A user's rebuild: what to run on it (the kit's tree names a leaf only where its repair restored the result)."""
    return Lines("", "run your rebuild through the tree: `make run NB=06 ARGS=\"-p rebuild file.py:function\"`; "
                 "it names a leaf only where its repair restored the result, with the number")


def rollback(by_release: dict[str, Claims], out: Path) -> Lines:
    """A hybrid rolled back or rebuilt by hand: the stale recurrent state and the reported length per release; the
    recording mode that restored and the kit's rebuild as the measured repairs."""
    stale, length, restored, kit = {}, {}, {}, {}
    for rel, claims in by_release.items():
        rec = _claim(claims, "rollback.hybrid_recorded_crop_keeps_recurrent_state")
        d = rec.get("deciding") or {}
        if rec.get("verdict") == "holds":
            stale[rel] = f"leaves the recurrent state (off {_num(d.get('stale_recurrent_diff'))}) and is silently wrong"
        elif d.get("restored_modes"):
            mode = {"record_keep": "recurrent_states_to_keep=k", "record": "recording"}.get(d["restored_modes"][0],
                                                                                            d["restored_modes"][0])
            stale[rel] = f"rolls back with `{mode}`"
            restored[rel] = mode
        hand, mine = _claim(claims, "rollback.hand_rebuild_keeps_length"), _claim(claims, "rollback.kit_rebuild_keeps_length")
        hd = hand.get("deciding") or {}
        if hand.get("verdict") == "fails":
            got = next(iter((hd.get("lengths") or {}).values()), "?")
            length[rel] = f"a hand rebuild reports length {got} of {hd.get('original_length')}"
        if mine.get("verdict") == "holds":
            kit[rel] = "holds"
    text = ("a hybrid's `crop(-k)` after `activate_past_recording()` " + joined(stale)) if stale else ""
    if length:
        text += "; " + joined(length) + " and `generate()` re-feeds cached tokens"
    parts = []
    silent = [rel for rel, text in stale.items() if "silently wrong" in text]
    if restored:
        parts.append("roll hybrids back with `activate_past_recording(recurrent_states_to_keep=N)` where offered, "
                     "else re-prefill")
    elif silent:
        parts.append(f"re-prefill instead of `crop` on a hybrid (no way to roll its recurrent state back on "
                     f"{' and '.join(silent)}); upstream (`#49036`): make `crop` raise on linear layers it cannot roll back")
    if length:
        parts.append("a rebuild must carry `cumulative_length_linear` (the kit's factory does: "
                     f"{'length kept on ' + ' and '.join(kit) if kit else 'not measured'}); upstream: a cache factory")
    bisect = first_change(out, "10", "rollback.hand_rebuild_keeps_length", list(by_release),
                          0 < len(length) < len(by_release), prefer="update_conv_state")
    return Lines(text, "; ".join(p for p in (*parts, bisect) if p))


def serve(by_release: dict[str, Claims], out: Path) -> Lines:
    """`transformers serve` re-prefilling each turn per release; `kvresume serve`'s measured reuse as the repair."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        plain, sooner = _claim(claims, "serve.plain_recomputes_every_turn"), _claim(claims, "serve.first_token_sooner")
        last = (plain.get("evidence") or {}).get("last") or {}
        if plain.get("verdict") == "holds" and last:
            symptom[rel] = f"turn {last.get('turn')} prefills all {last.get('prompt')} prompt tokens again"
        speed = (sooner.get("deciding") or {}).get("speedup")
        same = _claim(claims, "serve.replies_equal").get("verdict") == "holds"
        if sooner.get("verdict") == "holds" and same and last:
            repair[rel] = (f"reused {last.get('reused')} of {last.get('prompt')}, first token {_num(speed)}x sooner, "
                           "every reply equal")
    text = ("plain `transformers serve` on a multi-turn chat: " + joined(symptom)) if symptom else ""
    ask = ("serve through `kvresume serve` (the kit ran it: " + joined(repair) + "); upstream: the TODO's prefix "
           "cache for the non-CB path, keyed by token ids, images and weights") if repair else ""
    bisect = first_change(out, "11", "serve.pool_reuses_earlier_turns", list(by_release), False)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))


def lines_for(key: str, by_release: dict[str, Claims], out: Path) -> Lines:
    """The source's symptom and Ask from the writer its findings name (KeyError for a source none declares)."""
    return writer(key)(by_release, out)
