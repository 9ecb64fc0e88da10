"""Kill tests for the noise floor, the comparisons and the claim kinds (make mutants: helpers/compare.py,
helpers/results.py): each condition has a case where changing it alone changes the answer."""
from __future__ import annotations

import math

import pytest
import torch

from helpers import compare, results
from helpers.compare import NoiseFloor

FLOOR = NoiseFloor(measured=1e-3, resolution=5e-4, margin=4.0, dtype="float16", scale=2.0, what="pair")


def test_the_floor_is_the_larger_of_measured_and_resolution():
    assert FLOOR.floor == 1e-3 and FLOOR.threshold == 4e-3
    low = NoiseFloor(measured=1e-4, resolution=5e-4, margin=4.0, dtype="float16", scale=2.0)
    assert low.floor == 5e-4 and low.threshold == pytest.approx(2e-3)
    assert NoiseFloor(1e-3, 1e-3, 2.5, "float32", 1.0).threshold == pytest.approx(2.5e-3)


def test_matches_and_differs_on_both_sides_of_the_threshold():
    t = FLOOR.threshold
    below, above = t * (1 - 1e-9), t * (1 + 1e-9)
    assert FLOOR.matches(below) and FLOOR.matches(t) and not FLOOR.matches(above)
    assert not FLOOR.differs(below) and not FLOOR.differs(t) and FLOOR.differs(above)
    assert FLOOR.matches(0.0) and FLOOR.matches(-1.0) and not FLOOR.differs(0.0)
    for missing in (None, float("nan"), float("inf")):  # a missing measurement is neither
        assert not FLOOR.matches(missing) and not FLOOR.differs(missing)
    zero = NoiseFloor(0.0, 0.0, 4.0, "float32", 0.0)
    assert zero.matches(0.0) and not zero.differs(1.0) and not zero.differs(1e-30)
    negative = NoiseFloor(-1.0, -1.0, 4.0, "float32", 0.0)  # a threshold below 0 is not a floor either
    assert not negative.differs(0.5)


def test_the_evidence_names_every_number_of_the_floor():
    ev = FLOOR.evidence(0.01)
    assert ev == {"noise_floor": 1e-3, "noise_measured": 1e-3, "noise_resolution": 5e-4, "noise_margin": 4.0,
                  "noise_threshold": 4e-3, "noise_dtype": "float16", "noise_scale": 2.0, "noise_from": "pair",
                  "value": 0.01, "value_over_threshold": pytest.approx(2.5)}
    assert "value" not in FLOOR.evidence() and "value_over_threshold" not in FLOOR.evidence(None)
    assert FLOOR.evidence(0.0)["value"] == 0.0 and FLOOR.evidence(0.0)["value_over_threshold"] == 0.0
    tiny = NoiseFloor(0.5, 0.5, 1.0, "float32", 1.0)  # threshold 0.5: a ratio below 1 stays a ratio
    assert tiny.evidence(0.25)["value_over_threshold"] == 0.5
    zero = NoiseFloor(0.0, 0.0, 4.0, "float32", 0.0).evidence(1.0)
    assert zero["value"] == 1.0 and zero["value_over_threshold"] is None


def test_dtype_eps_and_ulp():
    assert compare.dtype_eps(torch.float16) == 2 ** -10 and compare.dtype_eps(torch.bfloat16) == 2 ** -7
    assert compare.dtype_eps(torch.int64) == 2 ** -23 and compare.dtype_eps(torch.int8) == 2 ** -23
    assert compare.ulp(1.0, torch.float16) == 2 ** -10 and compare.ulp(0.93, torch.float16) == 2 ** -11
    assert compare.ulp(3.0, torch.float16) == 2 ** -9 and compare.ulp(-3.0, torch.float16) == 2 ** -9
    assert compare.ulp(0.0, torch.float32) == 0.0 and compare.ulp(float("inf"), torch.float32) == 0.0
    assert compare.ulp(float("nan"), torch.float32) == 0.0 and compare.ulp(None, torch.float32) == 0.0


