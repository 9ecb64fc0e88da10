"""helpers/api: the validated factory (every family, every refusal), the resume guard (each rule raises on its
case and passes the working call), guarded_generate (generate() unchanged, nothing patched), the upstream file."""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import models
from helpers.api import (FactoryError, ResumeInputError, check_resume_inputs, export_tensors, guarded_generate,
                         kv_cache_from_tensors)
from helpers.api import experiments
from helpers.continuation import greedy_config
from helpers.regress import checks, families, layers, rebuilds


@pytest.fixture(scope="module")
def runs() -> dict[str, checks.Runner]:
    dense = models.load(models.TINY_DENSE)
    others = {"multimodal": models.load(models.TINY_VL), "sliding": models.load(models.TINY_SLIDING),
              "hybrid": models.load(models.TINY_HYBRID)}
    fams = families.build_all(dense, others, 24, 40, (12, 20), 0)
    return {name: checks.Runner(f) for name, f in fams.items()}


def test_factory_round_trip_is_bitwise_on_every_family(runs):
    trips = experiments.factory_round_trips(runs)
    assert set(trips) == set(families.FAMILIES)
    assert all(t["state_equal"] and t["seq_length"][0] == t["seq_length"][1] for t in trips.values()), trips
    assert trips["sliding"]["seq_length"] == [39, 39] and trips["sliding"]["widths"][0] < 39
    assert trips["hybrid"]["linear_layers"] == [0, 1, 2, 4, 5, 6]


def test_factory_returns_transformers_own_dynamic_cache(runs):
    from transformers import DynamicCache

    pairs, states, n = export_tensors(runs["sliding"].cache)
    cache = kv_cache_from_tensors(pairs, runs["sliding"].family.model.config, processed_length=n)
    assert type(cache) is DynamicCache
    assert [type(l).__name__ for l in cache.layers][:2] == ["DynamicSlidingWindowLayer", "DynamicLayer"]


def test_every_malformed_input_is_refused_naming_its_mismatch(runs):
    rows = experiments.refusals(runs)
    assert len(rows) >= 10
    bad = [r for r in rows if not (r["refused"] and r["names_mismatch"])]
    assert not bad, bad


def test_a_refusal_names_the_first_mismatch_only(runs):
    pairs, _, _ = export_tensors(runs["dense"].cache)
    k, v = pairs[2]
    with pytest.raises(FactoryError, match=r"^layer 2: dtype"):
        kv_cache_from_tensors([pairs[0], pairs[1], (k.half(), v.half()), (k.half()[:1], v.half())], runs["dense"].family.model.config)


def test_processed_length_below_the_slots_is_refused_and_at_them_accepted(runs):
    pairs, _, n = export_tensors(runs["dense"].cache)
    config = runs["dense"].family.model.config
    with pytest.raises(FactoryError, match="processed_length 22 is smaller"):
        kv_cache_from_tensors(pairs, config, processed_length=n - 1)
    assert kv_cache_from_tensors(pairs, config, processed_length=n).get_seq_length() == n


# --- the guard -----------------------------------------------------------------------------------

def _dense(runs):
    run = runs["dense"]
    return run, run.cache, run.family.suffix, run.family.full_mask, run.family.processed_length


def test_the_working_resume_passes(runs):
    run, cache, suffix, mask, n = _dense(runs)
    check_resume_inputs(cache, suffix, mask, None, n)
    check_resume_inputs(cache, suffix, mask, torch.tensor([[n]]), n)
    check_resume_inputs(cache, run.family.prompt.input_ids, run.family.prompt.attention_mask)  # whole sequence + its mask
    check_resume_inputs(None, suffix)  # nothing cached: nothing to check


@pytest.mark.parametrize("case,match", [
    ("suffix_mask", "covers only the suffix"), ("no_mask", "no attention_mask"), ("position_only", "no attention_mask"),
    ("already_cached", "already holds"), ("wrong_positions", "position_ids start at"), ("short_mask", "has 10 columns"),
    ("empty_input", "input_ids is empty"),
])
def test_each_silent_case_raises_saying_what_to_pass(runs, case, match):
    run, cache, suffix, mask, n = _dense(runs)
    args = {"suffix_mask": (suffix, mask[:, -1:], None, n), "no_mask": (suffix, None, None, n),
            "position_only": (suffix, None, torch.tensor([[n]]), n), "already_cached": (suffix, mask, None, n - 1),
            "wrong_positions": (suffix, mask, torch.tensor([[n + 1]]), n), "short_mask": (suffix, mask[:, :10], None, n),
            "empty_input": (suffix[:, :0], mask, None, n)}[case]
    with pytest.raises(ResumeInputError, match=match):
        check_resume_inputs(cache, *args)


