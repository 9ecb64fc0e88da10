"""outputs/SUMMARY.md, share.zip and the self-contained HTML renderings: unit checks on hand-made run records and
results (the run.json contract of the brief), and one end-to-end check on a real papermill run of notebook 01.
Per-kind counting, per-source sections and paste safety: tests/test_summary.py; the archive: tests/test_share.py."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import zipfile

import pytest

from helpers.pipeline.report import html as html_page
from helpers.pipeline.report import paste
from helpers.pipeline.report import records
from helpers.pipeline.report import scrub
from helpers.pipeline.report import summary
from helpers.pipeline.report import scrub as scrub_mod
from helpers.pipeline.paths import repo_root

_REMOTE_ATTR = re.compile(r"<(?!a\b)(\w+)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.IGNORECASE)


def remote_references(html: str) -> list[str]:
    """Tags (other than plain <a> links) whose src or href loads something from the network."""
    return [m.group(0) for m in _REMOTE_ATTR.finditer(html)]


RUN_A = {"run_id": "20261202T203000Z-a1b2", "command": "run-all", "started": "2026-12-02T20:30:00Z",
         "finished": "2026-12-02T20:30:42Z", "status": "complete", "kit_commit": "f3a57f9c0ffee", "kit_dirty": True,
         "parameters": {"seq_len": 16},
         "notebooks": {"01_a": {"status": "ok", "seconds": 7.5, "error": "", "parameters": {"seq_len": 16}},
                       "02_b": {"status": "ok", "seconds": 6.25, "error": "", "parameters": {"seq_len": 16}}},
         "environment": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.17.0", "platform": "Linux",
                         "cuda_available": False}}


def _run(out: Path, **changes) -> dict:
    run = {**RUN_A, **changes}
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(run))
    return run


def _write_results(out: Path, notebook: str, claims: list[dict], env: dict | None = None,
                   run_id: str | None = RUN_A["run_id"], started: str | None = RUN_A["started"]) -> None:
    env = {"python": "3.11", "torch": "2.13.0", "transformers": "5.17.0", "device": "cpu", "dtype": "float32",
           "model_id": "tiny", "model_revision": "r1", **(env or {})}
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{notebook}.json").write_text(json.dumps(
        {"notebook": notebook, "environment": env, "claims": claims, "measurements": {},
         "run": {"run_id": run_id, "started": started, "kit_commit": "f3a57f9", "kit_dirty": False}}))


def _claim(cid: str, verdict: str = "reproduced", deciding=None, source=None, kind="reproduces", **evidence) -> dict:
    return {"id": cid, "statement": f"statement of {cid}", "verdict": verdict, "reason": "why", "evidence": evidence,
            "kind": kind, "deciding": deciding or {}, "source": source or {}}


def _section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    nxt = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)
    return text[start: start + len(heading) + nxt.start()] if nxt else text[start:]


# --------------------------------------------------------------------------- formatting

def test_pairs_show_whole_values_and_count_the_rest():
    assert paste.pairs({"comparisons": 6, "max_abs_diff": 0.0, "bitwise": True}) == "comparisons=6; max_abs_diff=0; bitwise=true"
    assert paste.pairs({"d": 1.23456e-7, "shape": [1, 0]}) == "d=1.23e-07; shape=[1, 0]"
    assert paste.pairs({"a": 1, "blob": {"x": [1, 2, 3]}, "long": list(range(9))}) == "a=1; +2 more in the results file"
    assert paste.pairs({"s": "word " * 20}) == "+1 more in the results file"  # never cut mid-word
    assert paste.pairs({}) == "" and paste.pairs(None) == ""


def test_summary_is_truncated_under_the_limit_with_details_closed(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_big", [{**_claim(f"c.{i}"), "verdict": "not_reproduced", "statement": "long statement " * 20}
                                        for i in range(400)])  # listed with their statements: not holding
    text = summary.build_summary(tmp_path)
    assert len(text) < paste.MAX_CHARS < paste.GITHUB_LIMIT and "**Truncated:**" in text
    assert text.count("<details>") == text.count("</details>")


def test_external_images_are_detected():
    html = '<img src="data:image/png;base64,AAAA"><img alt=x src="figures/a.png"><img src=\'b.png\'>'
    assert html_page.external_images(html) == ["figures/a.png", "b.png"]


# --------------------------------------------------------------------------- the run record

def test_summary_names_the_run_at_the_top(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    text = summary.build_summary(tmp_path)
    top = text[: text.index("## Counts per kind")]
    for expected in ("20261202T203000Z-a1b2", "`run-all`", "✅ complete", "2026-12-02T20:30:00Z",
                     "2026-12-02T20:30:42Z", "`f3a57f9c0ffe` + uncommitted changes (dirty)", "`seq_len=16`"):
        assert expected in top, expected
    assert "INTERRUPTED" not in text


def test_interrupted_run_is_said_loudly_and_unfinished_notebooks_are_errors(tmp_path):
    _run(tmp_path, status="interrupted", finished="2026-12-02T20:30:05Z",
         notebooks={"01_a": {"status": "ok", "seconds": 4.0, "error": ""},
                    "02_b": {"status": "interrupted", "seconds": 1.0, "error": "interrupted"},
                    "03_c": {"status": "not_started", "seconds": None, "error": ""}})
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    _write_results(tmp_path, "02_b", [{**_claim("b.one", "error"), "reason": "interrupted"}])
    text = summary.build_summary(tmp_path)
    head = text[: text.index("## Counts per kind")]
    assert "**INTERRUPTED**" in head and "This run was interrupted before it finished**: 1 of 3 notebooks finished ok" in head
    claims = _section(text, "## The Qwen3-VL resume-contract control (transformers 5.14.1)")
    assert "| 02 | `b.one` | reproduces | ⚠️ error | see below | no quote registered |" in claims
    assert "- `b.one` ⚠️ error: interrupted" in claims
    assert "- `03_c` ⚠️ error: no results file from this run: not started" in _section(text, "## Notebooks without results")
    assert "| reproduces | the source states it | 1 reproduced | 0 not_reproduced | 0 | 1 |" in text


def test_no_run_record_presents_nothing_as_this_run(tmp_path):
    _write_results(tmp_path, "01_a", [_claim("a.one")], run_id=None, started=None)
    text = summary.build_summary(tmp_path)
    assert "**No run record**" in text
    assert "`a.one`" not in text[: text.index("## From an earlier run")]
    assert "## From an earlier run (no run id" in text and "`a.one`" in text


def test_claims_table_shows_only_the_current_run(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_a", [_claim("a.one"), _claim("a.two", "not_reproduced", diff=0.5)])
    _write_results(tmp_path, "02_b", [_claim("b.stale")], run_id="20261201T100000Z-old0", started="2026-12-01T10:00:00Z")
    _write_results(tmp_path, "03_c", [_claim("c.byhand")], run_id=None, started=None)
    text = summary.build_summary(tmp_path)
    claims = text[: text.index("## From an earlier run")]
    assert "`a.one`" in claims and "`a.two`" in claims
    assert "b.stale" not in claims and "c.byhand" not in claims
    assert ("- `02_b` ⚠️ error: no results file from this run: the notebook ran but wrote no results file"
            in _section(text, "## Notebooks without results"))
    assert "| reproduces | the source states it | 1 reproduced | 1 not_reproduced | 0 | 0 |" in text
    assert "1 of 2 source statement(s) reproduced" in text
    assert "2 results file(s) from other runs" in text
    stale = _section(text, "## From an earlier run (run `20261201T100000Z-old0`, started 2026-12-01T10:00:00Z)")
    assert "`b.stale`" in stale and "| that run |" in stale
    assert "`c.byhand`" in _section(text, "## From an earlier run (no run id: run by hand or by an older kit, time unknown)")
    assert text.index("## From an earlier run") > text.index("## Environment")


def test_environment_checks_are_listed_apart_and_never_counted(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_a", [_claim("a.one"), _claim("env.cuda", "skipped", kind="environment"),
                                      _claim("env.flag", "reproduced", kind="environment")])
    text = summary.build_summary(tmp_path)
    assert "1 of 1 source statement(s) reproduced" in text
    assert "| environment | a fact about this machine | 0 holds | 0 fails | 1 | 0 + 1 with a verdict foreign to the kind |" in text
    table = text[: text.index("## Environment checks")]
    checks = _section(text, "## Environment checks")
    assert "env.cuda" not in table and "env.flag" not in table
    assert "`env.cuda`" in checks and "`env.flag`" in checks


def test_deciding_values_beside_the_source_report(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "03_r", [
        _claim("rope.none_equals_zero", deciding={"max_abs_diff_zero_vs_none": 0.0, "cosine": 1.0},
               source={"max_abs_diff_none_vs_0": 17.13, "cosine": 0.306},
               none_vs_reference_max_abs_diff=0.451, zero_vs_reference_max_abs_diff=0.451),
        _claim("generic.fallback", comparisons=6, bitwise=True)])
    text = summary.build_summary(tmp_path)
    assert "| nb | claim | kind | verdict | this run | source |" in text
    assert ("| 03 | `rope.none_equals_zero` | reproduces | ✅ reproduced | max_abs_diff_zero_vs_none=0; cosine=1 "
            '| "The None and zero cases were identical in this control" (max_abs_diff_none_vs_0=17.1; cosine=0.306) |') in text
    assert "0.451" not in text  # evidence stays in the attached results
    assert "| 03 | `generic.fallback` | reproduces | ✅ reproduced | in the results file | no quote registered |" in text


def test_timings_only_from_the_same_run(tmp_path):
    _run(tmp_path, notebooks={"01_a": {"status": "ok", "seconds": None, "error": ""}})
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    timings = {"run_id": "someone-else", "total_seconds": 99.0, "jobs": 2,
               "notebooks": [{"notebook": "01_a", "seconds": 55.5}]}
    (tmp_path / "timings.json").write_text(json.dumps(timings))
    text = summary.build_summary(tmp_path)
    assert "99" not in text and "55.5" not in text
    (tmp_path / "timings.json").write_text(json.dumps({**timings, "run_id": RUN_A["run_id"]}))
    text = summary.build_summary(tmp_path)
    assert "| wall-clock | 99 s, 2 notebook(s) at a time |" in text


def test_environment_once_and_per_notebook_model(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    _write_results(tmp_path, "02_b", [_claim("b.one", "skipped")], env={"model_id": "other", "model_revision": "r2"})
    text = summary.build_summary(tmp_path)
    assert text.count("| torch | `2.13.0` |") == 1
    assert "Differs between notebooks" in text and "| 02 | `other` | `r2` |" in text
    assert "| model_id | `" not in text


# --------------------------------------------------------------------------- pastes cleanly

def test_no_links_and_one_archive_to_attach(tmp_path):
    _run(tmp_path)
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    (tmp_path / "figures").mkdir()
    for name in ("01_a-plot.png", "09_stale-plot.png"):
        (tmp_path / "figures" / name).write_bytes(b"\x89PNG")
    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "01_a.html").write_text("<html></html>")
    summary.write_summary(tmp_path)
    text = (tmp_path / "SUMMARY.md").read_text()
    assert not re.search(r"\]\(", text), "a Markdown link or image"
    assert not re.search(r"(src|href)=", text)
    attach = _section(text, "## Attach")
    assert "**`share.zip`**" in attach and "1 self-contained HTML page(s), 1 figure(s), 1 results file(s)" in attach
    names = zipfile.ZipFile(tmp_path / "share.zip").namelist()
    assert {"SUMMARY.md", "run.json", "html/01_a.html", "figures/01_a-plot.png", "results/01_a.json"} <= set(names)
    assert "figures/09_stale-plot.png" not in names and "09_stale" not in text  # not of this run


def test_scrub_replaces_machine_paths_but_not_lookalikes(monkeypatch):
    root, home = str(repo_root()), str(Path.home())
    text = (f"{root}/outputs/figures/a.png and {home}/.cache/hf and /tmp/xyz/f.txt; "
            f"{sys.prefix}/lib; https://example.org/tmp/x stays")
    clean = scrub.scrub(text)
    assert "./outputs/figures/a.png" in clean and "~/.cache/hf" in clean and "{tmp}/xyz/f.txt" in clean
    assert "https://example.org/tmp/x stays" in clean
    assert root + "/" not in clean and home + "/" not in clean and " /tmp/" not in clean
    assert scrub.scrub("/tmp/kit/out/results/a.json", Path("/tmp/kit/out")) == "{outputs}/results/a.json"
    # The look-alike, built where no other placeholder reaches (a checkout under /tmp must not make it vacuous):
    fake = Path("/srv/kvkit-lookalike/kit")
    monkeypatch.setattr(scrub_mod, "repo_root", lambda: fake)
    out = fake / "outputs"
    lookalike = scrub.scrub(f"{fake}/a.txt {fake}x/b.txt {fake}-old/c.txt {fake}.bak", out)
    assert lookalike == f"./a.txt {fake}x/b.txt {fake}-old/c.txt {fake}.bak", lookalike


def test_write_summary_scrubs_summary_results_timings_and_run_record(tmp_path):
    root = str(repo_root())
    _run(tmp_path, parameters={"model_id": f"{root}/checkpoints/qwen"})
    _write_results(tmp_path, "01_a", [_claim("a.one", "error", where=f"{Path.home()}/x.py line 3")],
                   env={"model_id": f"{root}/checkpoints/qwen"})
    (tmp_path / "timings.json").write_text(json.dumps({"run_id": RUN_A["run_id"], "notebooks": [
        {"notebook": "01_a", "output": str(tmp_path / "notebooks" / "01_a.ipynb")}]}))
    summary.write_summary(tmp_path)
    with zipfile.ZipFile(tmp_path / "share.zip") as zf:
        archived = {name: zf.read(name).decode() for name in zf.namelist()}
    for path in [tmp_path / "SUMMARY.md", tmp_path / "run.json", tmp_path / "timings.json", *tmp_path.glob("results/*.json")]:
        text = path.read_text()
        assert _machine_paths(text, tmp_path) == [], (path.name, _machine_paths(text, tmp_path))
    assert "./checkpoints/qwen" in (tmp_path / "SUMMARY.md").read_text()
    assert "{outputs}/notebooks/01_a.ipynb" in (tmp_path / "timings.json").read_text()
    for name, text in archived.items():
        assert _machine_paths(text, tmp_path) == [], name


def test_scrub_file_cleans_a_timings_file_written_after_the_summary(tmp_path):
    """What runner.py must call after it writes timings.json (it is written after SUMMARY.md)."""
    timings = tmp_path / "timings.json"
    timings.write_text(json.dumps({"notebooks": [{"output": str(tmp_path / "notebooks" / "01_a.ipynb"),
                                                  "where": f"{repo_root()}/helpers"}]}))
    assert scrub.scrub_file(timings) is True
    text = timings.read_text()
    assert "{outputs}/notebooks/01_a.ipynb" in text and "./helpers" in text and str(tmp_path) not in text
    assert scrub.scrub_file(timings) is False  # already clean


def _machine_paths(text: str, out: Path) -> list[str]:
    """Absolute paths of this machine (repo, outputs, home, temp, python) left in `text`."""
    roots = {str(repo_root()), str(out), str(out.resolve()), str(Path.home()), "/tmp", sys.prefix, sys.base_prefix}
    return sorted({m.group(0) for r in roots if len(r) > 1
                   for m in re.finditer(r"(?<![\w./-])" + re.escape(r) + r"(?=[/\"'\s]|$)", text)})


# --------------------------------------------------------------------------- end to end: one real notebook

@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """Notebook 01 executed by papermill (as the runner does) under a hand-made run record."""
    import papermill as pm

    out = tmp_path_factory.mktemp("report-run")
    run_id = "20261202T000000Z-e2e0"
    mp = pytest.MonkeyPatch()
    for key, value in {"KVKIT_OUTPUT_DIR": str(out), "KVKIT_RUN_ID": run_id, "KVKIT_RUN_STARTED": RUN_A["started"],
                       "KVKIT_KIT_COMMIT": "f3a57f9", "KVKIT_KIT_DIRTY": "0"}.items():
        mp.setenv(key, value)
    try:
        nb = next(repo_root().joinpath("notebooks").glob("01_*.ipynb"))
        (out / "notebooks").mkdir(parents=True, exist_ok=True)
        pm.execute_notebook(str(nb), str(out / "notebooks" / nb.name), cwd=str(repo_root()), kernel_name="python3",
                            progress_bar=False)
        _run(out, run_id=run_id, command="run", notebooks={nb.stem: {"status": "ok", "seconds": 9.0, "error": ""}})
        written, errors = html_page.write_html(out)
        assert written and not errors, errors
        summary.write_summary(out)
    finally:
        mp.undo()
    return out


@pytest.mark.e2e
def test_report_on_a_real_run(real_run):
    text = (real_run / "SUMMARY.md").read_text()
    data = json.loads((real_run / "results" / "01_identity_reconstruction.json").read_text())
    assert data["claims"] and len(text) < paste.MAX_CHARS
    assert records.run_id_of(data) == "20261202T000000Z-e2e0", "the run id did not reach the results file"
    assert "From an earlier run" not in text
    where = _section(text, "## The Qwen3-VL resume-contract control (transformers 5.14.1)")
    for claim in data["claims"]:
        assert f"| 01 | `{claim['id']}` | {claim['kind']} | ✅ {claim['verdict']} |" in where
    assert {c["kind"] for c in data["claims"]} == {"reproduces"}
    assert "| reproduces | the source states it | 3 reproduced | 0 not_reproduced | 0 | 0 |" in text
    assert data["environment"]["transformers"] in where and data["environment"]["model_id"] in where
    figures = sorted(p.name for p in (real_run / "figures").glob("01_identity_reconstruction-*.png"))
    assert figures, "the notebook wrote no figure"
    names = zipfile.ZipFile(real_run / "share.zip").namelist()
    assert {f"figures/{f}" for f in figures} | {"html/01_identity_reconstruction.html", "SUMMARY.md",
                                                 "results/01_identity_reconstruction.json"} <= set(names)
    assert "](" not in text


@pytest.mark.e2e
def test_html_is_self_contained_with_the_environment_at_the_top(real_run):
    html = (real_run / "html" / "01_identity_reconstruction.html").read_text()
    data = json.loads((real_run / "results" / "01_identity_reconstruction.json").read_text())
    assert "data:image/png;base64," in html
    assert html_page.external_images(html) == []
    assert not re.search(r"<img[^>]+src=[\"']?(?!data:)[^\"'\s>]", html)
    env_at = html.index("Environment this notebook ran with")
    body = html.index("<body")
    assert body < env_at < html.index("jp-CodeCell", body)  # before the first code cell
    assert body < html.index('id="cell-id=kvkit-verdict"') < env_at, "the verdict and the ask open the page"
    assert data["environment"]["transformers"] in html[env_at: env_at + 4000]
    assert 'id="cell-id=kvkit-environment"' in html, "the environment cell lost its fixed id"
    nb = json.loads((real_run / "notebooks" / "01_identity_reconstruction.ipynb").read_text())
    for cell in nb["cells"]:  # every cell rendered under its own id: a page that drops ids is not the notebook's
        assert f'id="cell-id={cell["id"]}"' in html, cell["id"]
    assert not re.search(r"""\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "loads something remote"
    assert remote_references(html) == [] and "require.js" not in html and "MathJax.js" not in html
    assert "Last run on" not in html  # no typed environment that could contradict the measured one


