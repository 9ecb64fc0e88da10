"""Notebook 06's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, IDENTITY_15, LENGTHS_35168, passage

_KILL = "tests/test_kill_tree.py"
_TREE = tuple(f"tests/test_triage.py::test_{t}" for t in (  # the tree's tests, not the notebook runs
    "every_leaf_is_reached", "each_leaf_fed_a_contradicting_table_moves", "leaf_cases_cover_every_leaf",
    "a_repaired_leaf_is_named_only_when_its_repair_restores", "the_floor_decides_not_a_fixed_number",
    "a_failure_only_for_the_rebuilt_cache_is_not_the_contract",
    "compression_is_evicted_slots_by_content_not_a_different_reported_length",
    "slot_decisions_each_with_a_contradicting_twin", "a_prefix_short_cache_is_not_compression_when_its_refeed_restores",
    "compression_is_split_by_the_continue_at_processed_length_repair",
    "loss_leaves_show_what_remains_against_the_identity_floor", "every_leaf_says_what_to_do_next",
    "render_marks_the_taken_path_and_lists_the_repairs",
    "retained_length_claim_and_its_contradictions", "per_layer_claim_outcomes_and_contradictions",
    "per_layer_backend_prediction_and_its_contradictions"))

FINDING = Finding(
    stem="06_rebuild_triage",
    title="Triage any cache rebuild with the resume-contract decision tree",
    source="triage",
    claims={
        "triage.identity_matches_original": passage(CONTROL, "states", IDENTITY_15),
        "triage.streaming_generate_uses_retained_length": passage(CONTROL, "extends", "If tokens are evicted, retained K/V slot count may "
                                                                  "differ from total processed length."),
        "triage.per_layer_lengths_outcome": passage(CONTROL, "extends", "If different layers retain different tokens, per-layer lengths "
                                                    "may diverge."),
        "triage.per_layer_lengths_by_backend": passage(CONTROL, "extends", LENGTHS_35168),
    },
    bisect="triage.identity_matches_original",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(
        Decisions("helpers/triage/tree.py", ("decide_*", "per_layer_outcome", "backend_outcome"), _KILL, _TREE),
        Decisions("helpers/triage/walk.py", ("choose_branch", "_compression_leaf", "notes", "_Walk.*"), _KILL, _TREE),
        Decisions("helpers/triage/facts.py", ("consistent", "identical", "metadata_differs", "model_state_differs", "slot_kind",
                                              "slot_verdict", "slot_layers", "Repair.*"), _KILL, _TREE)),
    estimate_s=7.0,
    summary=("The control's decision tree as a triage tool for any cache rebuild (`-p rebuild file.py:function`), on "
             'any cache family and your own input.'),
    models="`tiny-qwen3-vl` (`tiny-qwen3-sliding`, `tiny-qwen3.5-hybrid`, text-only LMs too)",
    needs="CPU",
)
