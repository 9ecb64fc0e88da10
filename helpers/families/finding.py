"""Notebook 07's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, HYBRID, LENGTHS_35168, SLICED, passage

_SLIDING = ("Other cache layer types can have different semantics—for example, sliding layers may track cumulative "
            "processed length separately")

FINDING = Finding(
    stem="07_regression_families",
    title="The control's regression list across cache families: sliding-window, hybrid, left-padded batches",
    source="control",
    claims={
        "regress.sliding_rebuild_hidden_by_full_mask": passage(CONTROL, "extends", _SLIDING),
        "regress.sliding_rebuild_breaks_direct_forward": passage(CONTROL, "extends", _SLIDING),
        "regress.sliding_rebuild_depends_on_kernel": passage(CONTROL, "extends", LENGTHS_35168),
        "regress.hybrid_update_rebuild_drops_linear_state": passage(CONTROL, "extends", HYBRID),
        "regress.left_padded_resume_needs_padded_mask": passage(CONTROL, "extends", "Issue #40833 showed a different silent-output problem "
                                                                "where left-padded cached batches attended to padding because the cache "
                                                                "mask was incomplete."),
        "regress.mask_contract_holds_across_families": passage(CONTROL, "states", SLICED, cites="matrix.neither_fails"),
        "regress.flash_attention_2_matches_sdpa": passage(CONTROL, "extends", "- eager, SDPA, and FlashAttention where applicable;"),
    },
    bisect="regress.mask_contract_holds_across_families",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/families/decisions.py", ("*",), "tests/test_kill_regress.py"),),
    estimate_s=9.0,
    summary=("The control's regression list as one table across cache families (dense, Qwen3-VL, sliding-window, "
             "hybrid, left-padded batch): the control's rebuild, the same into `DynamicCache(config=...)` and the "
             'family-aware identity, each resumed with `generate()` and with a direct forward.'),
    models="`tiny-qwen3`, `tiny-qwen3-vl`, `tiny-qwen3-sliding`, `tiny-qwen3.5-hybrid`",
    needs="CPU; FlashAttention-2 column: CUDA + `flash_attn`",
)