def test_noise_floor_from_agreeing_tensors():
    ref = torch.tensor([0.5, -3.0, 0.1], dtype=torch.float16)
    a, b = ref.clone(), ref.clone()
    a[0] += 2 ** -8
    b[1] -= 2 ** -5
    f = compare.noise_floor(ref, [a, b], torch.float16, margin=3.0, what="two repeats")
    assert f.measured == pytest.approx(2 ** -5) and f.scale == 3.0 and f.resolution == 2 ** -9
    assert f.margin == 3.0 and f.dtype == "float16" and f.what == "two repeats"
    single = compare.noise_floor(ref, a.reshape(1, 3), torch.float16)  # one tensor, another shape of the same values
    assert single.measured == pytest.approx(2 ** -8) and single.margin == compare.DEFAULT_MARGIN and single.what == ""
    none = compare.noise_floor(ref, [], torch.bfloat16)
    assert none.measured == 0.0 and none.resolution == 2 ** -6 and none.dtype == "bfloat16"
    empty = compare.noise_floor(torch.zeros(0), [], torch.float32)
    assert empty.scale == 0.0 and empty.resolution == 0.0 and empty.measured == 0.0


def test_max_abs_diff_and_bitwise_equality():
    a = torch.tensor([[1.0, 2.0]])
    assert compare.max_abs_diff(a, torch.tensor([1.0, 2.5])) == 0.5
    assert compare.max_abs_diff(a, torch.tensor([1.0, 1.25], dtype=torch.float16)) == 0.75
    assert compare.tensors_bitwise_equal(None, None) and not compare.tensors_bitwise_equal(a, None)
    assert not compare.tensors_bitwise_equal(None, a) and compare.tensors_bitwise_equal(a, a.clone())
    assert not compare.tensors_bitwise_equal(a, a.reshape(2)) and not compare.tensors_bitwise_equal(a, a.half())
    assert not compare.tensors_bitwise_equal(a, a + 1e-7)


