"""A hybrid's cache rolled back (notebook 10 answers it): its SOURCE and Ask writer, for the report only."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines, claim_of, first_change, joined, num

SOURCE = Source("rollback", "Rolling a hybrid's cache back and continuing it (transformers `#49036`, PR `#45513`, 5.25.0's "
                "linear-attention cache rewrite)",
                {}, "the threads' checkpoints and code (their text could not be read from this machine, so every claim is the "
                "kit's own, kind beyond; the tiny random-weight hybrid stands in), the 64-layer 48/16 layout and the "
                "quantized cache.",
                "examples/repro/hybrid_rollback_rebuild.py",
                "expected vs got next logits after crop(-k) against a cache that never saw the k tokens, and a hand-rebuilt "
                "hybrid's length and re-fed tokens",
                "Hybrid rollback",
                "the threads' statements (text not readable here)")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """A hybrid rolled back or rebuilt by hand: the stale recurrent state and the reported length per release; the
    recording mode that restored and the kit's rebuild as the measured repairs."""
    stale, length, restored, kit = {}, {}, {}, {}
    for rel, claims in by_release.items():
        rec = claim_of(claims, "rollback.hybrid_recorded_crop_keeps_recurrent_state")
        d = rec.get("deciding") or {}
        if rec.get("verdict") == "holds":
            stale[rel] = f"leaves the recurrent state (off {num(d.get('stale_recurrent_diff'))}) and is silently wrong"
        elif d.get("restored_modes"):
            mode = {"record_keep": "recurrent_states_to_keep=k", "record": "recording"}.get(d["restored_modes"][0],
                                                                                            d["restored_modes"][0])
            stale[rel] = f"rolls back with `{mode}`"
            restored[rel] = mode
        hand, mine = claim_of(claims, "rollback.hand_rebuild_keeps_length"), claim_of(claims, "rollback.kit_rebuild_keeps_length")
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
