"""What each claim tests, in the source's own words: one registry keyed by claim id.

A `reproduces` claim quotes the sentence or table row it tests, a `refutes` claim the hypothesis it tests,
verbatim (whitespace aside; tests/test_quotes.py checks every quote against the source texts); a `beyond`
claim names the passage it extends; a `simulation` claim the passage it models and, where it holds by
construction, how; an `environment` claim quotes nothing. helpers.results attaches the entry to each claim
of a results file, and SUMMARY.md shows it beside the verdict. Two claims quoting the same text test one
statement: it is counted once. A claim whose number another claim's measurement decides (`cites`) and a value
fixed by construction (`by_construction`) are listed apart, never counted as reproduced. A new claim is one entry here (tests fail for a claim without one).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# The public names of the sources (helpers.pipeline.report.sources holds their setups).
CONTROL = "control"  # the Qwen3-VL resume-contract control (transformers 5.14.1)
ISSUE_48947 = "48947"  # transformers issue #48947 (hybrid offloading drift)
NEW_IMAGE = "new-image"  # Qwen3-VL multi-turn resume with a new image (QwenLM/Qwen3-VL#1685, #1412): no text quoted
ROLLBACK = "rollback"  # hybrid rollback and continuation (transformers #49036, PR #45513, 5.25.0's cache rewrite): no text quoted

ROLES = {"reproduces": "states", "refutes": "hypothesis", "beyond": "extends", "simulation": "models",
         "environment": "machine"}


@dataclass(frozen=True)
class Quote:
    """A claim's source passage: `text` verbatim from source `source`; `role` how the claim uses it."""

    source: str
    text: str
    role: str
    by_construction: str = ""  # a simulation: what makes it hold whatever the hardware does
    not_decided: str = ""  # a fact of the quoted text this kit cannot decide here, and why
    answers: str = ""  # the source the claim answers where it is not the one quoted (a beyond claim of another thread)
    # the claim whose measurement decides this one too (the same call or number): the count takes it once, there
    cites: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v}


def _q(source: str, role: str, text: str, **extra: str) -> Quote:
    return Quote(source, " ".join(text.split()), role, **extra)


_IDENTITY_15 = "Across the 15 valid original-versus-rebuilt first-step comparisons, the logits were also exactly identical."
_SLICED = "The only unprocessed token had been sliced away before the model forward pass."
_LENGTHS_35168 = ("Issue #35168 reported that layer-dependent cache lengths behaved differently between FlashAttention 2 "
                  "and SDPA/eager paths.")
_SLIDING = ("Other cache layer types can have different semantics—for example, sliding layers may track cumulative "
            "processed length separately")
_VALIDATION = ("detect a non-empty cache combined with a short suffix and an attention mask that covers only that suffix, "
               "then raise a useful error or warning instead of silently slicing to an empty input.")
_FACTORY = "validating K/V shapes, dtype, device, and batch size;"
_CONTRACT = ("Resuming generate() from a non-empty cache requires an unambiguous contract between the cached prefix, the "
             "unprocessed suffix, the full attention mask, and any model-specific positional state.")
_ENGINES = ("In-forward methods, patched attention implementations, and inference engines that own their resume state may "
            "cross a different boundary.")
_LINEAR_HYPOTHESIS = "only the correctness of the linear_attention layers' recurrent/conv state under offload looks broken."
_FIRST_REUSE = "the bug appears exactly at the first post-prefill forward call that reuses the cache"
_SCALE = ("the size 7.65625: raw logit differences scale with the model (the tiny model's largest |logit| is below 1); "
          "decided is 'beyond the noise floor', and the cosine and top-1 as claims of their own")
_NO_GPU = "needs a GPU and the 27B checkpoint; a tiny hybrid stands in, on CUDA only"
# The GPU arms' claims that hold once the lag is injected, whatever the device does (helpers.offload.gpuplan.BY_CONSTRUCTION);
# what a GPU decides is in helpers.offload.gpuplan.GPU_DECIDES.
_GPU_BUILT = {
    "prefill": "on the GPU arms, no prefill compute reads a prefetched tensor, so the prefill logits are offloading=False's",
    "decode": "on the GPU arms, the injected lag makes the first decode read host buffers whose copies have not ended",
    "first": "on 5.17.0 the linear-attention layers are never offloaded, so only attention K/V can differ first",
    "race": "on the GPU arms, the sleep is 4 x the host time to the wrap prefetch, so a prefetch starts before its copy ends",
}
_MM_STATE = "Qwen3-VL also had important multimodal positional state outside the K/V tensors."
_ONE_IMAGE = "The control was intentionally narrow: - 2B model; - one image;"
_PRESERVE = ("For Qwen3-VL, preserve the model-side multimodal positional state as well as the K/V tensors if the cache "
             "moves between model instances or processes.")


