"""Notebook 05's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import Decisions, Finding
from ..quotes import Quote, ISSUE_48947, passage

_LINEAR_HYPOTHESIS = "only the correctness of the linear_attention layers' recurrent/conv state under offload looks broken."
_FIRST_REUSE = "the bug appears exactly at the first post-prefill forward call that reuses the cache"
_NO_GPU = "needs a GPU and the 27B checkpoint; a tiny hybrid stands in, on CUDA only"
# The GPU arms' claims that hold once the lag is injected, whatever the device does
# (helpers.offload.gpu.BY_CONSTRUCTION); what a GPU decides is in helpers.offload.gpu.GPU_DECIDES.
_GPU_BUILT = {
    "prefill": "on the GPU arms, no prefill compute reads a prefetched tensor, so the prefill logits are offloading=False's",
    "decode": "on the GPU arms, the injected lag makes the first decode read host buffers whose copies have not ended",
    "first": "on 5.17.0 the linear-attention layers are never offloaded, so only attention K/V can differ first",
    "race": "on the GPU arms, the sleep is 4 x the host time to the wrap prefetch, so a prefetch starts before its copy ends",
}
_KILL = "tests/test_kill_offload.py"

FINDING = Finding(
    stem="05_hybrid_offloading_drift",
    title="Hybrid offloading drift: what makes `DynamicCache(offloading=True)` drift",
    source="48947",
    claims={
        "offload.prefill_identical": passage(ISSUE_48947, "states", "The first forward call (prefill) is bit-identical to offloading=False;",
                                             not_decided=_NO_GPU, by_construction=_GPU_BUILT["prefill"]),
        "offload.decode_drifts": passage(ISSUE_48947, "states", "the very next call that reuses past_key_values already diverges far beyond "
                                         "bf16 rounding noise", not_decided=_NO_GPU, by_construction=_GPU_BUILT["decode"]),
        "offload.first_differing_tensor_is_attention_kv": passage(ISSUE_48947, "hypothesis", _LINEAR_HYPOTHESIS, not_decided=_NO_GPU,
                                                                  by_construction=_GPU_BUILT["first"]),
        "offload.linear_layers_never_moved": passage(ISSUE_48947, "hypothesis", _LINEAR_HYPOTHESIS),
        "offload.ordering_edge_removes_drift": passage(ISSUE_48947, "extends", "Logits (and therefore generated tokens) with "
                                                       "offloading=True should match offloading=False up to ordinary bf16 "
                                                       "nondeterminism, at every step, not just the first."),
        "offload.race_observed_on_device": passage(ISSUE_48947, "extends", _FIRST_REUSE, by_construction=_GPU_BUILT["race"]),
        "offload.offload_event_removes_drift": passage(ISSUE_48947, "extends", _FIRST_REUSE),
        "offload.record_stream_removes_drift": passage(ISSUE_48947, "extends", _FIRST_REUSE),
        "offload.block_overwritten_under_pending_read": passage(ISSUE_48947, "extends", _FIRST_REUSE, not_decided=_NO_GPU),
        "offload.unlagged_run_drifts": passage(ISSUE_48947, "extends", _FIRST_REUSE, not_decided=_NO_GPU),
        "offload.prefetch_reads_unordered_copy": passage(ISSUE_48947, "extends", "the second call, which is the first call that actually "
                                                         "has to move an offloaded layer's state back for use"),
        "offload.race_not_specific_to_hybrid": passage(ISSUE_48947, "extends", "on this hybrid Gated-DeltaNet + attention model"),
        "offload.report_loop_reads_previous_forward": passage(ISSUE_48947, "extends", _FIRST_REUSE),
        "offload.generate_orders_cross_forward_reads": passage(ISSUE_48947, "extends", "next_ids = out.logits[:, -1:].argmax(-1)"),
        "offload.prefetched_block_released_with_pending_read": passage(
            ISSUE_48947, "extends", "I have not isolated which specific tensor (recurrent state vs conv state vs something else) "
            "fails to round-trip through CPU offload"),
        "offload.race_replay_drifts_by_construction": passage(
            ISSUE_48947, "models", "1 max_abs_diff 2.1171875 argmax_match False",
            by_construction="a stale read returns zeros and the lag is chosen so that every unordered read is stale, so the "
                                 "replay drifts whatever the hardware does; its step values are not comparable to the report's"),
        "offload.cpu_reports_cuda_requirement": Quote("", "", "machine"),
    },
    bisect="offload.prefetch_reads_unordered_copy",
    functions=("transformers.cache_utils.Cache.update", "transformers.cache_utils.Cache.prefetch",
               "transformers.cache_utils.Cache.offload",
               "transformers.generation.utils.GenerationMixin._prepare_cache_for_generation"),
    repro="examples/repro/offloading_48947.py",
    decisions=(
        Decisions("helpers/offload/replay.py", ("ordering_decision", "replay_decision"), _KILL, also=("ordering_decision", "replay_decision")),
        Decisions("helpers/offload/gpu_decide.py", ("decide_*", "_arm", "drifts", "logit_drift", "state_drift", "race_counts", "narrow_models",
                                                    "narrow_key", "_fixed_counts", "explanations", "fix_everywhere",
                                                    "report_keys"),
                  _KILL, ("tests/test_kill_gpu.py",)),
        Decisions("helpers/offload/states.py", ("first_difference",), _KILL)),
    estimate_s=14.0,
    summary=('transformers issue #48947: `DynamicCache(offloading=True)` on a hybrid Gated-DeltaNet + attention model '
             'matches at prefill and drifts from the first decode step. On CPU the kit records which prefetch reads of'
             ' a host buffer are not ordered after the device-to-host copy that fills them; the drift itself needs '
             'CUDA (`make gpu-check`).'),
    models="`tiny-qwen3.5-hybrid`",
    needs="ordering table, hazards and replay: CPU; drift, first differing tensor, fix arms: CUDA (`make gpu-check`)",
)
