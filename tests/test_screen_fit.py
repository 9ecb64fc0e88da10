"""The first screen's budgets: each source has its own allowance (a new source rewords no other) and the screen's
budget is the head plus one allowance per declared source; a long line says less (whole clauses dropped), never cuts a value; no ellipsis inside a value of
SUMMARY.md; a bug fixed on the newest release reads "fixed on X", decided from the recorded claims per release."""
from __future__ import annotations

import json
import re
from pathlib import Path

from test_first_screen import block, fake_run, matrix, screen

from helpers import findings
from helpers.pipeline.report import first_screen, summary, verdict_line
from helpers.pipeline.report.fit import clauses, drop_asides, fit, fit_clauses
from helpers.pipeline.report.paste import code_refs

# Values measured in a real run that an earlier screen cut mid-value (issue 48).
LINEAR_REASON = ("over 4 forward calls: linear_attention layers [0, 1, 2, 4, 5, 6] had 0 offload / 0 prefetch calls; "
                 "attention layers [3, 7] had 8 / 8")
LONG_ADDED = "self.prefetch_stream.wait_stream(torch.cuda.default_stream(key_states.device))"


def _edit(folder: Path, nb: str, cid: str, **fields) -> None:
    path = folder / "results" / f"{nb}.json"
    data = json.loads(path.read_text())
    for c in data["claims"]:
        if c["id"] == cid:
            c.update(fields)
    path.write_text(json.dumps(data))


def _screen_blocks(text: str) -> list[list[str]]:
    names = [code_refs(first_screen.screen_name(s)) for s in findings.sources().values()]
    return [block(text, name) for name in names if f"**{name}**" in text.splitlines()]


# --------------------------------------------------------------------------- fitting by saying less

def test_clauses_split_only_outside_code_spans_parentheses_and_brackets():
    text = "a (b; c) `d; e` [f; g]; h. I (j. k)"
    assert [c for _, c in clauses(text, ("; ", ". "))] == ["a (b; c) `d; e` [f; g]", "h", "I (j. k)"]
    assert drop_asides("x `f(a)` (aside (nested)) y [1, 0] (z)") == "x `f(a)` y [1, 0]"


def test_fit_keeps_whole_variants_and_drops_what_does_not_fit():
    parts = [["a long first clause", "first"], ["0.000123 in `f(x)`"], ["third"]]
    assert fit(parts, 100) == "a long first clause; 0.000123 in `f(x)`; third"
    assert fit(parts, 30) == "a long first clause; third", "a value that does not fit is left out, not cut"
    assert fit(parts, 6) == "first", "the first part always says something, its shortest variant"
    # the Ask keeps leading clauses only: nothing after a dropped clause reads as its continuation
    assert fit_clauses("one; a clause too long to fit here; two", 12) == "one"


# --------------------------------------------------------------------------- allowances and room