@pytest.mark.e2e
def test_no_absolute_machine_path_in_shared_outputs(real_run):
    shared = [real_run / "SUMMARY.md", real_run / "run.json", *real_run.glob("results/*.json"),
              *real_run.glob("html/*.html"), *real_run.glob("notebooks/*.ipynb"),
              *[p for p in [real_run / "timings.json"] if p.exists()]]
    assert len(shared) >= 4
    for path in shared:
        assert _machine_paths(path.read_text(), real_run) == [], (path.name, _machine_paths(path.read_text(), real_run))


# --------------------------------------------------------------------------- figures: every bar readable

def _panel_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("log", [False, True])
def test_every_bar_is_labelled_and_fits_its_axis(log):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from helpers import plots

    labels = ["valid split", "orig: generate +mask", "zero", "not run"]
    fig = plots.bar_figure(labels, {"max |diff|": [3.5e-7, 0.45, 0.0, None], "1 - cosine": [-1.19e-7, 0.015, 0.0, float("nan")]},
                           "t", log=log)
    try:
        diff, cos = fig.axes
        assert _panel_labels(diff) == ["3.5e-07", "0.45", "0", "n/a"]
        assert _panel_labels(cos) == ["-1.19e-07", "0.015", "0", "n/a"]
        for ax, top in ((diff, 0.45), (cos, 0.015)):
            low, high = ax.get_ylim()
            assert low <= 0 and high > top  # room above the tallest bar for its label
            assert [lbl.get_text() for lbl in ax.get_xticklabels()] == labels
    finally:
        plt.close(fig)


