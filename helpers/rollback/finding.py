"""Notebook 10's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import Decisions, Finding
from ..quotes import Quote, CONTROL, ROLLBACK, HYBRID, IDENTITY, passage

def _rollback(text: str) -> Quote:
    """A notebook-10 claim: the control passage it extends (the threads' own text is not quoted here)."""
    return passage(CONTROL, "extends", text, answers=ROLLBACK)


FINDING = Finding(
    stem="10_rollback_hybrid",
    title=("Rolling a cache back, continuing, assisting and reusing it: the hybrid beside dense, sliding and static "
           "caches"),
    source="rollback",
    claims={
        "rollback.dense_crop_restores": _rollback(HYBRID),
        "rollback.plain_crop_never_silently_wrong": _rollback(HYBRID),
        "rollback.hybrid_recorded_crop_keeps_recurrent_state": _rollback(HYBRID),
        "rollback.recording_without_count_runs": _rollback(HYBRID),
        "rollback.sliding_recorded_crop_restores": _rollback(HYBRID),
        "rollback.static_crop_refused": _rollback(HYBRID),
        "rollback.multi_token_continuation_matches": _rollback(HYBRID),
        "rollback.hand_rebuild_keeps_length": _rollback(IDENTITY),
        "rollback.kit_rebuild_keeps_length": _rollback(IDENTITY),
        "rollback.assisted_never_silently_wrong": _rollback(HYBRID),
        "rollback.assisted_refused_on_hybrid": _rollback(HYBRID),
        "rollback.assisted_refused_on_static": _rollback(HYBRID),
        "rollback.static_reuse_past_capacity_raises": _rollback(HYBRID),
        "rollback.static_second_call_reallocates": _rollback(HYBRID),
        "rollback.static_max_cache_len_ignored": _rollback(HYBRID),
        "rollback.static_user_cache_beside_config_refused": _rollback(HYBRID),
    },
    bisect="rollback.hand_rebuild_keeps_length",
    functions=("transformers.cache_utils.Cache.crop", "transformers.cache_utils.Cache.activate_past_recording",
               "transformers.cache_utils.LinearAttentionCacheLayerMixin.crop",
               "transformers.cache_utils.LinearAttentionLayer.update_conv_state", "transformers.cache_utils.StaticLayer.crop",
               "transformers.generation.utils.GenerationMixin._validate_generation_mode|assist",
               "transformers.generation.utils.GenerationMixin._prepare_cache_for_generation"),
    repro="examples/repro/hybrid_rollback_rebuild.py",
    decisions=(Decisions("helpers/rollback/decisions.py", ("*",), "tests/test_kill_rollback.py", ("tests/test_rollback.py",)),),
    estimate_s=5.0,
    summary=('Rolling a cache back by k tokens (`crop(-k)`, with and without `activate_past_recording`) on a '
             "Gated-DeltaNet hybrid beside dense, sliding and static caches; multi-token continuation; 5.25.0's "
             'linear-attention length.'),
    models="`tiny-qwen3.5-hybrid`, `tiny-qwen3`, `tiny-qwen3-sliding`",
    needs="CPU",
)
