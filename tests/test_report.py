"""outputs/SUMMARY.md and the self-contained HTML renderings: unit checks on synthetic results,
and one end-to-end check on a real papermill run of notebook 01."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.pipeline import report, runner


def _write_results(out: Path, notebook: str, claims: list[dict], env: dict | None = None) -> None:
    env = {"python": "3.11", "torch": "2.13.0", "transformers": "5.17.0", "device": "cpu", "dtype": "float32",
           "model_id": "tiny", "model_revision": "r1", **(env or {})}
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{notebook}.json").write_text(json.dumps(
        {"notebook": notebook, "environment": env, "claims": claims, "measurements": {}}))


def _claim(cid: str, verdict: str = "reproduced", **evidence) -> dict:
    return {"id": cid, "statement": f"statement of {cid}", "verdict": verdict, "reason": "why", "evidence": evidence}


def test_key_numbers_prefers_numeric_and_bool_scalars():
    ev = {"variants": ["a", "b"], "comparisons": 6, "max_abs_diff": 0.0, "bitwise": True}
    assert report.key_numbers(ev) == "comparisons=6; max_abs_diff=0"
    assert report.key_numbers({"eq": {"a": True, "b": False}}) == "eq=1/2 true"
    assert report.key_numbers({"n": [4, 4, 4]}) == "n=4 (×3)"
    assert report.key_numbers({"d": 1.23456e-7}) == "d=1.23e-07"
    assert report.key_numbers({"result": "failed"}) == "result=failed"
    assert report.key_numbers({}) == "" and report.key_numbers(None) == ""


def test_summary_table_environment_once_and_per_notebook_model(tmp_path):
    _write_results(tmp_path, "01_a", [_claim("a.one", comparisons=3), _claim("a.two", "not_reproduced", diff=0.5)])
    _write_results(tmp_path, "02_b", [_claim("b.one", "skipped")], env={"model_id": "other", "model_revision": "r2"})
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "01_a-plot.png").write_bytes(b"\x89PNG")
    text = report.build_summary(tmp_path)
    for cid in ("a.one", "a.two", "b.one"):
        assert f"`{cid}`" in text
    assert "| 01_a | `a.two` | ❌ not_reproduced | diff=0.5 |" in text
    assert text.count("| torch | `2.13.0` |") == 1
    assert "Differs between notebooks" in text and "| 02_b | `other` | `r2` |" in text
    assert "| model_id | `" not in text  # not in the shared block
    assert "![01_a-plot](figures/01_a-plot.png)" in text


def test_summary_is_truncated_under_the_limit(tmp_path):
    claims = [_claim(f"c.{i}", note="x" * 300, n=i) for i in range(400)]
    _write_results(tmp_path, "01_big", claims)
    text = report.build_summary(tmp_path)
    assert len(text) < report.MAX_CHARS
    assert "**Truncated:**" in text


def test_external_images_are_detected():
    html = '<img src="data:image/png;base64,AAAA"><img alt=x src="figures/a.png"><img src=\'b.png\'>'
    assert report.external_images(html) == ["figures/a.png", "b.png"]


def test_notebook_selection():
    assert [p.stem for p in runner.select(None)] == [p.stem for p in runner.notebooks()]
    assert [p.stem for p in runner.select(["01"])] == ["01_identity_reconstruction"]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-run")
    mp = pytest.MonkeyPatch()
    mp.setenv("KVKIT_OUTPUT_DIR", str(out))
    try:
        res = runner.run_one(runner.find_notebook("01"))
        assert res.ok, res.error
        assert runner.write_outputs()
    finally:
        mp.undo()
    return out


@pytest.mark.e2e
def test_report_on_a_real_run(real_run):
    text = (real_run / "SUMMARY.md").read_text()
    data = json.loads((real_run / "results" / "01_identity_reconstruction.json").read_text())
    assert data["claims"]
    for claim in data["claims"]:
        assert f"`{claim['id']}`" in text and claim["verdict"] in text
    assert len(text) < report.MAX_CHARS
    assert data["environment"]["transformers"] in text and data["environment"]["model_id"] in text
    for fig in (real_run / "figures").glob("*.png"):
        assert f"(figures/{fig.name})" in text
    assert "(html/01_identity_reconstruction.html)" in text


@pytest.mark.e2e
def test_html_is_self_contained(real_run):
    html = (real_run / "html" / "01_identity_reconstruction.html").read_text()
    assert "data:image/png;base64," in html
    assert report.external_images(html) == []
    assert not re.search(r"<img[^>]+src=[\"']?(?!data:)[^\"'\s>]", html)
