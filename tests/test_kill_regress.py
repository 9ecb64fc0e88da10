"""Kill tests for notebook 07's decisions (make mutants: helpers/families/decisions.py), on hand-made cells: each
condition of each decision changed alone flips the verdict. CASES feeds tests/test_decisions.py's registry."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import pytest
import torch

from helpers.compare import NoiseFloor
from helpers.families import checks, decisions
from helpers.families.checks import Cell

FLOOR = NoiseFloor(measured=5e-7, resolution=4e-7, margin=4.0, dtype="float32", scale=1.0, what="kill")


class _Fam:
    def __init__(self) -> None:
        self.full_mask = torch.ones(1, 40)
        self.rows = [torch.ones(12), torch.ones(20)]


def measured(cells: dict[str, Any] | None = None, **extra: Any) -> checks.Measured:
    out = {}
    for check in checks.CHECKS:
        spec = (cells or {}).get(check, "bitwise")
        if isinstance(spec, Cell):
            out[check] = spec
            continue
        status, value = (spec, 0.0 if spec == "bitwise" else None) if isinstance(spec, str) else spec
        out[check] = Cell("f", check, status, value, first_call={"input_ids_shape": [1, 0] if status == "zero_input" else [1, 1]})
    base = {"processed_length": 39, "control_rebuild_seq_length": 15, "original_widths": [15, 39],
            "control_rebuild_lengths": [15, 15], "layer_classes": ["DynamicSlidingWindowLayer", "DynamicLayer"],
            "family_rebuild_state_equal": True, "family_rebuild_lengths": [39, 39], "kernel": "sdpa", "other_kernel": "eager"}
    return checks.Measured(_Fam(), FLOOR, out, {**base, **extra})


RAISED = Cell("f", "control_rebuild·other_kernel", "error", None, detail="RuntimeError (inside the first model call): size")
OK = {"control_rebuild·generate": ("matches", 1e-7), "control_rebuild·forward": ("differs", 0.2),
      "control_rebuild·other_kernel": RAISED, "neither": "zero_input", "position_only": "zero_input",
      "mask_only": ("matches", 1e-7), "config_rebuild·generate": ("differs", 0.07)}
HYB = dict(control_rebuild_error="AttributeError: 'LinearAttentionLayer' object has no attribute 'keys'",
           original_widths=[None, 23], layer_classes=["LinearAttentionLayer", "DynamicLayer"])


def m(**cells: Any) -> checks.Measured:
    return measured({**OK, **{k.replace("__", "·"): v for k, v in cells.items()}})


def hyb(cells: dict[str, Any] | None = None, **extra: Any) -> checks.Measured:
    return measured({**OK, **(cells or {})}, **{**HYB, **extra})


def padded(suffix: tuple[bool, list[float]] = (False, [0.0]), all_ones: tuple[bool, list[float]] = (True, [0.4, 1e-7]),
           pad: tuple[bool, list[float]] = (True, [1e-7, 1e-7])) -> checks.Measured:
    def entry(ok: bool, diffs: list[float]) -> dict[str, Any]:
        return {"ok": ok, "row_max_abs_diff": diffs if ok else None, "first_call": {"input_ids_shape": [2, 1 if ok else 0]},
                "error": "" if ok else "RuntimeError: cannot reshape", "mask_shape": [2, 20],
                "matches": ok and all(FLOOR.matches(d) for d in diffs), "differs": ok and any(FLOOR.differs(d) for d in diffs)}
    out = measured()
    out.extra["padded"] = {"suffix_only": entry(*suffix), "all_ones": entry(*all_ones), "padded": entry(*pad)}
    return out


def contract(**cells: Any) -> checks.Measured:
    return m(**cells)


def flash(*statuses: Any) -> dict[str, checks.Measured]:
    out = {}
    for i, spec in enumerate(statuses):
        cell = Cell("f", "flash_attention_2", spec[0], spec[1], detail=spec[2] if len(spec) > 2 else "")
        out[f"fam{i}"] = measured({"flash_attention_2": cell})
    return out


Case = tuple[str, Callable[[], Any], bool]
CASES: list[Case] = [
    ("sliding hidden: normal", lambda: decisions.decide_sliding_hidden(m()), True),
    ("sliding hidden: generate bitwise", lambda: decisions.decide_sliding_hidden(m(control_rebuild__generate="bitwise")), True),
    ("sliding hidden: generate differs", lambda: decisions.decide_sliding_hidden(m(control_rebuild__generate=("differs", 0.1))), False),
    ("sliding hidden: length not shorter", lambda: decisions.decide_sliding_hidden(
        measured(OK, control_rebuild_seq_length=39)), False),
    ("sliding hidden: one shorter (edge)", lambda: decisions.decide_sliding_hidden(measured(OK, control_rebuild_seq_length=38)), True),
    ("sliding hidden: no length reported", lambda: decisions.decide_sliding_hidden(
        measured(OK, control_rebuild_seq_length=None)), False),
    ("sliding hidden: family state differs", lambda: decisions.decide_sliding_hidden(
        measured(OK, family_rebuild_state_equal=False)), False),
    ("sliding hidden: family state unknown", lambda: decisions.decide_sliding_hidden(
        measured(OK, family_rebuild_state_equal=None)), False),
    ("sliding hidden: family generate only matches", lambda: decisions.decide_sliding_hidden(
        m(family_rebuild__generate=("matches", 1e-7))), False),
    ("sliding hidden: family forward only matches", lambda: decisions.decide_sliding_hidden(
        m(family_rebuild__forward=("matches", 1e-7))), False),
    ("sliding forward: normal", lambda: decisions.decide_sliding_forward(m()), True),
    ("sliding forward: matches", lambda: decisions.decide_sliding_forward(m(control_rebuild__forward=("matches", 1e-7))), False),
    ("sliding forward: differs without a value", lambda: decisions.decide_sliding_forward(m(control_rebuild__forward="differs")), False),
    ("sliding forward: family forward differs", lambda: decisions.decide_sliding_forward(
        m(family_rebuild__forward=("differs", 0.1))), False),
    ("backends: sdpa matches, eager raises inside", lambda: decisions.decide_sliding_backends(m()), True),
    ("backends: sdpa bitwise", lambda: decisions.decide_sliding_backends(m(control_rebuild__generate="bitwise")), True),
    ("backends: sdpa differs", lambda: decisions.decide_sliding_backends(m(control_rebuild__generate=("differs", 0.1))), False),
    ("backends: eager matched", lambda: decisions.decide_sliding_backends(m(control_rebuild__other_kernel="bitwise")), False),
    ("backends: eager raised before the call", lambda: decisions.decide_sliding_backends(
        m(control_rebuild__other_kernel=replace(RAISED, detail="RuntimeError (before the first model call): x"))), False),
    ("backends: eager status other than error", lambda: decisions.decide_sliding_backends(
        m(control_rebuild__other_kernel=replace(RAISED, status="zero_input"))), False),
    ("backends: run with eager, columns swap", lambda: decisions.decide_sliding_backends(measured(
        {**OK, "control_rebuild·generate": replace(RAISED, check="control_rebuild·generate"),
         "control_rebuild·other_kernel": ("matches", 1e-7)}, kernel="eager", other_kernel="sdpa")), True),
    ("backends: no eager column", lambda: decisions.decide_sliding_backends(measured(OK, other_kernel="flash_attention_2")), False),
    ("backends: no sdpa column", lambda: decisions.decide_sliding_backends(measured(OK, kernel="flash_attention_2")), False),
    ("hybrid: normal", lambda: decisions.decide_hybrid(hyb()), True),
    ("hybrid: attention-only errors", lambda: decisions.decide_hybrid(hyb({"config_rebuild·generate": "error"})), True),
    ("hybrid: attention-only gets zero input", lambda: decisions.decide_hybrid(hyb({"config_rebuild·generate": "zero_input"})), True),
    ("hybrid: attention-only matches", lambda: decisions.decide_hybrid(hyb({"config_rebuild·generate": ("matches", 1e-7)})), False),
    ("hybrid: the rebuild worked", lambda: decisions.decide_hybrid(hyb(control_rebuild_error=None)), False),
    ("hybrid: another error", lambda: decisions.decide_hybrid(hyb(control_rebuild_error="TypeError: x AttributeError")), False),
    ("hybrid: no layer without K/V", lambda: decisions.decide_hybrid(hyb(original_widths=[23, 23])), False),
    ("hybrid: family rebuild not bitwise", lambda: decisions.decide_hybrid(hyb({"family_rebuild·generate": ("differs", 0.1)})), False),
    ("padded: normal", lambda: decisions.decide_padded(padded()), True),
    ("padded: suffix-only runs but differs", lambda: decisions.decide_padded(padded(suffix=(True, [0.3, 1e-7]))), True),
    ("padded: suffix-only matched", lambda: decisions.decide_padded(padded(suffix=(True, [1e-7, 1e-7]))), False),
    ("padded: all-ones matched", lambda: decisions.decide_padded(padded(all_ones=(True, [1e-7, 1e-7]))), False),
    ("padded: all-ones errors", lambda: decisions.decide_padded(padded(all_ones=(False, []))), True),
    ("padded: padded mask differs", lambda: decisions.decide_padded(padded(pad=(True, [0.3, 1e-7]))), False),
    ("padded: padded mask errors", lambda: decisions.decide_padded(padded(pad=(False, []))), False),
    ("contract: every family", lambda: decisions.decide_mask_contract({"a": contract(), "b": contract()}), True),
    ("contract: position_only got its token", lambda: decisions.decide_mask_contract(
        {"a": contract(), "b": contract(position_only=("matches", 1e-7))}), False),
    ("contract: neither got its token", lambda: decisions.decide_mask_contract({"a": contract(neither=("matches", 1e-7))}), False),
    ("contract: mask_only bitwise", lambda: decisions.decide_mask_contract({"a": contract(mask_only="bitwise")}), True),
    ("contract: mask_only differs", lambda: decisions.decide_mask_contract({"a": contract(mask_only=("differs", 0.1))}), False),
    ("contract: mask_only got two tokens", lambda: decisions.decide_mask_contract({"a": contract(
        mask_only=Cell("f", "mask_only", "matches", 1e-7, first_call={"input_ids_shape": [1, 2]}))}), False),
    ("contract: mask_only shape unknown", lambda: decisions.decide_mask_contract({"a": contract(
        mask_only=Cell("f", "mask_only", "matches", 1e-7))}), False),
    ("contract: no family", lambda: decisions.decide_mask_contract({}), False),
    ("flash: matches", lambda: decisions.decide_flash(flash(("matches", 1e-3), ("bitwise", 0.0))), True),
    ("flash: one family differs", lambda: decisions.decide_flash(flash(("matches", 1e-3), ("differs", 0.3))), False),
    ("flash: one skipped, one ran", lambda: decisions.decide_flash(flash(("skipped", None, "no CUDA"), ("matches", 1e-3))), False),
    ("flash: skipped everywhere", lambda: decisions.decide_flash(flash(("skipped", None, "no CUDA"), ("skipped", None, "x"))), False),
]


def _holds(out: Any) -> bool | None:
    d = out[0] if isinstance(out, tuple) else out
    return None if d is None else d.holds


@pytest.mark.parametrize("name,thunk,expected", CASES, ids=[c[0] for c in CASES])
def test_regress_decisions(name, thunk, expected):
    out = thunk()
    assert bool(_holds(out)) is expected, name


def test_flash_without_a_run_says_why():
    assert decisions.decide_flash(flash(("skipped", None, "needs CUDA"), ("skipped", None, "x"))) == (None, "needs CUDA")
    assert decisions.decide_flash({}) == (None, "no family ran")
    d, why = decisions.decide_flash(flash(("matches", 1e-3)))
    assert why == "" and d.deciding == {"fam0": 1e-3} and d.evidence["fam0"]["status"] == "matches"


def test_the_deciding_values():
    d = decisions.decide_sliding_hidden(m(control_rebuild__generate="error"))
    assert d.deciding == {"control_rebuild_get_seq_length": 15, "processed_length": 39,
                          "generate_full_mask_vs_original": "error", "noise_threshold": FLOOR.threshold}
    d = decisions.decide_sliding_backends(measured(OK, other_kernel="flash_attention_2"))
    assert d.deciding["eager"] == "not run" and d.evidence["eager_detail"] == "" and "eager not run" in d.why
    d = decisions.decide_hybrid(hyb())
    assert d.evidence["linear_layers"] == [0] and d.deciding["control_rebuild"].startswith("AttributeError")
    d = decisions.decide_padded(padded(pad=(False, [])))
    assert d.deciding == {"suffix_only_row_max_abs_diff": "error", "all_ones_row_max_abs_diff": [0.4, 1e-7],
                          "padded_row_max_abs_diff": "error", "noise_threshold": FLOOR.threshold}
    assert d.evidence["row_lengths"] == [12, 20]
    d = decisions.decide_mask_contract({"a": contract(), "b": contract(neither="bitwise")})
    assert d.evidence["not_holding"] == ["b"] and d.why == "does not hold in: ['b']"
    assert d.evidence["first_call_input_ids_shape"]["a"] == {"neither": [1, 0], "position_only": [1, 0], "mask_only": [1, 1]}
