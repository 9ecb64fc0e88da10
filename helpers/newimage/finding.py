"""Notebook 09's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import QWEN3_VL, Decisions, Finding
from ..quotes import Quote, CONTROL, NEW_IMAGE, VALIDATION, passage

_MM_STATE = "Qwen3-VL also had important multimodal positional state outside the K/V tensors."
_ONE_IMAGE = "The control was intentionally narrow: - 2B model; - one image;"
_PRESERVE = ("For Qwen3-VL, preserve the model-side multimodal positional state as well as the K/V tensors if the cache "
             "moves between model instances or processes.")


def _new_image(text: str) -> Quote:
    """A notebook-09 claim: the control passage it extends (the threads' own text is not quoted here)."""
    return passage(CONTROL, "extends", text, answers=NEW_IMAGE)


FINDING = Finding(
    stem="09_new_image_turn",
    title="A new image after a cached turn: Qwen3-VL multi-turn resume",
    source="new-image",
    claims={
        "newimage.natural_call_silently_wrong": _new_image(_ONE_IMAGE),
        "newimage.positions_explain_it": _new_image(_MM_STATE),
        "newimage.both_images_raise": _new_image(_ONE_IMAGE),
        "newimage.text_turn_control_matches": _new_image(_ONE_IMAGE),
        "newimage.repair_forward_restores": _new_image(_MM_STATE),
        "newimage.repair_generate_restores": _new_image(_MM_STATE),
        "newimage.rope_deltas_carried_forward": _new_image(_PRESERVE),
        "newimage.guard_check_separates": _new_image(VALIDATION),
    },
    bisect="newimage.natural_call_silently_wrong",
    functions=(f"{QWEN3_VL}.Qwen3VLForConditionalGeneration._prepare_position_ids_for_generation",
               f"{QWEN3_VL}.Qwen3VLModel.compute_3d_position_ids", f"{QWEN3_VL}.Qwen3VLModel.get_rope_index",
               f"{QWEN3_VL}.Qwen3VLModel.forward|mm_encoder_outputs"),
    repro="examples/repro/qwen3_vl_new_image_turn.py",
    decisions=(Decisions("helpers/newimage/decisions.py", ("*",), "tests/test_kill_newimage.py"),),
    estimate_s=5.0,
    summary=("A chat resumed from turn 1's cache whose turn 2 brings a new image (`QwenLM/Qwen3-VL#1685`, "
             "`QwenLM/Qwen3-VL#1412`): the natural `generate()` runs and is silently wrong; turn 2's positions "
             'computed with `get_rope_index` over the full ids and both grids restore it.'),
    models="`tiny-qwen3-vl`",
    needs="CPU",
)
