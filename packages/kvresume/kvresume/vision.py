"""The resume guard's new-vision-token check (standalone; the guard's ordered list of checks calls it).

generate() resumed from a non-empty cache places the uncached tokens at text positions shifted by the model-side
`rope_deltas` of an earlier call, unless it recomputes the 3-D (t, h, w) positions: from 5.23.0 it does when
`mm_token_type_ids` covers the whole sequence and marks vision tokens after the cached ones; on earlier releases
never. New image or video tokens in the suffix placed that way are silently wrong (notebook 09). The check takes
what generate() receives and returns None, or a message naming the route that works on the installed release.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from . import compat
from .call import ResumeCall, ResumeInputError


def recomputes_new_vision_positions(model: torch.nn.Module) -> bool:
    """Whether this release's generate() recomputes 3-D positions when the uncached tokens hold vision tokens
    (the `has_new_vision_tokens` branch of `_prepare_position_ids_for_generation`, added in 5.23.0)."""
    try:
        return "has_new_vision_tokens" in inspect.getsource(type(model)._prepare_position_ids_for_generation)
    except (AttributeError, OSError, TypeError):
        return False


def takes_encoded_images(model: torch.nn.Module) -> bool:
    """Whether forward() takes pre-encoded images (`mm_encoder_outputs`)."""
    return compat.accepts(model.forward, "mm_encoder_outputs")


def _vision_ids(model: torch.nn.Module) -> list[int]:
    cfg = model.config
    return [int(v) for v in (getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None)) if v is not None]


def _uncached(input_ids: torch.Tensor, mask: torch.Tensor | None, past: int) -> torch.Tensor:
    """The tokens generate() will feed: the suffix itself (mask over cached + suffix), else what follows the cache."""
    n = int(input_ids.shape[1])
    if mask is not None and int(mask.shape[-1]) == past + n:
        return input_ids
    return input_ids[:, past:] if n > past else input_ids


def _explicit_3d(position_ids: Any, n: int) -> bool:
    return isinstance(position_ids, torch.Tensor) and position_ids.dim() == 3 and position_ids.shape[0] in (3, 4) \
        and int(position_ids.shape[-1]) == n


def _recomputed(model: torch.nn.Module, types: Any, past: int) -> bool:
    """generate() will recompute: the release has the branch and mm_token_type_ids marks vision tokens after the cache."""
    return recomputes_new_vision_positions(model) and isinstance(types, torch.Tensor) and bool(types[:, past:].any())


def working_route(model: torch.nn.Module) -> str:
    """What to pass instead, on the installed release."""
    explicit = ("pass position_ids = the model's own get_rope_index over the full ids (cached + new) with every image's "
                "grid, sliced to the new tokens, with the text row (sequence index) on top (4 rows), and afterwards set "
                "the model-side rope_deltas to the value get_rope_index returned")
    if recomputes_new_vision_positions(model) and takes_encoded_images(model):
        return ("pass the full ids (cached + new), mm_token_type_ids over the whole sequence, image_grid_thw of every "
                "image in it, and only the new images, pre-encoded: mm_encoder_outputs={'image': "
                "model.model.get_image_features(new_pixel_values, new_grid, return_dict=True)}; or " + explicit)
    return explicit


def check_new_vision_tokens(model: torch.nn.Module, input_ids: torch.Tensor | None,
                            attention_mask: torch.Tensor | None = None, cache: Any = None, **kwargs: Any) -> str | None:
    """None, or why generate() would place the new vision tokens of this resume at the wrong 3-D positions."""
    cache = cache if cache is not None else compat.cache_from_kwargs(kwargs)
    if input_ids is None or cache is None:
        return None
    past = int(cache.get_seq_length())
    return check_uncached(model, _uncached(input_ids, attention_mask, past), past, kwargs.get("position_ids"),
                          kwargs.get("mm_token_type_ids"))


def check_uncached(model: torch.nn.Module, uncached: torch.Tensor, past: int, position_ids: Any = None,
                   mm_token_type_ids: Any = None) -> str | None:
    """The same, given the tokens generate() feeds beside a cache of `past` (the resume guard reads them off its first
    model call) and the position_ids / mm_token_type_ids generate() was given."""
    if past == 0 or compat.rope_state_owner(model) is None:
        return None
    vision = _vision_ids(model)
    n_new = int(sum(int((uncached == v).sum()) for v in vision))
    if n_new == 0 or _explicit_3d(position_ids, int(uncached.shape[1])) or _recomputed(model, mm_token_type_ids, past):
        return None
    return (f"the cache holds {past} tokens and the {int(uncached.shape[1])} uncached ones include {n_new} new image/video "
            f"tokens: generate() on transformers {compat.TRANSFORMERS_VERSION} would place them at text positions shifted "
            f"by the stored rope_deltas ({_state(model)}) instead of their (t, h, w) positions, silently. Instead, "
            + working_route(model))


def _state(model: torch.nn.Module) -> Any:
    value = compat.get_rope_state(model)
    return None if value is None else value.flatten().tolist()


def new_vision_tokens(call: ResumeCall) -> None:
    """New image/video tokens fed beside a filled cache, at positions generate() would not recompute."""
    ids = call.fed_ids
    if call.model is None or not call.keeps_rope_state or ids is None or call.decoder_start is not None:
        return
    message = check_uncached(call.model, ids, call.lengths[0], call.position_ids,
                             call.multimodal.get("mm_token_type_ids"))
    if message:
        raise ResumeInputError(message)
