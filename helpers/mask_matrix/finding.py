"""Notebook 02's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, SLICED, passage

FINDING = Finding(
    stem="02_mask_position_matrix",
    title="Mask/position matrix: what reaches the first model call when `generate()` resumes from a cache",
    source="control",
    claims={
        "matrix.neither_fails": passage(CONTROL, "states", "Without the full mask Input supplied to generate(): past cache length: 81 "
                                        "input suffix length: 1 First model call: input_ids shape: [1, 0] attention_mask shape: [1, 1] "
                                        "past cache length: 81"),
        "matrix.position_only_fails": passage(CONTROL, "states", "The same thing happened: input_ids shape: [1, 0] attention_mask shape: "
                                              "[1, 1] position_ids: explicitly supplied past cache length: 81"),
        "matrix.mask_only_works": passage(CONTROL, "states", "input_ids shape: [1, 1] attention_mask shape: [1, 82] past cache length: 81 "
                                          "position for current token: inferred as 81 Generation succeeded.",
                                          not_decided="the inferred position 81 is not read out; the first-step logits matching the "
                                                      "full forward within the noise floor imply it"),
        "matrix.both_matches_mask_only": passage(CONTROL, "states", "This also succeeded, but it did not show an additional recovery over "
                                                 "mask_only in this control."),
        "matrix.first_call_drops_suffix": passage(CONTROL, "states", SLICED, cites="matrix.neither_fails"),
        "matrix.forward_needs_positions": passage(CONTROL, "states", "A direct forward() with a full-length mask but no explicitly sliced "
                                                  "current-token 3D position IDs produced a shape mismatch, whereas generate() prepared "
                                                  "the current-token positions correctly."),
    },
    bisect="matrix.neither_fails",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/mask_matrix/decisions.py", ("decide_*", "_dropped", "_unique", "_first_calls", "_one"), "tests/test_decisions.py"),),
    estimate_s=5.0,
    summary=('With a non-empty cache and a one-token suffix, `generate()` needs a full-length attention mask: '
             '`neither` / `position_only` / `mask_only` / `both`, with what reached the first model call for each.'),
    models="`tiny-qwen3-vl` (text-only LMs too)",
    needs="CPU",
)
