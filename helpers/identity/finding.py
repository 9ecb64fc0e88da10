"""Notebook 01's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import Decisions, Finding
from ..quotes import CONTROL, IDENTITY_15, passage

FINDING = Finding(
    stem="01_identity_reconstruction",
    title="Identity reconstruction of a Qwen3-VL prefix cache",
    source="control",
    claims={
        "identity.cache_metadata_match": passage(CONTROL, "states", "In the tested version, all four variants had: - 28 initialized "
                                                 "layers; DynamicLayer for all 28 layers;- reported cache length 81; - identical K/V shapes;",
                                                 not_decided="28 layers: the tiny model has 4; the match is decided per layer"),
        "identity.kv_bitwise_equal": passage(CONTROL, "states", "- identical K/V shapes; - bitwise-identical K/V values."),
        "identity.first_step_logits_equal": passage(CONTROL, "states", IDENTITY_15,
                                                    not_decided="the count 15: the source gives no breakdown; this run counts its own"),
    },
    bisect="identity.first_step_logits_equal",
    functions=("transformers.cache_utils.DynamicCache.__init__", "transformers.cache_utils.Cache.update"),
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/identity/decisions.py", ("decide_*", "_rebuilt"), "tests/test_decisions.py"),),
    estimate_s=5.0,
    summary=('A cache rebuilt from the original K/V (an `update()` loop, `DynamicCache(config=...)`, the tensor-data '
             "constructor) continues exactly like the original: the control's identity check."),
    models="`tiny-qwen3-vl`",
    needs="CPU",
)
