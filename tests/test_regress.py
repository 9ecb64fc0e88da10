"""Notebook 07: the family-aware rebuilds (bitwise per family), the padded-mask construction, and every
decision function fed a measurement that contradicts its claim."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from helpers import models

from kvresume import compat
from helpers.compare import NoiseFloor
from helpers.families import checks, decisions, rebuilds, setup
from kvresume import layers
from helpers.families.checks import Cell, against_outcome, zero_input
from helpers.continuation import Outcome

FLOOR = NoiseFloor(measured=5e-7, resolution=4e-7, margin=4.0, dtype="float32", scale=1.0, what="hand-made")


@pytest.fixture(scope="module")
def sliding() -> setup.Family:
    return setup.text_family("sliding", models.load(models.TINY_SLIDING), 40, 0)


@pytest.fixture(scope="module")
def hybrid() -> setup.Family:
    return setup.text_family("hybrid", models.load(models.TINY_HYBRID), 12, 0)


@pytest.fixture(scope="module")
def dense() -> models.ModelBundle:
    return models.load(models.TINY_DENSE)


def _prefix(family: setup.Family):
    with torch.no_grad():
        return compat.output_cache(family.model(**family.prefill_kwargs(), use_cache=True))


def _next_logits(family: setup.Family, cache) -> torch.Tensor:
    with torch.no_grad():
        out = family.model(input_ids=family.suffix, attention_mask=family.full_mask, past_key_values=copy.deepcopy(cache), use_cache=True)
    return out.logits[:, -1]


@pytest.mark.parametrize("name", ["sliding", "hybrid", "dense"])
def test_family_rebuild_is_bitwise_identity(name, sliding, hybrid, dense):
    family = {"sliding": sliding, "hybrid": hybrid, "dense": setup.text_family("dense", dense, 12, 0)}[name]
    cache = _prefix(family)
    rebuilt = rebuilds.family_rebuild(cache, family.model.config)
    assert layers.cache_state_equal(cache, rebuilt)
    assert [type(l) for l in rebuilt.layers] == [type(l) for l in cache.layers]
    assert torch.equal(_next_logits(family, cache), _next_logits(family, rebuilt))


def test_control_rebuild_loses_sliding_length_and_cannot_read_linear_layers(sliding, hybrid):
    cache = _prefix(sliding)
    assert cache.get_seq_length() == 39 and layers.widths(cache)[0] == models.SLIDING_WINDOW - 1
    assert rebuilds.control_rebuild(cache).get_seq_length() == models.SLIDING_WINDOW - 1
    with pytest.raises(AttributeError, match="keys"):
        rebuilds.control_rebuild(_prefix(hybrid))
    partial = rebuilds.attention_only_rebuild(_prefix(hybrid), hybrid.model.config)
    assert not layers.cache_state_equal(_prefix(hybrid), partial)


def test_left_pad_and_mask_positions():
    ids, mask = setup.left_pad([torch.tensor([5, 6]), torch.tensor([7, 8, 9, 10])], pad_id=0)
    assert ids.tolist() == [[0, 0, 5, 6], [7, 8, 9, 10]]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert setup.mask_positions(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    masks = checks.resume_masks(mask)
    assert masks["suffix_only"].shape == (2, 1) and masks["all_ones"].sum() == 8 and torch.equal(masks["padded"], mask)


def test_padded_prefill_matches_unpadded_rows(dense):
    family = setup.padded_family(dense, (5, 9), 0)
    ref = setup.reference(family)  # each row unpadded
    run = checks.Runner(family)
    step = run.generate(run.cache, attention_mask=family.full_mask)
    assert step.ok and step.logits.shape[0] == 2 and max(checks.row_diffs(ref, step.logits)) < 1e-5


def test_cells_zero_input_and_both_error():
    a = Outcome(False, first_call={"input_ids_shape": [1, 0]}, error_type="RuntimeError")
    b = Outcome(False, first_call={"input_ids_shape": [1, 0]}, error_type="RuntimeError")
    assert zero_input(a) and against_outcome("f", "c", a, b, FLOOR, "").status == "zero_input"
    ok = Outcome(True, logits=torch.zeros(1, 4))
    assert against_outcome("f", "c", ok, ok, FLOOR, "").status == "bitwise"
    assert against_outcome("f", "c", Outcome(True, logits=torch.ones(1, 4)), ok, FLOOR, "").status == "differs"


# --- decision functions, each against a contradicting measurement ------------------------------------

class _Fam:
    def __init__(self, rows=()):
        self.full_mask = torch.ones(1, 40)
        self.rows = list(rows)


def measured(cells: dict[str, str | tuple[str, float]], **extra) -> checks.Measured:
    out = {}
    for check in checks.CHECKS:
        spec = cells.get(check, "bitwise")
        status, value = (spec, 0.0 if spec == "bitwise" else None) if isinstance(spec, str) else spec
        shape = [1, 0] if status == "zero_input" else [1, 1]
        out[check] = Cell("f", check, status, value, first_call={"input_ids_shape": shape})
    base = {"processed_length": 39, "control_rebuild_seq_length": 15, "original_widths": [15, 39],
            "layer_classes": ["DynamicSlidingWindowLayer", "DynamicLayer"], "family_rebuild_state_equal": True,
            "family_rebuild_lengths": [39, 39], "kernel": "sdpa", "other_kernel": "eager"}
    return checks.Measured(_Fam(), FLOOR, out, {**base, **extra})


SLIDING_OK = {"control_rebuild·forward": ("differs", 0.2), "neither": "zero_input", "position_only": "zero_input",
              "mask_only": ("matches", 1e-7)}


def test_sliding_hidden_decision():
    assert decisions.decide_sliding_hidden(measured(SLIDING_OK)).holds
    assert not decisions.decide_sliding_hidden(measured(SLIDING_OK, control_rebuild_seq_length=39)).holds  # no shorter length
    assert not decisions.decide_sliding_hidden(measured({**SLIDING_OK, "control_rebuild·generate": ("differs", 0.1)})).holds
    assert not decisions.decide_sliding_hidden(measured(SLIDING_OK, family_rebuild_state_equal=False)).holds


def test_sliding_forward_decision():
    assert decisions.decide_sliding_forward(measured(SLIDING_OK)).holds
    assert not decisions.decide_sliding_forward(measured({**SLIDING_OK, "control_rebuild·forward": ("matches", 1e-7)})).holds
    assert not decisions.decide_sliding_forward(measured({**SLIDING_OK, "family_rebuild·forward": ("differs", 0.1)})).holds


def test_sliding_kernel_decision():
    raised = Cell("f", "control_rebuild·other_kernel", "error", None, detail="RuntimeError (inside the first model call): size")
    m = measured(SLIDING_OK)
    m.cells["control_rebuild·other_kernel"] = raised
    assert decisions.decide_sliding_backends(m).holds
    m.cells["control_rebuild·other_kernel"] = Cell("f", "c", "bitwise", 0.0)  # eager matched too
    assert not decisions.decide_sliding_backends(m).holds
    m.cells["control_rebuild·other_kernel"] = replace(raised, detail="RuntimeError (before the first model call): x")
    assert not decisions.decide_sliding_backends(m).holds  # raised, but not inside the model call
    swapped = measured({**SLIDING_OK, "control_rebuild·generate": "error"}, kernel="eager", other_kernel="sdpa")
    swapped.cells["control_rebuild·generate"] = replace(raised, check="control_rebuild·generate")
    assert decisions.decide_sliding_backends(swapped).holds  # run with eager: the kernels swap columns


def test_hybrid_decision():
    hyb = dict(control_rebuild_error="AttributeError: 'LinearAttentionLayer' object has no attribute 'keys'",
               original_widths=[None, 23], layer_classes=["LinearAttentionLayer", "DynamicLayer"])
    partial = {"config_rebuild·generate": ("differs", 0.07)}
    assert decisions.decide_hybrid(measured(partial, **hyb)).holds
    assert not decisions.decide_hybrid(measured({"config_rebuild·generate": ("matches", 1e-7)}, **hyb)).holds  # state not needed
    assert not decisions.decide_hybrid(measured(partial, **{**hyb, "control_rebuild_error": None})).holds  # the rebuild worked
    assert not decisions.decide_hybrid(measured(partial, **{**hyb, "original_widths": [23, 23]})).holds  # no layer without K/V


def _padded(suffix_ok: bool, all_ones: list[float], padded: list[float]) -> checks.Measured:
    def entry(ok, diffs):
        return {"ok": ok, "row_max_abs_diff": diffs if ok else None, "first_call": {"input_ids_shape": [2, 1 if ok else 0]},
                "error": "" if ok else "RuntimeError: ...", "mask_shape": [2, 20],
                "matches": ok and all(FLOOR.matches(d) for d in diffs), "differs": ok and any(FLOOR.differs(d) for d in diffs)}
    m = measured({})
    m.family.rows = [torch.ones(12), torch.ones(20)]
    m.extra["padded"] = {"suffix_only": entry(suffix_ok, [1e-7, 1e-7]), "all_ones": entry(True, all_ones), "padded": entry(True, padded)}
    return m


def test_padded_decision():
    assert decisions.decide_padded(_padded(False, [0.4, 1e-7], [1e-7, 1e-7])).holds
    assert not decisions.decide_padded(_padded(True, [0.4, 1e-7], [1e-7, 1e-7])).holds  # suffix-only mask matched
    assert not decisions.decide_padded(_padded(False, [1e-7, 1e-7], [1e-7, 1e-7])).holds  # all-ones matched
    assert not decisions.decide_padded(_padded(False, [0.4, 1e-7], [0.3, 1e-7])).holds  # padded mask differs


def test_mask_contract_decision():
    good = measured({"neither": "zero_input", "position_only": "zero_input", "mask_only": ("matches", 1e-7)})
    bad = measured({"neither": "zero_input", "position_only": ("matches", 1e-7), "mask_only": ("matches", 1e-7)})
    assert decisions.decide_mask_contract({"a": good, "b": good}).holds
    decision = decisions.decide_mask_contract({"a": good, "b": bad})
    assert not decision.holds and decision.evidence["not_holding"] == ["b"]


def test_flash_decision_skips_without_cuda_and_decides_with_it():
    skipped = measured({"flash_attention_2": "skipped"})
    skipped.cells["flash_attention_2"] = replace(skipped.cells["flash_attention_2"], detail="needs CUDA")
    decision, why = decisions.decide_flash({"a": skipped})
    assert decision is None and why == "needs CUDA"
    ran = decisions.decide_flash({"a": measured({"flash_attention_2": ("differs", 0.3)})})[0]
    assert ran is not None and not ran.holds
    assert not checks.flash_status("cpu")[0]


def test_backend_switch_runs_and_restores(dense):
    """The path the FlashAttention-2 column takes on CUDA, run here with eager as the stand-in kernel."""
    family = setup.text_family("dense", dense, 8, 0)
    run = checks.Runner(family)
    step = run.with_backend("eager", run.cache)
    assert step.ok and dense.model.config._attn_implementation == "sdpa"


def test_flash_status_names_each_missing_piece(monkeypatch):
    import importlib.util

    assert "needs CUDA" in checks.flash_status("cpu")[1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    assert checks.flash_status("cuda", "float16") == (False, "the flash_attn package is not installed")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    ok, why = checks.flash_status("cuda", "float32")
    assert not ok and "float16 or bfloat16" in why
    assert checks.flash_status("cuda", "bfloat16") == (True, "")


class _LinearLayer:
    """A stand-in linear-attention layer: conv/recurrent states, and a token count where `count` is given."""

    def __init__(self, count: int | None) -> None:
        self.conv_states, self.recurrent_states = {0: torch.ones(1, 2, 4)}, {0: torch.ones(1, 2, 2)}
        if count is not None:
            setattr(self, compat.LINEAR_LENGTH_ATTR, torch.tensor(count))


def test_carry_linear_length_sets_the_count_where_the_release_keeps_one():
    target = _LinearLayer(4)  # 5.25.0+: update_conv_state of a 4-wide conv state counted 4 tokens
    assert compat.carry_linear_length(target, _LinearLayer(23)) and int(target.cumulative_length_linear) == 23
    assert compat.carry_linear_length(target, 7) and int(target.cumulative_length_linear) == 7
    older = _LinearLayer(None)  # releases before 5.25.0 keep no count: nothing to carry
    assert not compat.carry_linear_length(older, 23) and not hasattr(older, compat.LINEAR_LENGTH_ATTR)
    assert not compat.carry_linear_length(_LinearLayer(4), _LinearLayer(None))


def test_layer_state_equal_sees_a_linear_count_that_differs():
    a, b = _LinearLayer(23), _LinearLayer(4)  # same states, counts 23 vs 4: the 5.25.0 rebuild that lost its count
    assert not layers.layer_state_equal(a, b)
    b.cumulative_length_linear.fill_(23)
    assert layers.layer_state_equal(a, b)