def test_each_source_fits_its_allowance_and_the_screen_has_room_for_more(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    text = screen(tmp_path)
    blocks = _screen_blocks(text)
    assert len(blocks) >= 4
    for name, verdict, ask in blocks:
        assert len(name) <= first_screen.NAME_CHARS + 4, name
        said = len(verdict) - len("- Verdict: .") + len(ask) - len("- Ask: .")
        assert said <= first_screen.SOURCE_CHARS, (name, said)
    repros = next(line for line in text.splitlines() if line.startswith("**Repros**"))
    names = [f", {n}" for n in re.findall(r"`[^`]+\.py`", repros)]
    head = len(text) - sum(len("\n".join(b)) + 2 for b in blocks) - sum(map(len, names))  # neither blocks nor repros
    assert len(names) == len(blocks) and head <= first_screen.HEAD_CHARS - 150, head  # room for a warning line
    assert all(len(first_screen.screen_name(s)) <= first_screen.NAME_CHARS for s in findings.sources().values())
    assert all(len(f", `{Path(s.repro).name}`") <= first_screen.REPRO_CHARS for s in findings.sources().values())
    # every declared source shown at its allowance's full length still fits: the budget grows with SOURCES
    worst = first_screen.HEAD_CHARS + len(findings.sources()) * (first_screen.BLOCK_CHARS + first_screen.REPRO_CHARS)
    assert first_screen.screen_chars() == worst and len(text) <= worst


def test_a_source_with_long_values_on_each_release_stays_in_its_allowance_and_leaves_the_others_as_they_were(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    before = {b[0]: b for b in _screen_blocks(screen(tmp_path))}
    newest = tmp_path / "matrix" / "5.25.0"
    for folder, n in ((tmp_path, 3), (newest, 5)):  # the releases differ: the symptom says both, at length
        _edit(folder, "10_rollback_hybrid", "rollback.hybrid_recorded_crop_keeps_recurrent_state",
              deciding={"stale_recurrent_diff": 0.000123456 * n})
        _edit(folder, "10_rollback_hybrid", "rollback.hand_rebuild_keeps_length", verdict="fails",
              deciding={"lengths": {"hand-written (layer methods)": n}, "original_length": 23})
    after = {b[0]: b for b in _screen_blocks(screen(tmp_path))}
    name, verdict, ask = after["**Hybrid rollback**"]
    assert len(verdict) + len(ask) - len("- Verdict: .- Ask: .") <= first_screen.SOURCE_CHARS
    assert "…" not in verdict + ask
    assert {k: v for k, v in after.items() if k != name} == {k: v for k, v in before.items() if k != name}


# --------------------------------------------------------------------------- no value cut

def _values_cut(text: str) -> list[str]:
    """Ellipses inside a value: in a code span, or beside a digit or a bracket; a quoted source passage may end in
    ' …"' (its opening words), nothing else may."""
    spans = [s for s in re.findall(r"`[^`\n]*`", text) if "…" in s or "[...]" in s]
    loose = [m.group(0) for m in re.finditer(r".{0,30}(…|\[\.\.\.\])(?!\")", re.sub(r"`[^`\n]*`", "``", text))]
    return spans + loose


def test_summary_md_has_no_ellipsis_inside_a_value(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    for folder in (tmp_path, tmp_path / "matrix" / "5.25.0"):  # the two values an earlier screen cut
        _edit(folder, "05_hybrid_offloading_drift", "offload.linear_layers_never_moved", reason=LINEAR_REASON)
    (tmp_path / "bisect").mkdir()
    diff = f"--- a\n+++ b\n     if self.offloading:\n+        {LONG_ADDED}\n"
    (tmp_path / "bisect" / "05-offload.prefetch_reads_unordered_copy.json").write_text(json.dumps(
        {"status": "complete", "changes": [{"last_same": "5.19.0", "first_different": "5.20.0",
                                            "source_diff": {"Cache.update": {"status": "changed", "diff": diff}}}]}))
    text = summary.build_summary(tmp_path)
    assert _values_cut(text) == [], _values_cut(text)
    assert "had 0 offload / 0 prefetch calls" in text and "default_stream(k…" not in text
    assert _values_cut('a "quoted passage …" and `x` 0.5') == []
    assert _values_cut("had 0 offload / 0 …") and _values_cut("`default_stream(k…`"), "the test sees a cut value"


# --------------------------------------------------------------------------- fixed on the newest release

def _offload(verdicts: dict[str, str]) -> list[tuple[str, dict]]:
    return [("05_x", {"id": cid, "kind": "beyond", "verdict": v, "reason": "r"}) for cid, v in verdicts.items()]


def test_fixed_on_a_release_where_every_check_describing_the_bug_fails_and_only_there():
    pinned = _offload({"a": "holds", "b": "holds", "c": "fails"})
    fixed = {"5.17.0": pinned, "5.25.0": _offload({"a": "fails", "b": "fails", "c": "holds"})}
    assert verdict_line.fixed_on(fixed) == {"5.25.0": 2}, "c failed on the pinned release: it describes no bug"
    line = verdict_line.count_line(fixed)
    assert "the kit's own checks hold 2 of 3 (not: `c`) on 5.17.0" in line and "fixed on 5.25.0 (all 2 fail there)" in line
    assert "on 5.25.0" not in line.replace("fixed on 5.25.0", ""), "no count of the fixed release as not holding"
    one_holds = {"5.17.0": pinned, "5.25.0": _offload({"a": "fails", "b": "holds", "c": "fails"})}
    assert verdict_line.fixed_on(one_holds) == {}, "one check describing the bug still holds: not fixed"
    assert "1 of 3 (not: `a`, `c`) on 5.25.0" in verdict_line.count_line(one_holds)
    undecided = {"5.17.0": pinned, "5.25.0": _offload({"a": "skipped", "b": "error", "c": "fails"})}
    assert verdict_line.fixed_on(undecided) == {}, "nothing decided there: not fixed"
    assert verdict_line.fixed_on({"5.17.0": pinned}) == {}, "one release: nothing to compare"


def test_the_screen_says_fixed_on_the_newest_release_where_the_ordering_is_fixed(tmp_path):
    fake_run(tmp_path)
    matrix(tmp_path)
    newest = tmp_path / "matrix" / "5.25.0"
    data = json.loads((newest / "results" / "05_hybrid_offloading_drift.json").read_text())
    for c in data["claims"]:
        if c["kind"] == "beyond" and c["verdict"] == "holds":
            c["verdict"] = "fails"
    (newest / "results" / "05_hybrid_offloading_drift.json").write_text(json.dumps(data))
    verdict = block(screen(tmp_path), "`#48947`")[1]
    assert "the kit's own checks hold 5 of 5 on 5.17.0; fixed on 5.25.0" in verdict, verdict
    assert "0 of 5" not in verdict
