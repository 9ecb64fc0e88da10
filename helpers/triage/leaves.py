"""What each leaf of the triage tree means, and the one line of what the reporter does next (texts only).

Every `next` line names the repair the kit ran for that leaf; its measured number is printed under the tree."""
from __future__ import annotations

MEANING = {
    "no_defect": "the rebuild has no defect: it behaves like the original under every argument set",
    "resume_contract": "the mask/input contract of resuming generate() (notebook 02), not the rebuild",
    "model_side_state": "state outside the K/V tensors (Qwen3-VL's multimodal positions: notebook 03)",
    "cache_metadata": "config/cache-layer metadata: the K/V are stored, but the layers do not report them "
                      "(layer classes, is_initialized, reported lengths)",
    "prefix_short": "the cache is an exact prefix of the original, N slots short (a crop, not a compression): the "
                    "missing tokens were never re-fed",
    "extra_slots": "the cache holds every original slot, then slots no original slot holds (another request's, e.g. a "
                   "prompt cache reused without copy.deepcopy)",
    "compression_positions": "logical positions after compression: generate() continues at the retained length",
    "compression_positions_and_loss": "two defects: generate() continues at the retained length, and the compression "
                                      "itself loses information",
    "compression_information_loss": "information removed by the compression itself (generate() already continues at the "
                                    "processed length)",
    "compression_unresolved": "the rebuild stores fewer slots than processed tokens, and continuing at the processed "
                              "length raised: no single mask fits its per-layer lengths",
    "reconstruction_copy": "the reconstruction/copy path changed the K/V values",
    "unexplained": "a hidden state or a generation branch that tells the objects apart",
}


# One line per leaf: what the reporter does next (the repair the kit ran and measured, where there is one).
NEXT = {
    "no_defect": "nothing to change in the rebuild; resume generate() with the full attention mask (cached prefix + "
                 "suffix), as for the original",
    "resume_contract": "pass generate() the full attention mask (cached prefix + suffix, padding included): the kit did, "
                       "and it restores the full forward",
    "model_side_state": "carry the model-side state with the cache (Qwen3-VL: save rope_deltas after the prefill and set "
                        "it on the instance that resumes, notebook 03): the kit did, and it restores the full forward",
    "cache_metadata": "register the K/V through transformers' own path (update() on DynamicCache(config=model.config."
                      "get_text_config())) instead of assigning layer.keys/.values: the kit did, and it restores the full "
                      "forward",
    "prefix_short": "pass generate() the whole ids (cached prefix + the missing tokens + suffix) with their full mask, so "
                    "it re-feeds what the cache lacks: the kit did, and it restores the full forward",
    "extra_slots": "crop the cache to the processed length (cache.crop(n)), or copy.deepcopy the prompt cache before "
                   "each reuse: the kit cropped it, and it restores the full forward",
    "compression_positions": "continue at the processed length: return a resume state {'past_key_values': cache, "
                             "'processed_length': n} from the rebuild, or pass position_ids = processed length "
                             "(+ rope_deltas for Qwen3-VL) with a mask sized to the stored slots: the kit did, and it "
                             "restores the full forward",
    "compression_positions_and_loss": "first continue at the processed length (return {'past_key_values': cache, "
                                      "'processed_length': n}, or pass position_ids = processed length + rope_deltas "
                                      "with a mask sized to the stored slots): the kit did, and it removes the position "
                                      "defect; what remains is the compression's own loss: change what is kept",
    "compression_information_loss": "positions are already right (continuing at the processed length changes nothing); "
                                    "what remains is the compression's own loss, shown against the identity rebuild's: "
                                    "change what is kept",
    "compression_unresolved": "give every attention layer the same number of stored slots (or one mask per layer): no "
                              "single mask fits different per-layer lengths under eager attention or a multi-token "
                              "suffix; the stage that raised is shown; then run the tree again",
    "reconstruction_copy": "no generic repair: fix the copy/convert path at the first differing layer and slot shown "
                           "(keys or values; for keys, a rotation only means RoPE applied at other positions)",
    "unexplained": "report it with this tree: no cell of control 0 differs in a way a repair fixes, so a hidden state or "
                   "a generate() branch tells the two objects apart",
}