def _new_image(text: str) -> Quote:
    """A notebook-09 claim: the control passage it extends (the threads' own text is not quoted here)."""
    return _q(CONTROL, "extends", text, answers=NEW_IMAGE)


def _rollback(text: str) -> Quote:
    """A notebook-10 claim: the control passage it extends (the threads' own text is not quoted here)."""
    return _q(CONTROL, "extends", text, answers=ROLLBACK)


_HYBRID = "- sliding/hybrid caches;"
_IDENTITY = "- original cache versus identity-rebuilt cache;"

QUOTES: dict[str, Quote] = {
    # 01 identity reconstruction
    "identity.cache_metadata_match": _q(CONTROL, "states", "In the tested version, all four variants had: - 28 initialized "
                                        "layers; DynamicLayer for all 28 layers;- reported cache length 81; - identical K/V shapes;",
                                        not_decided="28 layers: the tiny model has 4; the match is decided per layer"),
    "identity.kv_bitwise_equal": _q(CONTROL, "states", "- identical K/V shapes; - bitwise-identical K/V values."),
    "identity.first_step_logits_equal": _q(CONTROL, "states", _IDENTITY_15,
                                           not_decided="the count 15: the source gives no breakdown; this run counts its own"),
    # 02 mask / position matrix
    "matrix.neither_fails": _q(CONTROL, "states", "Without the full mask Input supplied to generate(): past cache length: 81 "
                               "input suffix length: 1 First model call: input_ids shape: [1, 0] attention_mask shape: [1, 1] "
                               "past cache length: 81"),
    "matrix.position_only_fails": _q(CONTROL, "states", "The same thing happened: input_ids shape: [1, 0] attention_mask shape: "
                                     "[1, 1] position_ids: explicitly supplied past cache length: 81"),
    "matrix.mask_only_works": _q(CONTROL, "states", "input_ids shape: [1, 1] attention_mask shape: [1, 82] past cache length: 81 "
                                 "position for current token: inferred as 81 Generation succeeded.",
                                 not_decided="the inferred position 81 is not read out; the first-step logits matching the "
                                             "full forward within the noise floor imply it"),
    "matrix.both_matches_mask_only": _q(CONTROL, "states", "This also succeeded, but it did not show an additional recovery over "
                                        "mask_only in this control."),
    "matrix.first_call_drops_suffix": _q(CONTROL, "states", _SLICED, cites="matrix.neither_fails"),
    "matrix.forward_needs_positions": _q(CONTROL, "states", "A direct forward() with a full-length mask but no explicitly sliced "
                                         "current-token 3D position IDs produced a shape mismatch, whereas generate() prepared "
                                         "the current-token positions correctly."),
    # 03 rope_deltas
    "rope.state_outside_kv": _q(CONTROL, "states", "The tested prefix prefill produced: rope_deltas = -42",
                                by_construction="the prompt sets -42: its image's grid fixes how far the text positions "
                                                "run behind the token count; the kit builds the prompt to give the same value"),
    "rope.none_equals_zero": _q(CONTROL, "states", "The None and zero cases were identical in this control"),
    "rope.missing_state_diverges_more_than_off_by_one": _q(
        CONTROL, "states", "rope_deltas = None | 17.1328 | 0.30597 | The | rope_deltas = 0 | 17.1328 | 0.30597 | The | "
        "| Correct value + 1 | 1.21875 | 0.99833 | left |",
        not_decided="the top-1 tokens 'left'/'The': words of the real vocabulary (the tiny model's top-1 is in the note); "
                    "the sizes 17.1328 and 1.21875 scale with the model: decided is their order and the cosines' order"),
    "rope.fresh_instance_diverges": _q(CONTROL, "extends", "same model instance works fresh model instance fails → inspect "
                                       "model-side multimodal positional state",
                                       cites="rope.missing_state_diverges_more_than_off_by_one"),
    "rope.restored_state_matches": _q(CONTROL, "extends", "the model may need a documented hook for exporting and restoring "
                                      "that metadata."),
    # 04 token boundary
    "boundary.valid_split_matches_full_forward": _q(CONTROL, "states", "cache(prompt[:-1]) + prompt[-1] → valid split continuation"),
    "boundary.double_processing_diverges": _q(CONTROL, "states", "Re-feeding the already cached token produced: max absolute "
                                              "logit difference: 7.65625", not_decided=_SCALE),
    "boundary.double_processing_cosine": _q(CONTROL, "states", "cosine similarity: 0.8698"),
    "boundary.double_processing_top1_changed": _q(CONTROL, "states", "top-1 token: changed"),
    "boundary.rebuilt_cache_same_as_original": _q(CONTROL, "states", "It happened with both the original cache and the rebuilt cache."),
    "boundary.mask_and_positions_do_not_restore": _q(CONTROL, "states", "Supplying a full attention mask and explicit positions did "
                                                     "not restore the original result."),
    # 05 hybrid offloading (#48947)
    "offload.prefill_identical": _q(ISSUE_48947, "states", "The first forward call (prefill) is bit-identical to offloading=False;",
                                    not_decided=_NO_GPU, by_construction=_GPU_BUILT["prefill"]),
    "offload.decode_drifts": _q(ISSUE_48947, "states", "the very next call that reuses past_key_values already diverges far beyond "
                                "bf16 rounding noise", not_decided=_NO_GPU, by_construction=_GPU_BUILT["decode"]),
    "offload.first_differing_tensor_is_attention_kv": _q(ISSUE_48947, "hypothesis", _LINEAR_HYPOTHESIS, not_decided=_NO_GPU,
                                                         by_construction=_GPU_BUILT["first"]),
    "offload.linear_layers_never_moved": _q(ISSUE_48947, "hypothesis", _LINEAR_HYPOTHESIS),
    "offload.ordering_edge_removes_drift": _q(ISSUE_48947, "extends", "Logits (and therefore generated tokens) with "
                                              "offloading=True should match offloading=False up to ordinary bf16 "
                                              "nondeterminism, at every step, not just the first."),
    "offload.race_observed_on_device": _q(ISSUE_48947, "extends", _FIRST_REUSE, by_construction=_GPU_BUILT["race"]),
    "offload.offload_event_removes_drift": _q(ISSUE_48947, "extends", _FIRST_REUSE),
    "offload.record_stream_removes_drift": _q(ISSUE_48947, "extends", _FIRST_REUSE),
    "offload.block_overwritten_under_pending_read": _q(ISSUE_48947, "extends", _FIRST_REUSE, not_decided=_NO_GPU),
    "offload.unlagged_run_drifts": _q(ISSUE_48947, "extends", _FIRST_REUSE, not_decided=_NO_GPU),
    "offload.prefetch_reads_unordered_copy": _q(ISSUE_48947, "extends", "the second call, which is the first call that actually "
                                                "has to move an offloaded layer's state back for use"),
    "offload.race_not_specific_to_hybrid": _q(ISSUE_48947, "extends", "on this hybrid Gated-DeltaNet + attention model"),
    "offload.report_loop_reads_previous_forward": _q(ISSUE_48947, "extends", _FIRST_REUSE),
    "offload.generate_orders_cross_forward_reads": _q(ISSUE_48947, "extends", "next_ids = out.logits[:, -1:].argmax(-1)"),
    "offload.prefetched_block_released_with_pending_read": _q(
        ISSUE_48947, "extends", "I have not isolated which specific tensor (recurrent state vs conv state vs something else) "
        "fails to round-trip through CPU offload"),
    "offload.race_replay_drifts_by_construction": _q(
        ISSUE_48947, "models", "1 max_abs_diff 2.1171875 argmax_match False",
        by_construction="a stale read returns zeros and the lag is chosen so that every unordered read is stale, so the "
                        "replay drifts whatever the hardware does; its step values are not comparable to the report's"),
    "offload.cpu_reports_cuda_requirement": Quote("", "", "machine"),
    # 06 triage
    "triage.identity_matches_original": _q(CONTROL, "states", _IDENTITY_15),
    "triage.streaming_generate_uses_retained_length": _q(CONTROL, "extends", "If tokens are evicted, retained K/V slot count may "
                                                         "differ from total processed length."),
    "triage.per_layer_lengths_outcome": _q(CONTROL, "extends", "If different layers retain different tokens, per-layer lengths "
                                           "may diverge."),
    "triage.per_layer_lengths_by_backend": _q(CONTROL, "extends", _LENGTHS_35168),
    # 07 regression families
    "regress.sliding_rebuild_hidden_by_full_mask": _q(CONTROL, "extends", _SLIDING),
    "regress.sliding_rebuild_breaks_direct_forward": _q(CONTROL, "extends", _SLIDING),
    "regress.sliding_rebuild_depends_on_kernel": _q(CONTROL, "extends", _LENGTHS_35168),
    "regress.hybrid_update_rebuild_drops_linear_state": _q(CONTROL, "extends", _HYBRID),
    "regress.left_padded_resume_needs_padded_mask": _q(CONTROL, "extends", "Issue #40833 showed a different silent-output problem "
                                                       "where left-padded cached batches attended to padding because the cache "
                                                       "mask was incomplete."),
    "regress.mask_contract_holds_across_families": _q(CONTROL, "states", _SLICED, cites="matrix.neither_fails"),
    "regress.flash_attention_2_matches_sdpa": _q(CONTROL, "extends", "- eager, SDPA, and FlashAttention where applicable;"),
    # 08 resume API
    "api.guard_catches_or_names_every_silent_case": _q(CONTROL, "extends", _VALIDATION),
    "api.guard_passes_every_valid_call": _q(CONTROL, "extends", _VALIDATION),
    "api.factory_matches_original_every_family": _q(CONTROL, "extends", _IDENTITY),
    "api.factory_refuses_malformed_inputs": _q(CONTROL, "extends", _FACTORY),
    "api.resume_state_portable_to_fresh_instance": _q(CONTROL, "extends", "- original model instance versus fresh model instance;"),
    "api.ledger_guard_refuses_every_silent_tracked_case": _q(CONTROL, "extends", _CONTRACT),
    "api.every_refusal_advice_restores": _q(CONTROL, "extends", _VALIDATION),
    "api.resume_matches_full_forward": _q(CONTROL, "extends", _ENGINES),
    # 09 a new image after a cached turn
    "newimage.natural_call_silently_wrong": _new_image(_ONE_IMAGE),
    "newimage.positions_explain_it": _new_image(_MM_STATE),
    "newimage.both_images_raise": _new_image(_ONE_IMAGE),
    "newimage.text_turn_control_matches": _new_image(_ONE_IMAGE),
    "newimage.repair_forward_restores": _new_image(_MM_STATE),
    "newimage.repair_generate_restores": _new_image(_MM_STATE),
    "newimage.rope_deltas_carried_forward": _new_image(_PRESERVE),
    "newimage.guard_check_separates": _new_image(_VALIDATION),
    # 10 rollback, continuation and the 5.25.0 rebuild change on the hybrid
    "rollback.dense_crop_restores": _rollback(_HYBRID),
    "rollback.plain_crop_never_silently_wrong": _rollback(_HYBRID),
    "rollback.hybrid_recorded_crop_keeps_recurrent_state": _rollback(_HYBRID),
    "rollback.recording_without_count_runs": _rollback(_HYBRID),
    "rollback.sliding_recorded_crop_restores": _rollback(_HYBRID),
    "rollback.static_crop_refused": _rollback(_HYBRID),
    "rollback.multi_token_continuation_matches": _rollback(_HYBRID),
    "rollback.hand_rebuild_keeps_length": _rollback(_IDENTITY),
    "rollback.kit_rebuild_keeps_length": _rollback(_IDENTITY),
    "rollback.assisted_never_silently_wrong": _rollback(_HYBRID),
    "rollback.assisted_refused_on_hybrid": _rollback(_HYBRID),
    "rollback.assisted_refused_on_static": _rollback(_HYBRID),
    "rollback.static_reuse_past_capacity_raises": _rollback(_HYBRID),
    "rollback.static_second_call_reallocates": _rollback(_HYBRID),
    "rollback.static_max_cache_len_ignored": _rollback(_HYBRID),
    "rollback.static_user_cache_beside_config_refused": _rollback(_HYBRID),
}


def quote_for(claim_id: str) -> dict[str, Any]:
    """The registry entry of a claim as a plain dict ({} for a claim without one)."""
    entry = QUOTES.get(claim_id)
    return entry.as_dict() if entry else {}


def normalized(text: str) -> str:
    """Whitespace collapsed: how quotes are compared with the source texts."""
    return " ".join(str(text).split())


def statement_key(claim: dict[str, Any]) -> str:
    """What makes two claims one statement: their quote's source and text (the claim id where none is quoted)."""
    quote = claim.get("quote") or quote_for(str(claim.get("id")))
    text = normalized(quote.get("text") or "")
    return f"{quote.get('source')}: {text}" if text else f"claim: {claim.get('id')}"
