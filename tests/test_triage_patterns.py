"""Notebook 06's resume patterns, cache classes, the examples' evictions and the refusals of bad pattern values."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, StaticCache

from helpers import models
from helpers.pipeline.paths import repo_root
from helpers.pipeline.run import params
from helpers.triage import pattern_checks, patterns, rebuilds
from helpers.triage import run as triage_run
from inprocess import run_one  # tests/ is on sys.path

ROOT = repo_root()
NB = ROOT / "notebooks" / "06_rebuild_triage.ipynb"
EXAMPLE = "examples/my_rebuild.py"


def triaged(bundle, prompt, pattern: str, cache_class: str = "dynamic", rebuild: str = "streaming", more: dict | None = None):
    case = patterns.build(bundle, prompt, pattern, cache_class, {})
    base = triage_run.prepare(bundle, case)
    specs = triage_run.load_specs(rebuild, 4, 16) | (more or {})
    return base, triage_run.triage_all(base, triage_run.apply_all(base, specs))


def branches(results) -> dict[str, str]:
    return {name: t.verdict["branch"] for name, t in results.items()}


def test_the_notebook_declares_the_patterns_and_cache_classes_the_code_knows():
    choices = params.declared_choices(NB)
    assert choices["pattern"] == patterns.PATTERNS and choices["cache_class"] == patterns.CACHE_CLASSES
    assert choices["resume_on"] == ("same_instance", "fresh_instance")


def test_the_examples_eviction_and_its_resume_state(bundle, prompt):
    """keep first 8 + last 16 as a user writes it: positions and loss; the same eviction with its processed length: loss only."""
    more = {n: rebuilds.load(f"{EXAMPLE}:{n}") for n in ("keep_first_last", "keep_first_last_resume")}
    base, results = triaged(bundle, prompt, "one_token", more=more)
    assert branches(results) == {"identity": "no_defect", "streaming": "compression_positions_and_loss",
                                 "keep_first_last": "compression_positions_and_loss",
                                 "keep_first_last_resume": "compression_information_loss"}
    plain, resumed = results["keep_first_last"].controls, results["keep_first_last_resume"].controls
    assert plain.rebuilt_lengths == [24] * 4 and plain.extra["generate_args"] == "mask_only"
    assert plain.extra["generate_position"] - plain.extra["logical_position"] == 24 - 81  # the retained length
    assert resumed.extra["generate_position"] == resumed.extra["logical_position"]  # positions passed: processed length
    assert base.floor.differs(plain.extra["explicit_vs_generate"]) and base.floor.matches(resumed.extra["explicit_vs_generate"])
    assert plain.extra["explicit_vs_full_forward"] == resumed.extra["explicit_vs_full_forward"]  # the same loss


def test_a_resume_state_is_what_makes_generate_continue_at_the_processed_length(bundle, prompt, prefix_cache):
    out = rebuilds.apply(rebuilds.load(f"{EXAMPLE}:keep_first_last_resume"), "r", prefix_cache, bundle.model, prompt)
    assert out.resume and out.processed_length == 81
    stream = rebuilds.apply(rebuilds.load("streaming"), "streaming", prefix_cache, bundle.model, prompt)
    assert not stream.resume and stream.processed_length == 81  # the built-in says its kept positions, nothing more
    assert not rebuilds.as_rebuilt({"past_key_values": prefix_cache}).resume


@pytest.mark.parametrize("pattern", ["new_turn", "continue_generate", "prompt_reuse", "batched"])
def test_every_pattern_names_a_leaf_on_the_tiny_default(bundle, prompt, pattern):
    base, results = triaged(bundle, prompt, pattern)
    assert branches(results) == {"identity": "no_defect", "streaming": "compression_positions_and_loss"}
    facts = patterns.facts(base.case)
    assert facts["pattern"] == pattern and facts["prefix_cache_length"] == facts["processed_length"]
    working = pattern_checks.working_sets(base)
    assert working.loc["mask_only", "suffix_reached_model"] and not working.loc["neither", "suffix_reached_model"]
    e = results["streaming"].controls.extra
    assert e["generate_position"] - e["logical_position"] == 20 - base.prompt.processed


def test_new_turn_feeds_the_whole_second_turn(bundle, prompt):
    case = patterns.build(bundle, prompt, "new_turn", "dynamic", {})
    assert case.resume.processed == prompt.length and case.resume.last_token.shape[1] == case.notes["second_turn_tokens"] > 1
    base = triage_run.prepare(bundle, case)
    assert base.original["mask_only"].call["input_ids_shape"] == [1, case.notes["second_turn_tokens"]]


def test_continue_generate_measures_what_the_returned_cache_holds(bundle, prompt):
    base, results = triaged(bundle, prompt, "continue_generate", rebuild="identity")
    notes = base.case.notes
    assert notes["sequences_length"] == prompt.length + patterns.FIRST_NEW_TOKENS
    assert notes["returned_cache_lacks_last_token"] and notes["returned_cache_length"] == notes["sequences_length"] - 1
    rows = {(r["cache"], r["call"][:3]): r for r in pattern_checks.continue_rows(base, results)}
    threads = rows[("original", "all")]
    assert threads["input_ids_shape"] == [1, 1] and threads["matches_own_full_forward"]  # generate slices to the last token


def test_prompt_reuse_needs_a_copy_per_suffix(bundle, prompt):
    base, results = triaged(bundle, prompt, "prompt_reuse", rebuild="identity")
    rows = {(r["cache"], r["call"]): r for r in pattern_checks.reuse_rows(base, results)}
    for cache in ("original", "identity"):
        assert rows[(cache, "suffix A, deep copy")]["matches_own_full_forward"]
        assert rows[(cache, "suffix B, deep copy")]["matches_own_full_forward"]
        reused = rows[(cache, "suffix B after A on the same object (no deepcopy)")]
        assert not reused["matches_own_full_forward"] and reused["past_length"] == prompt.length  # A's token left in it


def test_batched_rows_are_left_padded_and_positions_follow_the_mask(bundle, prompt):
    base, results = triaged(bundle, prompt, "batched", rebuild="identity")
    r = base.case.resume
    assert r.input_ids.shape[0] == 2 and r.attention_mask[1, 0] == 0 and r.attention_mask[:, -1].tolist() == [1, 1]
    assert base.floor.matches(triage_run.diff(base.original["mask_only"], triage_run.Step(True, base.reference)))
    assert patterns.mask_positions(torch.tensor([[0, 0, 1, 1]])).tolist() == [[1, 1, 0, 1]]


def test_a_static_cache_is_rebuilt_as_a_static_cache(bundle, prompt):
    base, results = triaged(bundle, prompt, "one_token", "static")
    assert isinstance(base.prefix_cache, StaticCache) and int(base.prefix_cache.get_seq_length()) == prompt.length - 1
    assert isinstance(results["streaming"].rebuilt.cache, StaticCache)
    assert branches(results) == {"identity": "no_defect", "streaming": "compression_positions_and_loss"}
    dynamic = patterns.as_dynamic(base.prefix_cache, bundle.model.config)
    assert isinstance(dynamic, DynamicCache) and dynamic.get_seq_length() == prompt.length - 1


@pytest.mark.parametrize("pattern", ["one_token", "new_turn", "continue_generate", "prompt_reuse", "batched"])
def test_patterns_on_a_text_only_model(pattern):
    from helpers import inputs

    bundle = models.load(models.TINY_DENSE)
    _, results = triaged(bundle, inputs.build_prompt(bundle), pattern)
    assert branches(results) == {"identity": "no_defect", "streaming": "compression_positions_and_loss"}


def test_unknown_patterns_and_cache_classes_raise():
    with pytest.raises(ValueError, match="valid: one_token, new_turn, continue_generate, prompt_reuse, batched and dynamic, static"):
        patterns.build(None, None, "sideways", "dynamic", {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="valid: dynamic, static"):
        patterns.new_cache("paged", None, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("args,words", [
    (["-p", "pattern", "sideways"], ["unknown pattern 'sideways'", "one_token, new_turn, continue_generate, prompt_reuse, batched"]),
    (["-p", "cache_class", "paged"], ["unknown cache_class 'paged'", "valid: dynamic, static"]),
], ids=["pattern", "cache_class"])
def test_bad_pattern_values_are_refused_in_one_line_before_any_kernel(tmp_path, args, words):
    env = {**os.environ, "KVKIT_OUTPUT_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "helpers.pipeline.run", "run", "06", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("refused: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "notebooks").exists()


@pytest.mark.e2e
# Through the notebook: one pattern with its own checks on a dynamic cache, one without on a static cache; every
# pattern's leaf and working sets are tested on the functions above (test_every_pattern_names_a_leaf_on_the_tiny_default).
@pytest.mark.parametrize("pattern,cache_class", [("prompt_reuse", "dynamic"), ("one_token", "static")])
def test_notebook_06_runs_each_pattern(tmp_path, monkeypatch, pattern, cache_class):
    monkeypatch.setenv("KVKIT_OUTPUT_DIR", str(tmp_path))
    result = run_one(NB, {"pattern": pattern, "cache_class": cache_class, "rebuild": "streaming"})
    assert result.ok, result.error
    data = json.loads((tmp_path / "results" / "06_rebuild_triage.json").read_text())
    m = data["measurements"]
    assert {n: v["branch"] for n, v in m["triage"].items()} == {"identity": "no_defect",
                                                                 "streaming": "compression_positions_and_loss"}
    assert m["triage_parameters"]["pattern"] == pattern and m["triage_parameters"]["cache_class"] == cache_class
    assert m["triage_parameters"]["prompt"]["source"] == "synthetic" and m["triage_parameters"]["prompt"]["sequence_ids"]
    assert m["pattern"]["pattern"] == pattern and m["pattern_working_sets"]
    assert ("pattern_checks" in m) == (pattern in pattern_checks.CHECKS)
    assert str(ROOT) not in (tmp_path / "results" / "06_rebuild_triage.json").read_text()