def test_logit_metrics_of_one_and_of_a_batch():
    ref = torch.tensor([[[0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.1, 0.9, 0.2, 0.3, 0.4, 0.5]]])  # batch 1, 2 positions
    oth = torch.tensor([[[9.0] * 6, [0.1, 0.2, 0.95, 0.3, 0.4, 0.5]]])
    m = compare.logit_metrics(ref, oth, k=2)
    assert m["max_abs_diff"] == pytest.approx(0.75) and m["top1_reference"] == 1 and m["top1"] == 2
    assert m["top1_equal"] is False and m["top2_overlap"] == 1 and m["bitwise_equal"] is False
    assert m["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(ref[0, -1], oth[0, -1], dim=0)))
    same = compare.logit_metrics(ref, ref.clone())
    assert same["bitwise_equal"] is True and same["top1_equal"] is True and same["top5_overlap"] == 5
    assert same["max_abs_diff"] == 0.0 and same["cosine"] == pytest.approx(1.0)
    batch = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    other = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    b = compare.logit_metrics(batch, other, k=1)
    assert b["top1_reference"] == [0, 1] and b["top1"] == [0, 2] and b["top1_equal"] is False
    assert b["cosine"] == pytest.approx(0.0) and b["top1_overlap"] == 0 and b["max_abs_diff"] == 1.0
    with pytest.raises(ValueError, match="logit shapes differ"):
        compare.logit_metrics(batch, batch[:1])


def test_last_logits():
    x = torch.arange(12.0).reshape(1, 3, 4)
    assert compare.last_logits(x).tolist() == [8.0, 9.0, 10.0, 11.0]
    y = torch.arange(24.0).reshape(2, 3, 4)
    assert compare.last_logits(y).shape == (2, 4) and compare.last_logits(y)[1].tolist() == [20.0, 21.0, 22.0, 23.0]
    assert compare.last_logits(torch.ones(1, 5, dtype=torch.float16)).dtype == torch.float32
    assert compare.last_logits(torch.ones(1, 5)).shape == (5,) and compare.last_logits(torch.ones(3, 5)).shape == (3, 5)


# --- results.py: kinds and verdict words -------------------------------------------------------------

@pytest.mark.parametrize("kind,holds,word", [
    ("reproduces", True, "reproduced"), ("reproduces", False, "not_reproduced"), ("refutes", True, "refuted"),
    ("refutes", False, "not_refuted"), ("beyond", True, "holds"), ("simulation", False, "fails"),
    ("environment", True, "holds"), ("environment", False, "fails")])
def test_verdict_for_each_kind_and_side(kind, holds, word):
    assert results.verdict_for(kind, holds) == word


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown claim kind 'reproduce'; valid: \['beyond', 'environment'"):
        results.verdict_for("reproduce", True)
    assert results.DECIDED == ("reproduced", "not_reproduced", "refuted", "not_refuted", "holds", "fails")
    assert results.VERDICTS[-2:] == ("skipped", "error")


def _results(tmp_path, **kw) -> results.Results:
    return results.Results("nb", {"a": "A", "b": "B", "e": "E"}, env={"x": 1}, path=tmp_path / "r.json", **kw)


def test_results_kinds_and_decisions(tmp_path):
    r = _results(tmp_path, environment_checks=("e",), kinds={"b": "refutes"})
    assert [c.kind for c in r.claims.values()] == ["reproduces", "refutes", "environment"]
    assert all(c.verdict == "error" for c in r.claims.values())
    assert r.decide("a", True, {"v": 1.0}) == "reproduced" and r.claims["a"].reason == "the measurement matches the statement"
    assert r.decide("b", 0, {}, "because") == "not_refuted" and r.claims["b"].reason == "because"
    assert r.decide("e", False, {}) == "fails" and r.claims["e"].reason == "the measurement contradicts the statement"
    saved = results.load(tmp_path / "r.json")
    assert [c["verdict"] for c in saved["claims"]] == ["reproduced", "not_refuted", "fails"]
    assert saved["claims"][0]["evidence"] == {"v": 1.0}
    with pytest.raises(KeyError, match="kinds given for undeclared claims"):
        _results(tmp_path, kinds={"zz": "beyond"})
    with pytest.raises(ValueError, match="unknown claim kind"):
        _results(tmp_path, kinds={"a": "nonsense"})
    with pytest.raises(KeyError, match="unknown claim 'q'"):
        r.decide("q", True, {})


def test_record_skip_and_guard(tmp_path):
    r = _results(tmp_path, kinds={"b": "beyond"})
    d = compare.Decision(False, "why not", {"e": 1}, {"d": 2}, {"s": 3}, notes=["n1"])
    assert r.record("a", d) == "not_reproduced"
    a = r.claims["a"]
    assert (a.reason, a.evidence, a.deciding, a.source, a.notes) == ("why not", {"e": 1}, {"d": 2}, {"s": 3}, ["n1"])
    assert r.skip("b", "no CUDA", {"device": "cpu"}) == "skipped"
    assert (r.claims["b"].reason, r.claims["b"].evidence) == ("no CUDA", {"device": "cpu"})
    assert r.skip("e", "later") == "skipped" and r.claims["e"].evidence == {}
    r2 = _results(tmp_path)
    r2.decide("a", True, {})
    with r2.guard("a", "b"):
        raise RuntimeError("boom")
    assert r2.claims["a"].verdict == "reproduced", "a decided claim keeps its verdict"
    assert r2.claims["b"].verdict == "error" and r2.claims["b"].reason == "RuntimeError: boom"
    r3 = _results(tmp_path)
    r3.skip("a", "no GPU")
    with r3.guard("a"):
        raise RuntimeError("late")
    assert r3.claims["a"].verdict == "skipped" and math.isfinite(len(r3.claims))


def test_a_results_file_names_its_notebook_statements_run_and_place(tmp_path, monkeypatch):
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    monkeypatch.setenv("KVKIT_RUN_ID", "20261203T000000Z-kill")
    monkeypatch.setattr(results, "environment", lambda: {"measured": True})
    r = results.Results("07_x", {"a": "the statement"})
    assert r.notebook == "07_x" and r.env == {"measured": True} and r.claims["a"].statement == "the statement"
    assert r.path == tmp_path / "results" / "07_x.json" and r.run["run_id"] == "20261203T000000Z-kill"
    saved = results.load(r.path)
    assert saved["notebook"] == "07_x" and saved["measurements"] == {} and saved["warnings"] == []
    assert saved["run"]["run_id"] == "20261203T000000Z-kill" and saved["claims"][0]["statement"] == "the statement"
    given = results.Results("07_x", {"a": "s"}, env={"given": 1}, path=tmp_path / "g.json")
    assert given.env == {"given": 1}, "a given environment is kept, not measured again"
    r.add("table", [1, 2])
    r.warn("a  warning\n")
    r.warn("a warning")
    assert results.load(r.path)["measurements"] == {"table": [1, 2]} and results.load(r.path)["warnings"] == ["a warning"]


def test_record_takes_the_decisions_verdict_and_works_without_notes(tmp_path):
    from types import SimpleNamespace

    r = _results(tmp_path)
    assert r.record("a", SimpleNamespace(holds=True, evidence={}, why="w", deciding={}, source={})) == "reproduced"
    assert r.claims["a"].notes == [] and r.claims["a"].reason == "w"
