"""Notebook 04's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, passage

_SCALE = ("the size 7.65625: raw logit differences scale with the model (the tiny model's largest |logit| is below 1); "
          "decided is 'beyond the noise floor', and the cosine and top-1 as claims of their own")

FINDING = Finding(
    stem="04_token_boundary_double_processing",
    title="Token boundary: a valid split versus processing the last token twice",
    source="control",
    claims={
        "boundary.valid_split_matches_full_forward": passage(CONTROL, "states", "cache(prompt[:-1]) + prompt[-1] → valid split continuation"),
        "boundary.double_processing_diverges": passage(CONTROL, "states", "Re-feeding the already cached token produced: max absolute "
                                                       "logit difference: 7.65625", not_decided=_SCALE),
        "boundary.double_processing_cosine": passage(CONTROL, "states", "cosine similarity: 0.8698"),
        "boundary.double_processing_top1_changed": passage(CONTROL, "states", "top-1 token: changed"),
        "boundary.rebuilt_cache_same_as_original": passage(CONTROL, "states", "It happened with both the original cache and the rebuilt cache."),
        "boundary.mask_and_positions_do_not_restore": passage(CONTROL, "states", "Supplying a full attention mask and explicit positions did "
                                                              "not restore the original result."),
    },
    bisect="boundary.double_processing_diverges",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/boundary/decisions.py", ("decide_*", "_worked", "_smallest"), "tests/test_decisions.py",
                       ("tests/test_boundary_claims.py",)),),
    estimate_s=5.0,
    summary=('Re-feeding a token that is already cached processes it twice; `cache(prompt[:-1]) + prompt[-1]` is the '
             'valid split.'),
    models="`tiny-qwen3-vl` (text-only LMs too)",
    needs="CPU",
)
