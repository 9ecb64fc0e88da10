"""The guard's check for a new image in a resumed Qwen3-VL chat (notebook 09): new vision tokens in what generate()
feeds beside a filled cache, whose 3-D (t, h, w) positions generate() would not recompute.

The decision is notebook 09's (`helpers.newimage.guardcheck.check_uncached`), taken on what generate() fed its first
model call (the installed release's own slicing) and the position_ids / mm_token_type_ids it was given; its message
names the route that works on the installed release.
"""
from __future__ import annotations  # upstream: drop

from ..newimage.guardcheck import check_uncached  # upstream: drop
from .call import ResumeCall, ResumeInputError  # upstream: drop


def new_vision_tokens(call: ResumeCall) -> None:
    """New image/video tokens fed beside a filled cache, at positions generate() would not recompute."""
    ids = call.fed_ids
    if call.model is None or not call.keeps_rope_state or ids is None or call.decoder_start is not None:
        return
    message = check_uncached(call.model, ids, call.lengths[0], call.position_ids,
                             call.multimodal.get("mm_token_type_ids"))
    if message:
        raise ResumeInputError(message)
