"""Notebook 03's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import GENERATE, Decisions, Finding
from ..quotes import CONTROL, passage

FINDING = Finding(
    stem="03_rope_deltas_perturbation",
    title="Qwen3-VL's multimodal position state lives outside the K/V tensors",
    source="control",
    claims={
        "rope.state_outside_kv": passage(CONTROL, "states", "The tested prefix prefill produced: rope_deltas = -42",
                                         by_construction="the prompt sets -42: its image's grid fixes how far the text positions "
                                                         "run behind the token count; the kit builds the prompt to give the same value"),
        "rope.none_equals_zero": passage(CONTROL, "states", "The None and zero cases were identical in this control"),
        "rope.missing_state_diverges_more_than_off_by_one": passage(
            CONTROL, "states", "rope_deltas = None | 17.1328 | 0.30597 | The | rope_deltas = 0 | 17.1328 | 0.30597 | The | "
            "| Correct value + 1 | 1.21875 | 0.99833 | left |",
            not_decided="the top-1 tokens 'left'/'The': words of the real vocabulary (the tiny model's top-1 is in the note); "
                             "the sizes 17.1328 and 1.21875 scale with the model: decided is their order and the cosines' order"),
        "rope.fresh_instance_diverges": passage(CONTROL, "extends", "same model instance works fresh model instance fails → inspect "
                                                "model-side multimodal positional state",
                                                cites="rope.missing_state_diverges_more_than_off_by_one"),
        "rope.restored_state_matches": passage(CONTROL, "extends", "the model may need a documented hook for exporting and restoring "
                                               "that metadata."),
    },
    bisect="rope.missing_state_diverges_more_than_off_by_one",
    functions=GENERATE,
    repro="examples/repro/resume_contract_qwen3_vl.py",
    decisions=(Decisions("helpers/rope/decisions.py", ("decide_*", "_ran", "ratio"), "tests/test_decisions.py"),),
    estimate_s=5.0,
    summary=('Qwen3-VL keeps its multimodal position state (`rope_deltas`) on the model, not in the K/V: `None`, `0` '
             'and `+1` change the continuation; a fresh instance without the state diverges.'),
    models="`tiny-qwen3-vl`",
    needs="CPU",
)
