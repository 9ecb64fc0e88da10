"""outputs/share.zip: the one file to attach; holds this run's HTML, figures and results, nothing of other runs,
no machine path, and the same bytes for the same run."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from helpers.pipeline.report import share
from helpers.pipeline.report import summary as summary_md
from helpers.pipeline.paths import repo_root

RUN = {"run_id": "20261203T000000Z-zip0", "command": "run-all", "status": "complete", "notebooks": {"01_a": {"status": "ok"}}}


def _outputs(out: Path) -> None:
    (out / "results").mkdir(parents=True)
    (out / "figures").mkdir()
    (out / "html").mkdir()
    (out / "run.json").write_text(json.dumps(RUN))
    for nb, rid in (("01_a", RUN["run_id"]), ("02_old", "19990101T000000Z-old0")):
        (out / "results" / f"{nb}.json").write_text(json.dumps({"notebook": nb, "run": {"run_id": rid}, "environment": {
            "model_id": f"{repo_root()}/ckpt"}, "claims": [{"id": f"{nb}.c", "kind": "reproduces", "verdict": "reproduced"}]}))
        (out / "figures" / f"{nb}-grid.png").write_bytes(b"\x89PNG fake")
        (out / "html" / f"{nb}.html").write_text(f"<html>{nb}</html>")
    (out / "timings.json").write_text(json.dumps({"run_id": RUN["run_id"], "where": str(out / "notebooks")}))


def test_the_archive_holds_this_runs_files_only(tmp_path):
    _outputs(tmp_path)
    summary_md.write_summary(tmp_path)
    with zipfile.ZipFile(tmp_path / share.ARCHIVE) as zf:
        names = zf.namelist()
        assert zf.testzip() is None
        summary = zf.read("SUMMARY.md").decode()
        result = zf.read("results/01_a.json").decode()
        timings = zf.read("timings.json").decode()
    assert names == ["SUMMARY.md", "run.json", "timings.json", "html/01_a.html", "figures/01_a-grid.png", "results/01_a.json",
                     "repro/resume_contract_qwen3_vl.py"]  # notebook 01's source's repro, from examples/repro/
    assert "1 repro" in summary and summary == (tmp_path / "SUMMARY.md").read_text() and "**`share.zip`**" in summary
    assert str(repo_root()) not in result and "./ckpt" in result  # scrubbed before archiving
    assert str(tmp_path) not in timings


def test_the_same_run_gives_the_same_bytes(tmp_path):
    _outputs(tmp_path)
    first = share.write_share(tmp_path, {"01_a"}).read_bytes()
    second = share.write_share(tmp_path, {"01_a"}).read_bytes()
    assert first == second and not (tmp_path / "share.zip.tmp").exists()


def test_members_of_a_figure_need_the_stem_and_a_dash(tmp_path):
    _outputs(tmp_path)
    (tmp_path / "figures" / "01_ab-x.png").write_bytes(b"x")  # 01_ab is another notebook than 01_a
    assert "figures/01_ab-x.png" not in share.share_members(tmp_path, {"01_a"})
    assert "figures/01_ab-x.png" in share.share_members(tmp_path, None)


def test_timings_written_after_the_summary_are_scrubbed_and_archived(tmp_path):
    """runner.py writes timings.json after SUMMARY.md; share.finish_timings(out) is its one call after that."""
    _outputs(tmp_path)
    (tmp_path / "timings.json").unlink()
    summary_md.write_summary(tmp_path)
    assert "timings.json" not in zipfile.ZipFile(tmp_path / "share.zip").namelist()
    (tmp_path / "timings.json").write_text(json.dumps({"run_id": RUN["run_id"], "output": str(tmp_path / "notebooks")}))
    share.finish_timings(tmp_path)
    assert str(tmp_path) not in (tmp_path / "timings.json").read_text()
    with zipfile.ZipFile(tmp_path / "share.zip") as zf:
        assert "{outputs}/notebooks" in zf.read("timings.json").decode()
        assert "results/02_old.json" not in zf.namelist()


def test_another_runs_timings_never_go_in(tmp_path):
    _outputs(tmp_path)
    (tmp_path / "timings.json").write_text(json.dumps({"run_id": "someone-else"}))
    assert "timings.json" not in share.share_members(tmp_path, {"01_a"})


# --------------------------------------------------------------------------- make share: the pinned and the newest release

def test_make_share_resolves_the_newest_from_the_index_and_falls_back_offline_saying_so():
    from helpers.pipeline.releases import share as make_share
    from helpers.pipeline.releases.envs import pinned_release

    got = make_share.resolve(lambda: ["5.14.1", "5.17.0", "5.26.0"])
    assert got == {"pinned": pinned_release(), "newest": "5.26.0", "resolved": "package index",
                   "listed": ["5.14.1", "5.17.0", "5.26.0"]}

    def offline() -> list[str]:
        raise RuntimeError("pip could not list transformers releases: no network")
    got = make_share.resolve(offline)
    assert got["newest"] == make_share.KNOWN_NEWEST == "5.25.0"
    assert got["resolved"].startswith("offline (newest the kit knows; pip could not list") and got["listed"] == []


def test_make_share_runs_all_on_the_pinned_then_the_newest_through_the_matrix_then_the_report(tmp_path, monkeypatch):
    """The orchestration alone, the runs mocked: run-all, releases.json after it, the matrix on the newest only."""
    from helpers.pipeline.releases import share as make_share
    from helpers.pipeline.report import html
    from helpers.pipeline.run import cli

    calls: list[tuple] = []
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setattr(make_share, "resolve", lambda: {"pinned": "5.17.0", "newest": "5.25.0", "resolved": "package index"})
    monkeypatch.setattr(cli, "_recorded", lambda command, paths, pairs, jobs, report: calls.append(
        ("run", command, (tmp_path / "releases.json").exists())) or 0)
    monkeypatch.setattr(cli, "_matrix", lambda releases, stems, jobs: calls.append(("matrix", tuple(releases))) or 0)
    monkeypatch.setattr(html, "write_html", lambda *a, **k: calls.append(("html",)) or ([], []))
    monkeypatch.setattr(make_share, "bisect_changed", lambda out, info: calls.append(("bisect", info["newest"])) or [])
    assert cli.main(["share"]) == 0
    assert calls == [("run", "share", False), ("matrix", ("5.25.0",)), ("bisect", "5.25.0"), ("html",)]
    assert json.loads((tmp_path / "releases.json").read_text())["newest"] == "5.25.0"
    assert (tmp_path / "SUMMARY.md").is_file()


def _verdicts(folder: Path, verdicts: dict[str, str]) -> None:
    (folder / "results").mkdir(parents=True)
    for nb, (claim, verdict) in {"02_m": ("matrix.neither_fails", verdicts["02"]),
                                 "05_o": ("offload.prefetch_reads_unordered_copy", verdicts["05"])}.items():
        (folder / "results" / f"{nb}.json").write_text(json.dumps({"notebook": nb, "claims": [{"id": claim, "verdict": verdict}]}))


def test_make_share_bisects_only_the_key_claims_whose_verdict_differs_and_never_offline(tmp_path, monkeypatch):
    from helpers.pipeline.bisect import cli as bisect_cli
    from helpers.pipeline.releases import share as make_share

    _verdicts(tmp_path, {"02": "reproduced", "05": "holds"})
    _verdicts(tmp_path / "matrix" / "5.25.0", {"02": "reproduced", "05": "does_not_hold"})
    info = {"pinned": "5.17.0", "newest": "5.25.0", "listed": ["5.14.1", "5.17.0", "5.20.0", "5.25.0"]}
    assert make_share.changed(tmp_path, info) == [("05", "offload.prefetch_reads_unordered_copy")]
    ran = []
    monkeypatch.setattr(bisect_cli, "run", lambda nb, claim, key, releases, good, bad, out, log: ran.append(
        (nb.stem[:2], claim, releases, good, bad)) or ({}, out / "x.md"))
    make_share.bisect_changed(tmp_path, info, log=lambda *a: None)
    assert ran == [("05", "offload.prefetch_reads_unordered_copy", ["5.17.0", "5.20.0", "5.25.0"], "5.17.0", "5.25.0")]
    said = []
    assert make_share.bisect_changed(tmp_path, {**info, "listed": []}, log=said.append) == []
    assert said and "could not be read" in said[0]