def test_the_messages_say_exactly_what_to_pass(runs):
    run, cache, suffix, mask, n = _dense(runs)  # 23 cached tokens, one suffix token
    cases = [((suffix, None, None, n), r"input_ids 1; .* slices off its first 23 tokens, .* Pass attention_mask with 24 columns"),
             ((suffix, mask[:, -1:], None, n), r"covers only the suffix \(1 columns\) while the cache holds 23 tokens: "
                                                r"pass the full mask of 24 columns"),
             ((suffix, mask[:, :22], None, n), r"has 22 columns; .* needs 24 \(cached \+ suffix\)"),
             ((suffix, mask, None, n - 2), r"already holds 23 tokens but processed_length is 21: the first 2 suffix token\(s\) "
                                           r".* after position 22 \(or a cache of the first 21 tokens\)"),
             ((suffix, mask, torch.tensor([[n + 1]]), n), r"start at \[24\] .* follows 23 processed tokens \(expected \[23\]\)"),
             ((suffix[:, :0], mask, None, n), r"^input_ids is empty: pass the unprocessed suffix \(at least one token\)$")]
    for args, match in cases:
        with pytest.raises(ResumeInputError, match=match):
            check_resume_inputs(cache, *args)


def test_the_boundaries_of_the_whole_sequence_form(runs):
    run, cache, suffix, mask, n = _dense(runs)
    ids = run.family.prompt.input_ids  # 24 tokens: the 23 cached + the suffix
    check_resume_inputs(cache, ids, None, None, n)  # whole sequence, no mask: generate() slices the suffix itself
    check_resume_inputs(cache, ids, None, torch.arange(24).view(1, -1), n)  # ... with its own positions
    with pytest.raises(ResumeInputError, match="position_ids start at"):
        check_resume_inputs(cache, ids, None, torch.arange(1, 25).view(1, -1), n)
    with pytest.raises(ResumeInputError, match="no attention_mask"):
        check_resume_inputs(cache, ids[:, :23], None, None, n)  # exactly the cached length: nothing left to feed
    with pytest.raises(ResumeInputError, match="covers only the suffix"):
        check_resume_inputs(cache, ids[:, :23], mask[:, :23], None, n)
    check_resume_inputs(cache, ids, mask, None, n)  # whole sequence with its whole mask
    with pytest.raises(ResumeInputError, match="has 22 columns"):
        check_resume_inputs(cache, suffix, mask[:, :22], None, None)
    check_resume_inputs(cache, suffix, mask, torch.tensor([[n]]), None)  # no processed length: the cache's


def test_an_empty_cache_is_not_checked():
    from transformers import DynamicCache

    check_resume_inputs(DynamicCache(), torch.ones(1, 1, dtype=torch.long))


def test_a_compressed_cache_needs_positions_at_the_processed_length(runs):
    run, cache, suffix, _, n = _dense(runs)
    pairs, _, _ = export_tensors(cache)
    short = kv_cache_from_tensors([(k[:, :, -8:], v[:, :, -8:]) for k, v in pairs], run.family.model.config, processed_length=n)
    mask = torch.ones(1, 9, dtype=torch.long)
    with pytest.raises(ResumeInputError, match="accounts for 8 cached columns but 23 tokens were processed, so generate\\(\\) "
                                               "places the suffix at position 8; pass position_ids starting at 23"):
        check_resume_inputs(short, suffix, mask, None, n)
    check_resume_inputs(short, suffix, mask, torch.tensor([[n]]), n)


def test_padded_rows_positions_are_checked_per_row(runs):
    run = runs["padded_batch"]
    fam = run.family
    check_resume_inputs(run.cache, fam.suffix, fam.full_mask, fam.current_positions(), fam.processed_length)
    with pytest.raises(ResumeInputError, match="position_ids start at"):
        check_resume_inputs(run.cache, fam.suffix, fam.full_mask, torch.full((2, 1), fam.processed_length), fam.processed_length)