def test_an_all_zero_panel_says_so_instead_of_showing_an_empty_axis():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from helpers import plots

    fig = plots.bar_figure(["a", "b"], {"max |diff|": [0.0, 0.0]}, "t")
    try:
        ax = fig.axes[0]
        assert ax.get_ylim() == (0.0, 1.0) and list(ax.get_yticks()) == [0]
        assert _panel_labels(ax) == ["every value is 0", "0", "0"]
    finally:
        plt.close(fig)


def test_signed_bars_fit_below_and_above_zero():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from helpers import plots

    fig = plots.bar_figure(["a", "b"], {"m": [-0.3, 0.5]}, "t")
    try:
        low, high = fig.axes[0].get_ylim()
        assert low < -0.3 and high > 0.5
    finally:
        plt.close(fig)


def test_metric_bars_and_line_plot_save_into_figures(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from helpers import plots

    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    bars = plots.metric_bars(["a", "b"], {"m": [0.0, 1.0]}, "t", "01_x", "bars", log=True)
    lines = plots.line_plot([0, 1, 2], {"m": [0.0, 0.1, 0.2]}, "offset", "t", "01_x", "lines", log=True)
    assert bars == tmp_path / "figures" / "01_x-bars.png" and bars.stat().st_size > 0
    assert lines.exists()


@pytest.mark.parametrize("status, says", [("failed", "This run failed**: 1 of 2 notebooks finished ok; the failed notebooks'"),
                                          ("running", "This run has no finish time: it is still running or was killed")])
def test_a_run_that_did_not_complete_says_so_at_the_top(tmp_path, status, says):
    _run(tmp_path, status=status, finished=None,
         notebooks={"01_a": {"status": "ok"}, "02_b": {"status": "failed", "error": "ValueError: bad"}})
    _write_results(tmp_path, "01_a", [_claim("a.one")])
    head = summary.build_summary(tmp_path).split("## Claims")[0]
    assert says in head and "— (not finished)" in head


# --------------------------------------------------------------------------- HTML: nothing remote, widgets static

def test_remote_loaders_are_stripped_and_detected():
    page = ('<head><script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>\n'
            '<link rel="stylesheet" href="https://cdn.example.org/x.css">\n<!-- Load mathjax -->\n'
            '<script src="https://cdn.jsdelivr.net/npm/mathjax@2/MathJax.js?config=TeX-AMS_CHTML-full"> </script>\n'
            '<script type="text/x-mathjax-config">MathJax.Hub.Config({});</script>\n<!-- End of mathjax configuration -->\n'
            '<script type="module">/* inline */</script></head><body><img src="data:image/png;base64,AA"></body>')
    assert len(remote_references(page)) == 3
    clean = html_page.strip_remote(page)
    assert remote_references(clean) == [] and "MathJax" not in clean and "require" not in clean
    assert '<script type="module">/* inline */</script>' in clean and "data:image/png" in clean


def test_widgets_become_a_static_line_and_their_state_is_dropped():
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    cell = nbformat.v4.new_code_cell("display(slider)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "interactive(children=(IntSlider(value=0, description='offset', max=8, min=-8), Output()))",
        html_page.WIDGET_MIME: {"model_id": "abc", "version_major": 2, "version_minor": 0}})]
    nb.cells.append(cell)
    assert html_page.static_widgets(nb) == 1
    data = nb.cells[0].outputs[0]["data"]
    assert data == {"text/plain": "[IntSlider offset = 0 (min -8, max 8): interactive only when the notebook is opened in Jupyter]"}
    assert html_page.widget_value("Output()") == "a widget"
    assert "widgets" not in nb.metadata


