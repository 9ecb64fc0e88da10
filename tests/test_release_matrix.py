"""The release matrix: matrix.md from synthetic per-release results, and end to end on one
non-pinned release (notebook 01 only; .venv-tf/<release> is built once and then reused)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.pipeline import release_matrix as rm

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
    text = rm.build_matrix(tmp_path, ["1.0", "2.0", "3.0"])
    assert "pip could not install transformers==3.0" in text
    flip = next(line for line in text.splitlines() if "`c.flip`" in line and line.startswith("|"))
    same = next(line for line in text.splitlines() if "`c.same`" in line and line.startswith("|"))
    assert "**Δ**" in flip and "not installed" in flip and "**Δ**" not in same
    assert "`measurements.rows[0,1].mask`" in text and "`null`" in text
    assert "measurements.same" not in text and "environment.transformers" not in text


def test_flatten_and_distinct_texts():
    assert rm.flatten({"a": {"b": 1}, "l": [{"x": 2}], "v": [1, 2]}) == {"a.b": 1, "l[0].x": 2, "v": [1, 2]}
    assert rm.distinct_texts([1.0, 0.99999994]) != ["1", "1"]


def test_unusable_release_gets_a_reason_without_touching_pip():
    env = rm.ensure_env("not-a-release")
    assert not env.ok and "not a version" in env.reason


@pytest.mark.e2e
def test_matrix_end_to_end_on_a_non_pinned_release(tmp_path):
    assert OTHER_RELEASE != rm.pinned_release()
    path, infos = rm.run_matrix([OTHER_RELEASE, "nope"], notebooks=["01_identity_reconstruction"], out_base=tmp_path)
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
