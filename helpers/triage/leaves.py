"""What each leaf of the triage tree means, and the one line of what the reporter does next (texts only)."""
from __future__ import annotations

MEANING = {
    "resume_contract": "the mask/input contract of resuming generate() (notebook 02), not the rebuild",
    "model_side_state": "state outside the K/V tensors (Qwen3-VL's multimodal positions: notebook 03)",
    "compression_positions": "logical positions after compression: generate() continues at the retained length",
    "compression_positions_and_loss": "two defects: generate() continues at the retained length, and the compression "
                                      "itself loses information",
    "compression_information_loss": "information removed by the compression itself (generate() already continues at the "
                                    "processed length)",
    "compression_unresolved": "the rebuild changes cache lengths, but the explicit-position control could not separate "
                              "positions from loss",
    "reconstruction_copy": "the reconstruction/copy path changed the K/V values",
    "cache_metadata": "config/cache-layer metadata (layer classes, lengths)",
    "unexplained": "a hidden state or a generation branch that tells the objects apart",
}


# One line per leaf: what the reporter does next.
NEXT = {
    "resume_contract": "pass generate() the full attention mask (cached prefix + suffix, padding included); the rebuild is not the cause",
    "model_side_state": "carry the model-side state with the cache (Qwen3-VL: save rope_deltas after the prefill and set it on "
                        "the instance that resumes, notebook 03)",
    "compression_positions": "continue at the processed length: return a resume state {'past_key_values': cache, "
                             "'processed_length': n} from the rebuild, or pass position_ids = processed length "
                             "(+ rope_deltas for Qwen3-VL) with a mask sized to the stored slots; that restores the full "
                             "forward within the floor",
    "compression_positions_and_loss": "first continue at the processed length (return {'past_key_values': cache, "
                                      "'processed_length': n}, or pass position_ids = processed length + rope_deltas "
                                      "with a mask sized to the stored slots): that removes explicit_vs_generate; what "
                                      "remains (explicit_vs_full_forward) is the compression's own loss: change what is kept",
    "compression_information_loss": "positions are already right (generate() continues at the processed length); what "
                                    "remains (explicit_vs_full_forward) is the compression's own loss: compare it with "
                                    "the identity control's and change what is kept",
    "compression_unresolved": "read control 3: the explicit-position step failed (its error and stage are shown) or "
                              "differs from generate() at the same position; per-layer lengths the mask (sized from layer 0) "
                              "cannot cover (eager attention, or a multi-token suffix) need one length per attention "
                              "layer; then run the tree again",
    "reconstruction_copy": "compare the rebuilt K/V with the original's per layer (control 1): the copy/convert path changed the values",
    "cache_metadata": "build the cache with DynamicCache(config=model.config.get_text_config()) so layer classes and lengths "
                      "match the original's",
    "unexplained": "report it with this tree: K/V and visible metadata match, so a hidden state or a generate() branch "
                   "tells the two objects apart",
}
