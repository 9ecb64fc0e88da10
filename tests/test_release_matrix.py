"""The release matrix: matrix.md from synthetic per-release results, and end to end on one
non-pinned release (notebook 01 only; .venv-tf/<release> is built once and then reused)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.pipeline.releases import envs
from helpers.pipeline.releases import facts as matrix_facts
from helpers.pipeline.releases import report as matrix_report
from helpers.pipeline.releases import run as matrix_run
from helpers.pipeline import paths

OTHER_RELEASE = "5.24.0"


def _release(base: Path, release: str, ok: bool = True, reason: str = "", claims=None, measurements=None) -> None:
    dest = base / "matrix" / release
    dest.mkdir(parents=True)
    (dest / "release.json").write_text(json.dumps({"release": release, "ok": ok, "reason": reason, "rc": 0 if ok else None,
                                                   "versions": {"transformers": release} if ok else {}}))
    if ok:
        (dest / "results").mkdir()
        (dest / "results" / "02_nb.json").write_text(json.dumps({
            "notebook": "02_nb", "environment": {"transformers": release, "torch": "2.13"},
            "claims": [{"id": cid, "verdict": v, "evidence": {}} for cid, v in claims.items()],
            "measurements": measurements or {}}))


def test_matrix_marks_changes_lists_differences_and_explains_missing_releases(tmp_path):
    _release(tmp_path, "1.0", claims={"c.same": "reproduced", "c.flip": "reproduced"},
             measurements={"rows": [{"mask": [1, 83]}, {"mask": [1, 83]}], "same": 1})
    _release(tmp_path, "2.0", claims={"c.same": "reproduced", "c.flip": "not_reproduced"},
             measurements={"rows": [{"mask": None}, {"mask": None}], "same": 1})
    _release(tmp_path, "3.0", ok=False, reason="pip could not install transformers==3.0")
    text = matrix_report.build_matrix(tmp_path, ["1.0", "2.0", "3.0"])
    assert "pip could not install transformers==3.0" in text
    flip = next(line for line in text.splitlines() if "`c.flip`" in line and line.startswith("|"))
    same = next(line for line in text.splitlines() if "`c.same`" in line and line.startswith("|"))
    assert "**Δ**" in flip and "not installed" in flip and "**Δ**" not in same
    assert "`measurements.rows[0,1].mask`" in text and "`null`" in text
    assert "measurements.same" not in text and "environment.transformers" not in text


def _results(base: Path, release: str, notebook: str, claims: dict, measurements: dict) -> None:
    dest = base / "matrix" / release
    (dest / "results").mkdir(parents=True, exist_ok=True)
    (dest / "release.json").write_text(json.dumps({"release": release, "ok": True, "rc": 0,
                                                   "versions": {"transformers": release}}))
    (dest / "results" / f"{notebook}.json").write_text(json.dumps({
        "notebook": notebook, "environment": {"transformers": release, "torch": "2.13"},
        "claims": [{"id": cid, "verdict": v, "evidence": ev} for cid, (v, ev) in claims.items()],
        "measurements": measurements}))


def _two_releases(base: Path) -> None:
    """5.17.0 and 5.24.0 as the kit saw them: ~130 float-noise values around the behaviour changes."""
    for release, new in (("5.17.0", False), ("5.24.0", True)):
        noise = 1 + (1e-7 if new else 0)
        _results(base, release, "02_mask", {
            "matrix.first_call_drops_suffix": ("reproduced", {"first_call_attention_mask_shapes": ["None" if new else "[1, 1]"]}),
            "matrix.mask_only_works": ("not_reproduced" if new else "reproduced", {"max_abs_diff": 0.25 * noise})},
            {"matrix": [{"variant": f"v{i}", "attention_mask_shape": None if new else [1, 1 if i < 8 else 83],
                         "max_abs_diff": 0.125 * i * noise, "cosine": 1 - 1e-3 * i * noise} for i in range(16)],
             "logits": [0.5 * i * noise for i in range(1, 60)],
             "per_token": {f"t{i}": 0.25 * i * noise for i in range(1, 100)},
             "error": "ValueError: bad mask" if new else "IndexError: out of range"})
        _results(base, "5.17.0" if not new else "5.24.0", "05_offload", {
            "offload.linear_layers_never_moved": ("reproduced", {"source_facts": {
                "prefetch stream waits for the default stream before prefetching": new}})},
            {"per_step_drift": [0.0, 2.12 * noise, 7.63 * noise, 17.44 * noise],
             "drift_total": 27.19 * noise, "stream_calls": {"default_stream": 16 if new else 8},
             "frame": f"transformers/cache_utils.py:{1614 if new else 1394} in update",
             "model_layout": {"release": {"transformers": release}}, "released_value": 3.0 * noise + (0.5 if new else 0)})


def test_change_section_names_verdicts_and_behaviour_values_and_leaves_floats_to_differences(tmp_path):
    _two_releases(tmp_path)
    text = matrix_report.build_matrix(tmp_path, ["5.17.0", "5.24.0"])
    section = text[text.index("## What changed between releases"): text.index("## Releases")]
    assert text.index("## What changed between releases") < text.index("## Releases") < text.index("## Differences")
    verdicts = text[text.index("## Verdicts"): text.index("## Differences")]
    assert "| **Δ** | 02_mask | `matrix.mask_only_works` | ✅ reproduced | ❌ not_reproduced |" in verdicts
    assert "|  | 02_mask | `matrix.first_call_drops_suffix` |" in verdicts and "### Verdicts\n" not in section
    lines = [ln for ln in section.splitlines() if ln.startswith("- ")]
    mask = next(ln for ln in lines if "02_mask" in ln)
    assert "`matrix.mask_only_works` ✅ reproduced → ❌ not_reproduced" in mask
    assert "`attention_mask_shape` `[1,1]`, `[1,83]` → `null` (×16)" in mask and "IndexError" in mask
    offload = next(ln for ln in lines if "05_offload" in ln)
    assert "prefetch stream waits" in offload and "`false` → `true`" in offload and "`default_stream` `8` → `16`" in offload
    assert not any(w in section for w in ("max_abs_diff", "logits", "cosine", "released_value", "frame", "`transformers`"))
    assert "`verdict`" not in section
    assert len(section.splitlines()) < 12  # the ~130 float values no longer bury the behaviour changes
    assert "`measurements.released_value`" in text[text.index("## Differences"):]  # every value is still listed


def test_classify_and_relative_size():
    A = matrix_facts._ABSENT
    assert matrix_facts.classify("m.attention_mask_shape", {"a": [1, 1], "b": None}) == "shape"
    assert matrix_facts.classify("m.value", {"a": 1.5, "b": None}) == "None vs a value"
    assert matrix_facts.classify("m.value", {"a": 1.5, "b": A}) == "None vs a value"
    assert matrix_facts.classify("m.ok", {"a": True, "b": False}) == "boolean"
    assert matrix_facts.classify("m.stage", {"a": "prefill", "b": "decode"}) == "error type"
    assert matrix_facts.classify("m.exc", {"a": "TypeError: x", "b": "ValueError: y"}) == "error type"
    assert matrix_facts.classify("m.source_facts.x", {"a": True, "b": False}) == "source fact"
    assert matrix_facts.classify("m.where[0].line", {"a": 10, "b": 12}) == "source location"
    assert matrix_facts.classify("m.n", {"a": 8, "b": 16}) == "count"
    assert matrix_facts.classify("m.d", {"a": 0.5, "b": 0.50001}) == "float"
    assert matrix_facts.classify("m.d", {"a": [0.5, 1.0], "b": [0.5, 1.5]}) == "float"
    assert matrix_facts.classify("m.d", {"a": [0.5], "b": [0.5, 1.5]}) == "shape"
    assert matrix_facts.classify("m.names", {"a": "DynamicCache", "b": "StaticCache"}) == "text"
    assert matrix_facts.classify("environment.processor", {"a": "x", "b": "y"}) == "environment"
    assert matrix_facts.relative_size([1.0, 1.5]) == pytest.approx(1 / 3)
    assert matrix_facts.relative_size([[0.0, 2.0], [0.0, 1.0]]) == pytest.approx(0.5)
    assert matrix_facts.relative_size([0.0, 0.0]) == 0.0 and matrix_facts.relative_size(["a", 1.0]) is None


def test_flatten_and_distinct_texts():
    assert matrix_facts.flatten({"a": {"b": 1}, "l": [{"x": 2}], "v": [1, 2]}) == {"a.b": 1, "l[0].x": 2, "v": [1, 2]}
    assert matrix_facts.distinct_texts([1.0, 0.99999994]) != ["1", "1"]


def test_default_releases_end_at_the_newest_and_are_the_makefiles():
    assert matrix_report.DEFAULT_RELEASES == ("5.14.1", "5.17.0", "5.19.0", "5.20.0", "5.24.0", "5.25.0")
    line = next(ln for ln in (paths.repo_root() / "Makefile").read_text().splitlines() if ln.startswith("RELEASES ?="))
    assert tuple(line.split("?=", 1)[1].split()) == matrix_report.DEFAULT_RELEASES


def test_unusable_release_gets_a_reason_without_touching_pip():
    env = envs.ensure_env("not-a-release")
    assert not env.ok and "not a version" in env.reason


@pytest.mark.e2e
def test_matrix_end_to_end_on_a_non_pinned_release(tmp_path):
    assert OTHER_RELEASE != envs.pinned_release()
    infos = [matrix_run.run_release(r, tmp_path, ["01_identity_reconstruction"]) for r in (OTHER_RELEASE, "nope")]
    path = matrix_report.write_matrix(tmp_path, [OTHER_RELEASE, "nope"])
    info = {i["release"]: i for i in infos}
    assert info[OTHER_RELEASE]["ok"] and info[OTHER_RELEASE]["rc"] == 0, info[OTHER_RELEASE]
    assert not info["nope"]["ok"]
    data = json.loads((tmp_path / "matrix" / OTHER_RELEASE / "results" / "01_identity_reconstruction.json").read_text())
    assert data["environment"]["transformers"] == OTHER_RELEASE
    assert data["environment"]["torch"] == __import__("torch").__version__
    assert (tmp_path / "matrix" / OTHER_RELEASE / "SUMMARY.md").exists()
    assert (tmp_path / "matrix" / OTHER_RELEASE / "html" / "01_identity_reconstruction.html").exists()
    text = path.read_text()
    assert OTHER_RELEASE in text and "not a version" in text
    for claim in data["claims"]:
        assert f"`{claim['id']}`" in text
    assert len(text) < 60_000


def test_a_notebook_that_stopped_early_is_one_line_not_a_flood(tmp_path):
    facts = {f"fact_{i}": i for i in range(30)}
    _results(tmp_path, "5.14.1", "05_offload", {"offload.a": ("error", {})}, {})
    for release, waits in (("5.17.0", False), ("5.24.0", True)):
        _results(tmp_path, release, "05_offload", {"offload.a": ("reproduced", {})},
                 {**facts, "source_facts": {"prefetch waits": waits}})
    section = matrix_report.build_matrix(tmp_path, ["5.14.1", "5.17.0", "5.24.0"]).split("## Releases")[0]
    line = next(ln for ln in section.splitlines() if "`prefetch waits`" in ln)
    assert line.startswith("- **5.17.0 → 5.24.0** · 05_offload: ") and "`false` → `true`" in line
    assert "fact_" not in section  # absent only where the notebook stopped early: not a change


def test_kit_versions_that_differ_are_flagged(tmp_path):
    for release, commit in (("5.17.0", "aaaa"), ("5.24.0", "bbbb")):
        _results(tmp_path, release, "01_x", {"c": ("reproduced", {})}, {"v": 1.0})
        path = tmp_path / "matrix" / release / "results" / "01_x.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "run": {"run_id": "r", "kit_commit": commit, "kit_dirty": False}}))
    text = matrix_report.build_matrix(tmp_path, ["5.17.0", "5.24.0"])
    assert "**The releases ran different versions of the kit**: 5.17.0: aaaa; 5.24.0: bbbb" in text


def test_release_record_carries_no_machine_path(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ensure_env", lambda release, log=print: envs.ReleaseEnv(
        release, ok=False, python=str(paths.repo_root() / ".venv-tf" / release / "bin" / "python"), reason="test"))
    matrix_run.run_release("9.9.9", tmp_path, log=lambda *a, **k: None)
    text = (tmp_path / "matrix" / "9.9.9" / "release.json").read_text()
    assert str(paths.repo_root()) not in text and "./.venv-tf/9.9.9/bin/python" in text


def test_matrix_names_its_run_and_says_loudly_when_it_did_not_finish(tmp_path):
    _release(tmp_path, "1.0", claims={"c": "reproduced"})
    (tmp_path / "matrix" / "run.json").write_text(json.dumps({
        "run_id": "20261202T210000Z-m001", "command": "matrix", "started": "2026-12-02T21:00:00Z", "finished": None,
        "status": "interrupted", "kit_commit": "abcdef1234567", "kit_dirty": False}))
    head = matrix_report.build_matrix(tmp_path, ["1.0"]).split("## What changed")[0]
    assert "**Matrix run `20261202T210000Z-m001`** · ⚠️ **INTERRUPTED**" in head
    assert "`abcdef123456` (clean)" in head and "This matrix run is interrupted" in head


FIVE = ("5.14.1", "5.17.0", "5.19.0", "5.20.0", "5.24.0")


def _five_releases(base: Path) -> None:
    """The default matrix as the kit records it: 02's first call loses its mask between 5.17.0 and 5.19.0, 05's
    prefetch edge arrives at 5.20.0 (restated over many JSON paths), 06's error texts differ only past what is
    shown, floats jitter everywhere and source lines move on every release."""
    for i, release in enumerate(FIVE):
        new_mask, edge = i >= 2, i >= 3
        noise = 1 + i * 1e-7
        _results(base, release, "02_mask", {
            "matrix.first_call_drops_suffix": ("reproduced", {"first_call_attention_mask": None if new_mask else [1, 1]}),
            "matrix.mask_only_works": ("reproduced", {"max_abs_diff": 0.25 * noise})},
            {"cells": [{"variant": v, "first_call_attention_mask": None if new_mask else [1, 82], "max_abs_diff": 0.1 * noise}
                       for v in ("neither", "position_only", "mask_only", "both")],
             "frame": f"transformers/generation/utils.py:{2100 + 7 * i} in generate"})
        reads = [{"call": None if edge else 3 + k, "layer": None if edge else k, "reading_stream": None if edge else "prefetch",
                  "waits_for_copy": edge} for k in range(4)]
        _results(base, release, "05_offload", {
            "offload.prefetch_reads_unordered_copy": ("not_reproduced" if edge else "reproduced",
                                                      {"unordered_reads": 0 if edge else 4, "reads": 7}),
            "offload.linear_layers_never_moved": ("reproduced", {"source_facts": {
                "prefetch stream waits for the default stream before prefetching": edge}})},
            {"unordered": reads, "drift": [0.0, 2.1 * noise, 7.6 * noise],
             "frame": f"transformers/cache_utils.py:{1394 + 40 * i} in update"})
        long_error = "RuntimeError: the rebuilt cache reports 81 tokens but the first call saw " + "x" * 80 + str(i)
        _results(base, release, "07_families", {"families.rebuild": ("reproduced", {})},
                 {"cells": {"mask_only": f"matches {4.8 + i:.1f}e-07", "both": "bitwise"},
                  "per_step": [None, 0.12 + i * 1e-7]})  # float jitter beside a None
        _results(base, release, "06_triage", {"triage.control_rebuild_passes": ("reproduced", {"error": long_error})},
                 {"steps": [{"stage": "first_call", "error_type": long_error, "max_abs_diff": 1e-3 * noise}]})


def _first_section(text: str) -> list[str]:
    section = text[text.index("## What changed between releases"): text.index("## Releases")]
    return [ln for ln in section.splitlines() if ln.startswith("- ")]


def test_what_changed_is_one_line_per_notebook_and_release_boundary(tmp_path):
    _five_releases(tmp_path)
    text = matrix_report.build_matrix(tmp_path, list(FIVE))
    lines = _first_section(text)
    assert 1 <= len(lines) <= 12
    heads = [re.match(r"- \*\*(\S+) → (\S+)\*\* · (\S+): ", ln).groups() for ln in lines]
    assert len(heads) == len(set(heads)) and heads == [("5.17.0", "5.19.0", "02_mask"), ("5.19.0", "5.20.0", "05_offload")]
    mask, edge = lines
    assert "`first_call_attention_mask` `[1,1]`, `[1,82]` → `null` (×5)" in mask
    assert "`offload.prefetch_reads_unordered_copy` ✅ reproduced → ❌ not_reproduced" in edge
    assert "`unordered_reads` `4` → `0`" in edge and "prefetch stream waits" in edge
    assert "`call` 4 values (`3`, …) → `null` (×4)" in edge and "+3 more value(s)" in edge  # one line, not one per path
    for ln in lines:  # never a value listed as different whose displayed values are identical
        for old, new in re.findall(r"`([^`]*)` → `([^`]*)`", ln):
            assert old != new, ln
    assert not any("06_triage" in ln for ln in lines)  # error texts that differ only past what is shown
    assert not any("07_families" in ln for ln in lines)  # the same text around other floats; floats beside a None
    assert not any("5.14.1 → 5.17.0" in ln for ln in lines)  # floats jitter there, nothing behaves differently
    assert not any("frame" in ln or "drift" in ln or "max_abs_diff" in ln for ln in lines)
    assert "## Verdicts" in text and "## Differences" in text


def test_what_changed_says_so_when_nothing_behaves_differently(tmp_path):
    for release in FIVE[:2]:
        _results(tmp_path, release, "01_x", {"c": ("reproduced", {})}, {"d": 1.0 + (release == FIVE[1]) * 1e-9})
    text = matrix_report.build_matrix(tmp_path, list(FIVE[:2]))
    assert _first_section(text) == [] and "No verdict and no behaviour value changes" in text


def test_pips_reason_is_its_last_error_line():
    said = ("Looking in indexes: https://pypi.org/simple\nERROR: Could not find a version that satisfies the requirement "
            "kernels<0.20,>=0.19.1 (from versions: " + ", ".join(f"0.{i}.0" for i in range(40)) + ")\n"
            "ERROR: No matching distribution found for kernels<0.20,>=0.19.1\n")
    assert envs._tail(said) == "ERROR: No matching distribution found for kernels<0.20,>=0.19.1"
    assert envs._tail("Traceback\nValueError: bad") == "ValueError: bad"


def test_matrix_md_written_by_the_command_shows_the_final_status(tmp_path, monkeypatch):
    """`make matrix` writes matrix.md after its run record is finished, so a complete run does not read 'still running'."""
    from helpers.pipeline.run import cli

    def fake_release(release, out_base, stems, jobs, log):
        _release(out_base, release, claims={"c": "reproduced"})
        (out_base / "matrix" / release / "run.json").write_text(json.dumps({"run_id": f"r-{release}", "status": "complete"}))
        return {"release": release, "ok": True, "rc": 0}

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(matrix_run, "run_release", fake_release)
    assert cli._matrix(["1.0"], ["01_x"], None) == 0
    head = (tmp_path / "matrix.md").read_text().split("## What changed")[0]
    assert "✅ complete" in head and "still running" not in head