def test_the_statements_block_lists_what_does_not_hold_and_groups_the_undecided_by_reason():
    from helpers.pipeline.report.claims_md import statements, undecided

    held = ("01_a", {"id": "a.held", "kind": "reproduces", "verdict": "reproduced", "statement": "S1", "reason": "r1"})
    failed = ("01_a", {"id": "a.failed", "kind": "beyond", "verdict": "fails", "statement": "S2", "reason": "r2"})
    skipped = [("05_b", {"id": f"b.s{i}", "kind": "reproduces", "verdict": "skipped", "statement": f"T{i}",
                         "reason": "needs CUDA"}) for i in range(2)]
    other = ("05_b", {"id": "b.e", "kind": "beyond", "verdict": "error", "statement": "U", "reason": "boom"})
    claims = [held, failed, *skipped, other]
    text = "\n".join(statements(claims, "Statements"))
    assert "the 1 of 5 claims decided otherwise than stated" in text and "a.held" not in text
    assert "- `a.failed` (beyond, fails): S2 _Why:_ r2" in text
    assert "b.s0" not in text and "b.e" not in text  # the undecided are listed once, by `undecided`, grouped by reason
    assert undecided(claims) == ["Not decided in this run:", "", "- `b.s0`, `b.s1` ⏭️ skipped: needs CUDA",
                                 "- `b.e` ⚠️ error: boom", ""]
    assert statements([held, *skipped], "Statements") == []  # nothing decided otherwise: nothing to fold
    assert statements([held], "Statements") == []  # every claim holds: nothing to fold