def test_a_padded_batch_with_per_row_lengths_refuses_an_all_ones_mask(runs):
    run = runs["padded_batch"]
    fam = run.family
    rows = [int(r.numel()) - 1 for r in fam.rows]
    check_resume_inputs(run.cache, fam.suffix, fam.full_mask, None, rows)
    with pytest.raises(ResumeInputError, match=r"marks \[19, 19\] cached tokens per row but the rows processed \[11, 19\]"):
        check_resume_inputs(run.cache, fam.suffix, torch.ones_like(fam.full_mask), None, rows)
    check_resume_inputs(run.cache, fam.suffix, torch.ones_like(fam.full_mask), None, fam.processed_length)  # one int: not visible


def test_multimodal_positions_are_read_less_rope_deltas(runs):
    run = runs["multimodal"]
    fam, deltas = run.family, run.state
    positions = fam.current_positions()
    check_resume_inputs(run.cache, fam.suffix, fam.full_mask, positions, fam.processed_length, rope_deltas=deltas)
    for bad in (positions - deltas.view(1, -1, 1), positions + torch.tensor([0, 1, 0]).view(3, 1, 1)):
        with pytest.raises(ResumeInputError, match="position_ids start at"):  # any of the three M-RoPE rows
            check_resume_inputs(run.cache, fam.suffix, fam.full_mask, bad, fam.processed_length, rope_deltas=deltas)
    check_resume_inputs(run.cache, fam.suffix, fam.full_mask, positions + 5, fam.processed_length)  # no deltas: not checkable


def test_a_hybrid_cache_without_linear_state_raises_and_with_it_passes(runs):
    run = runs["hybrid"]
    fam = run.family
    bare = rebuilds.attention_only_rebuild(run.cache, fam.model.config)
    with pytest.raises(ResumeInputError, match=r"^layer 0 \(linear attention\) holds no conv/recurrent state while the "
                                               r"attention layers hold 23 tokens"):
        check_resume_inputs(bare, fam.suffix, fam.full_mask, None, fam.processed_length)
    check_resume_inputs(run.cache, fam.suffix, fam.full_mask, None, fam.processed_length)


def test_a_sliding_update_rebuild_with_the_full_mask_passes(runs):
    """07: the control's rebuild of a slid window reports the window, yet generate() with the full mask matches."""
    run = runs["sliding"]
    fam = run.family
    ctrl = rebuilds.control_rebuild(run.cache)
    assert ctrl.get_seq_length() < fam.processed_length and max(layers.lengths(ctrl)) == fam.processed_length
    check_resume_inputs(ctrl, fam.suffix, fam.full_mask, None, fam.processed_length)


def test_guarded_generate_is_generate_unchanged_and_patches_nothing(runs):
    from transformers import GenerationMixin

    run, cache, suffix, mask, n = _dense(runs)
    model = run.family.model
    before = type(model).generate
    kwargs = {"input_ids": suffix, "attention_mask": mask, "generation_config": greedy_config(model)}
    plain = model.generate(past_key_values=copy.deepcopy(cache), **kwargs)
    guarded = guarded_generate(model, n, past_key_values=copy.deepcopy(cache), **kwargs)
    assert torch.equal(plain.logits[0], guarded.logits[0])
    assert type(model).generate is before and GenerationMixin.generate is before
    with pytest.raises(ResumeInputError):
        guarded_generate(model, n, past_key_values=copy.deepcopy(cache), input_ids=suffix)


# --- the upstream file ---------------------------------------------------------------------------

def test_the_upstream_file_is_standalone_and_marks_measured_failures():
    import re

    from helpers.api import upstream

    text = upstream.render({"5.14.1": {"arg_set[dense-neither]": ["raises", "RuntimeError: cannot reshape"]}, "5.24.0": {}})
    imports = re.findall(r"^(?:from|import) ([\w.]+)", text, flags=re.M)
    assert set(imports) <= {"__future__", "copy", "functools", "inspect", "typing", "torch", "transformers", "pytest"}, imports
    assert "from ." not in text and "/work" not in text
    ns: dict = {}
    exec(compile(text, "test_resume_equivalence.py", "exec"), ns)
    assert ns["expected_failure"]("arg_set[dense-neither]", "5.14.1") == (
        True, "measured on transformers 5.14.1: raises (RuntimeError: cannot reshape)")
    assert ns["expected_failure"]("arg_set[dense-neither]", "5.24.0") is None  # measured there: it must match
    assert ns["expected_failure"]("arg_set[dense-neither]", "9.9.9")[0] is False  # not measured: not strict
    assert ns["expected_failure"]("backend[sdpa]", "5.14.1") is None
    assert len(ns["CASES"]) == 23
