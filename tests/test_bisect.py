"""make bisect: the search over fake per-release values (monotonic, non-monotonic, an uninstallable release in
the middle, an interrupt), the source diff read with inspect from two installs, the report, and the refusals."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from helpers.pipeline.bisect import cli as bisect_cli
from helpers.pipeline.bisect import report as bisect_report
from helpers.pipeline.bisect import upstream_code
from helpers.pipeline.bisect.search import Interrupted, Probe, find_changes

RELEASES = ["5.14.1", "5.15.0", "5.15.1", "5.16.0", "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.0", "5.20.1",
            "5.20.2", "5.21.0", "5.21.1", "5.22.0", "5.22.1", "5.22.2", "5.23.0", "5.24.0"]


def _prober(values: dict[str, object], broken: dict[str, str] | None = None):
    calls: list[str] = []

    def probe(release: str) -> Probe:
        calls.append(release)
        if release in (broken or {}):
            return Probe(release, ok=False, reason=f"not installable: {broken[release]}")
        return Probe(release, values[release])
    return probe, calls


def _step(at: str, before="reproduced", after="not_reproduced") -> dict[str, object]:
    return {r: before if RELEASES.index(r) < RELEASES.index(at) else after for r in RELEASES}


def test_a_monotonic_change_is_found_at_adjacent_releases_within_the_run_budget():
    probe, calls = _prober(_step("5.20.0"))
    search = find_changes(RELEASES, probe)
    assert search.changes == [("5.19.0", "5.20.0")]
    assert len(calls) == len(set(calls)) <= math.log2(len(RELEASES)) + 2
    for at in RELEASES[1:]:  # wherever the change is, never more than 2 + ceil(log2(n - 1)) runs
        probe, calls = _prober(_step(at))
        search = find_changes(RELEASES, probe)
        assert search.changes == [(RELEASES[RELEASES.index(at) - 1], at)]
        assert search.runs == len(calls) <= 2 + math.ceil(math.log2(len(RELEASES) - 1))


def test_a_value_that_changes_twice_has_both_change_points():
    values = {r: "[1, 82]" if r < "5.17.0" else "[1, 1]" if r < "5.21.0" else None for r in RELEASES}
    search = find_changes(RELEASES, _prober(values)[0])
    assert search.changes == [("5.16.1", "5.17.0"), ("5.20.2", "5.21.0")]
    assert "not monotonic: it changes 2 times" in "\n".join(bisect_report.summary(search, "value `x`"))


def test_the_same_value_at_both_ends_is_no_change_and_says_what_it_cannot_see():
    probe, calls = _prober({r: "same" for r in RELEASES})
    search = find_changes(RELEASES, probe)
    assert search.changes == [] and calls == ["5.14.1", "5.24.0"]
    assert "would not be seen" in bisect_report.summary(search, "claim `c`")[0]


def test_an_uninstallable_release_in_the_middle_is_skipped_with_its_reason_never_guessed():
    probe, calls = _prober(_step("5.20.0"), {"5.19.0": "needs kernels>=0.9 (not on the index)", "5.20.0": "no wheel"})
    search = find_changes(RELEASES, probe)
    assert search.changes == [("5.18.0", "5.20.1")]
    assert search.skipped == {"5.19.0": "not installable: needs kernels>=0.9 (not on the index)",
                              "5.20.0": "not installable: no wheel"}
    data = bisect_report.to_json(search, {"notebook": "05_x", "what": "claim `c`", "good": "5.14.1", "bad": "5.24.0"}, {})
    assert set(data["not_installable"]) == {"5.19.0", "5.20.0"}
    assert {r["release"]: r["value"] for r in data["tried"]}["5.19.0"] is None
    text = bisect_report.to_markdown({**data, "summary": bisect_report.summary(search, "claim `c`")})
    assert "needs kernels>=0.9" in text and "**5.20.1** is the first release" in text


def test_an_uninstallable_good_end_moves_the_end_inward():
    probe, _ = _prober(_step("5.20.0"), {"5.14.1": "python too new"})
    assert find_changes(RELEASES, probe).changes == [("5.19.0", "5.20.0")]


def test_an_interrupted_search_keeps_what_it_measured():
    values, seen = _step("5.20.0"), []

    def probe(release: str) -> Probe:
        if len(seen) == 3:
            raise Interrupted()
        seen.append(release)
        return Probe(release, values[release])
    search = find_changes(RELEASES, probe)
    assert search.interrupted and [p.release for p in search.tried()] == sorted(seen, key=RELEASES.index)
    data = bisect_report.to_json(search, {"notebook": "05_x", "what": "c", "good": "a", "bad": "b", "seconds": 1.0}, {})
    assert data["status"] == "interrupted" and len(data["tried"]) == 3
    assert "Interrupted" in bisect_report.to_markdown({**data, "summary": bisect_report.summary(search, "c")})


def _install(root: Path, body: str) -> str:
    (root / "fakepkg").mkdir(parents=True)
    (root / "fakepkg" / "__init__.py").write_text("")
    (root / "fakepkg" / "cache.py").write_text(body)
    return str(root)


def test_the_source_diff_is_read_with_inspect_from_each_install(tmp_path):
    old = _install(tmp_path / "old", "class Cache:\n    def update(self, x):\n        self.prefetch(x)\n        return x\n")
    new = _install(tmp_path / "new", "class Cache:\n    def update(self, x):\n"
                                     "        self.prefetch_stream.wait_stream(self.default)\n        self.prefetch(x)\n"
                                     "        return x\n\n    def prefetch(self, x):\n        return x\n")
    names = ["fakepkg.cache.Cache.update", "fakepkg.cache.Cache.prefetch", "fakepkg.nothere.f"]
    read = {r: upstream_code.read_sources(sys.executable, names, {"PYTHONPATH": p}, p) for r, p in (("1.0", old), ("1.1", new))}
    assert read["1.0"]["fakepkg.cache.Cache.prefetch"]["error"].startswith("AttributeError")
    diffs = upstream_code.diff_sources(read["1.0"], read["1.1"], "1.0", "1.1")
    assert diffs["fakepkg.cache.Cache.update"]["status"] == "changed"
    assert diffs["fakepkg.cache.Cache.prefetch"]["status"] == "added"
    assert diffs["fakepkg.nothere.f"]["status"] == "unreadable"
    assert upstream_code.changed_lines(diffs["fakepkg.cache.Cache.update"]["diff"]) == [
        "+        self.prefetch_stream.wait_stream(self.default)"]
    assert "--- 1.0/fakepkg.cache.Cache.update" in diffs["fakepkg.cache.Cache.update"]["diff"]


def test_the_report_quotes_the_diff_of_the_change_point():
    search = find_changes(RELEASES[:3], _prober({"5.14.1": "a", "5.15.0": "a", "5.15.1": "b"})[0])
    diff = {"Cache.update": {"status": "changed", "diff": "--- a\n+++ b\n@@\n-    old()\n+    new()\n"},
            "Cache.offload": {"status": "same", "diff": ""}}
    data = bisect_report.to_json(search, {"notebook": "05_x", "what": "c", "good": "5.14.1", "bad": "5.15.1", "seconds": 2},
                                 {"5.15.0..5.15.1": diff})
    text = bisect_report.to_markdown({**data, "summary": bisect_report.summary(search, "c")})
    assert "## Source diff 5.15.0 → 5.15.1" in text and "    -    old()\n    +    new()" in text
    assert "Unchanged: `Cache.offload`" in text and data["notebook_runs"] == 3


def test_a_key_is_every_recorded_path_ending_in_it():
    data = {"claims": [{"id": "c", "verdict": "reproduced", "evidence": {"first_call_attention_mask": [[1, 82]]}}],
            "measurements": {"cells": [{"first_call_attention_mask": [1, 82]}]}}
    assert bisect_cli.value_of(data, None, "first_call_attention_mask") == (True, {
        "claims.c.evidence.first_call_attention_mask": [[1, 82]], "measurements.cells[0].first_call_attention_mask": [1, 82]}, "")
    data["claims"][0]["evidence"]["first_call_attention_mask"] = [1, 82]
    assert bisect_cli.value_of(data, None, "first_call_attention_mask") == (True, [1, 82], "")
    assert bisect_cli.value_of(data, "c", None) == (True, "reproduced", "")
    assert not bisect_cli.value_of(data, None, "nothing")[0]


@pytest.mark.parametrize("argv, says", [
    (["--notebook", "05", "--claim", "offload.nope"], "valid: offload.prefill_identical"),
    (["--notebook", "99", "--key", "x"], "valid: 01, 02"),
    (["--notebook", "02"], "exactly one of CLAIM"),
    (["--notebook", "02", "--key", "x", "--good", "5.24.0", "--bad", "5.14.1"], "must be older"),
    (["--notebook", "02", "--key", "x", "--good", "5.99.0"], "not a listed release"),
    (["--notebook", "02", "--key", "x y"], "not a value name"),
])
def test_bad_arguments_are_refused_in_one_line_before_any_install(argv, says, monkeypatch, capsys):
    from helpers.pipeline.releases import envs

    monkeypatch.setattr(envs, "ensure_env", lambda *a, **k: pytest.fail("installed before refusing"))
    assert bisect_cli.main([*argv, "--releases", *RELEASES]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refused: ") and says in err[0]


def test_a_bisect_with_fake_releases_writes_both_files(tmp_path, monkeypatch):
    values = _step("5.20.0")
    monkeypatch.setattr(bisect_cli.Bisect, "probe", lambda self, r: Probe(r, values[r], seconds=1.0))
    monkeypatch.setattr(bisect_cli.Bisect, "diffs", lambda self, s: {"5.19.0..5.20.0": {"Cache.update": {
        "status": "changed", "diff": "--- a\n+++ b\n+        self.prefetch_stream.wait_stream(default)\n"}}})
    nb = next(p for p in (Path(__file__).parent.parent / "notebooks").glob("05_*.ipynb"))
    data, md = bisect_cli.run(nb, "offload.prefetch_reads_unordered_copy", None, RELEASES, "5.14.1", "5.24.0", out=tmp_path)
    assert md.name == "05-offload.prefetch_reads_unordered_copy.md"
    saved = json.loads((tmp_path / "05-offload.prefetch_reads_unordered_copy.json").read_text())
    assert saved["changes"][0]["first_different"] == "5.20.0" and saved["changes"][0]["last_same"] == "5.19.0"
    assert "wait_stream" in md.read_text() and saved["notebook_runs"] <= math.log2(len(RELEASES)) + 2


def test_a_focused_function_keeps_only_the_hunks_that_mention_its_word():
    old = "def generate(self):\n" + "".join(f"    step_{i}()\n" for i in range(30)) + "    mask = kwargs['attention_mask']\n"
    new = old.replace("step_2()", "step_two()").replace("    mask = kwargs['attention_mask']\n",
                                                        "    kwargs['attention_mask'] = None\n")
    diffs = upstream_code.diff_sources({"g": old, "h": old}, {"g": new, "h": old.replace("step_2", "x")}, "1", "2",
                                       focus={"g": "attention_mask", "h": "attention_mask"})
    assert "step_two" not in diffs["g"]["diff"] and "+    kwargs['attention_mask'] = None" in diffs["g"]["diff"]
    assert diffs["h"]["status"] == "same" and "no hunk mentions" in diffs["h"]["note"]
    assert upstream_code.split_focus(["a.b|mask", "c"]) == (["a.b", "c"], {"a.b": "mask"})


def test_a_keys_several_paths_are_shown_as_their_distinct_values():
    assert bisect_report.shown({"a.m": [[1, 1]], "b.m": [[1, 1]], "c.m": [[1, 82]]}) == "[[1,1]] (×2), [[1,82]] over 3 paths"
    assert bisect_report.shown([None]) == "[null]"


def test_the_quoted_lines_prefer_the_pattern_then_code_over_comments():
    diff = "--- a\n+++ b\n@@\n+    # a comment\n+    x = 1\n+    model_kwargs[\"attention_mask\"] = None\n"
    assert upstream_code.changed_lines(diff) == ["+    x = 1", "+    model_kwargs[\"attention_mask\"] = None"]
    assert upstream_code.changed_lines(diff, prefer=upstream_code.QUOTE[
        "transformers.generation.utils.GenerationMixin.generate"])[0] == "+    model_kwargs[\"attention_mask\"] = None"


def test_ctrl_c_during_a_bisect_writes_an_interrupted_report_with_what_was_measured(tmp_path, monkeypatch):
    import os
    import signal
    import time

    values, calls = _step("5.20.0"), []

    def probe(self, release):
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C while the third release runs
            time.sleep(0.05)
        if self.stop.signum is not None:
            raise Interrupted()
        calls.append(release)
        return Probe(release, values[release], seconds=1.0)
    monkeypatch.setattr(bisect_cli.Bisect, "probe", probe)
    nb = next(p for p in (Path(__file__).parent.parent / "notebooks").glob("05_*.ipynb"))
    data, md = bisect_cli.run(nb, "offload.prefetch_reads_unordered_copy", None, RELEASES, "5.14.1", "5.24.0", out=tmp_path)
    assert data["status"] == "interrupted" and [r["release"] for r in data["tried"]] == ["5.14.1", "5.24.0"]
    assert "**Interrupted**" in md.read_text() and data["changes"] == []


def test_good_and_bad_default_to_the_matrix_first_and_last_release():
    from helpers.pipeline.releases.report import DEFAULT_RELEASES

    assert (bisect_cli.DEFAULT_GOOD, bisect_cli.DEFAULT_BAD) == (DEFAULT_RELEASES[0], DEFAULT_RELEASES[-1]) == ("5.14.1", "5.25.0")
    assert bisect_cli.span(RELEASES + ["5.25.0", "5.26.0"], bisect_cli.DEFAULT_GOOD, bisect_cli.DEFAULT_BAD) == RELEASES + ["5.25.0"]
