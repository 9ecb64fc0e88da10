"""Claim kinds: each kind gives its own verdict words, and only `reproduces` can read "reproduced"."""
from __future__ import annotations

import json

import pytest

from helpers.results import DECIDED, KINDS, Results, verdict_for


@pytest.mark.parametrize("kind, holds, expected", [
    ("reproduces", True, "reproduced"), ("reproduces", False, "not_reproduced"),
    ("refutes", True, "refuted"), ("refutes", False, "not_refuted"),
    ("beyond", True, "holds"), ("beyond", False, "fails"),
    ("simulation", True, "holds"), ("simulation", False, "fails"),
    ("environment", True, "holds"), ("environment", False, "fails"),
])
def test_verdict_words_per_kind(kind, holds, expected):
    assert verdict_for(kind, holds) == expected


def test_only_the_reproduces_kind_can_read_reproduced():
    assert [k for k in KINDS if "reproduced" in KINDS[k]] == ["reproduces"]
    assert set(DECIDED) == {"reproduced", "not_reproduced", "refuted", "not_refuted", "holds", "fails"}


def test_kinds_are_stored_and_decided_per_claim(tmp_path):
    res = Results("00_x", {"a": "stated", "b": "hypothesis", "c": "machine"}, env={}, path=tmp_path / "r.json",
                  environment_checks=("c",), kinds={"b": "refutes"})
    res.decide("a", False, {}), res.decide("b", True, {}), res.decide("c", True, {})
    claims = {c["id"]: c for c in json.loads((tmp_path / "r.json").read_text())["claims"]}
    assert [(claims[k]["kind"], claims[k]["verdict"]) for k in "abc"] == [
        ("reproduces", "not_reproduced"), ("refutes", "refuted"), ("environment", "holds")]


def test_an_unknown_kind_or_an_undeclared_claim_is_refused_before_any_measurement(tmp_path):
    with pytest.raises(ValueError, match="unknown claim kind 'finding'"):
        Results("00_x", {"a": "s"}, env={}, path=tmp_path / "r.json", kinds={"a": "finding"})
    with pytest.raises(KeyError, match="undeclared"):
        Results("00_x", {"a": "s"}, env={}, path=tmp_path / "r.json", kinds={"zz": "beyond"})
