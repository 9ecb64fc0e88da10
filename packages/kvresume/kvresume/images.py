"""Image and video slots keyed by content: which picture each placeholder slot of a cache was written with.

Placeholder tokens are the same ids for every image, so a ledger of token ids alone cannot tell a conversation's new
image from the cached one. As vLLM's multimodal prefix caching does, the tracker records, on each forward call that
carries pixels, one span per image: the slots its placeholders filled and a hash of its pixel rows (`note`, at the
tracked call's start; kept on the cache by `attach`, beside the ledger). `limit_record` (in `resume()`) ends
the reusable prefix before the first image whose pixels differ from the cached one's, or that the cut would split; `fed`
slices the conversation's pixels, grids and token types to the images and columns of what is fed; the suffix's 3-D positions
and `rope_deltas` come from the model's own `get_rope_index` over the whole conversation.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from . import compat
from .pickling import method
from .call import refuse
from .ledger import ledger_owner

ATTR = "kv_images"
KINDS = (("pixel_values", "image_grid_thw", "image_token_id"), ("pixel_values_videos", "video_grid_thw", "video_token_id"))


@dataclass(frozen=True)
class Span:
    """One image (or video) in one row: slots [start, end) of the sequence and its pixels' hash."""

    row: int
    start: int
    end: int
    digest: str
    kind: int  # index into KINDS
    index: int  # the image's index among the call's images of its kind (its rows in pixel_values, its grid row)


def spans(model: torch.nn.Module, kwargs: dict[str, Any], offset: int = 0) -> list[Span] | None:
    """The images a call's ids and pixels place (slots counted from `offset`); None where the call carries none."""
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or all(kwargs.get(kind[0]) is None for kind in KINDS):
        return None
    config = getattr(model, "config", None)
    merge = int(getattr(getattr(config, "vision_config", None), "spatial_merge_size", 1) or 1)
    out: list[Span] | None = None  # None: no kind's pixels carried
    for kind, (pixels_key, grid_key, token_name) in enumerate(KINDS):
        pixels, grid, token = kwargs.get(pixels_key), kwargs.get(grid_key), getattr(config, token_name, None)
        if isinstance(pixels, torch.Tensor) and isinstance(grid, torch.Tensor) and token is not None:
            out = [*(out or []), *_kind_spans(ids, pixels, grid, int(token), merge, kind, offset)]
    return out if out is not None else _whole_image_spans(config, ids, kwargs, offset)


def _whole_image_spans(config: Any, ids: torch.Tensor, kwargs: dict[str, Any], offset: int) -> list[Span] | None:
    """LLaVA-style images: `pixel_values` [images, channels, height, width] without a grid, each image the same
    number of placeholder tokens (`image_token_index`); None where the call is not one of those."""
    pixels = kwargs.get("pixel_values")
    token = getattr(config, "image_token_index", None)
    token = getattr(config, "image_token_id", None) if token is None else token
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or token is None:
        return None
    if kwargs.get("image_grid_thw") is not None:
        return None
    n, placed = int(pixels.shape[0]), int((ids == int(token)).sum())
    if n == 0 or placed % n:
        return None
    digests = [_digest(pixels[i]) for i in range(n)]
    return _placed(ids, int(token), [placed // n] * n, digests, 0, offset)


def _digest(pixels: torch.Tensor) -> str:
    return hashlib.blake2b(pixels.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).hexdigest()


note = spans  # at a tracked call's start: the images it writes after `past` cached slots (None: no pixels)

ENCODERS = (("get_image_features", ("pixel_values", "image_grid_thw")),
            ("get_video_features", ("pixel_values_videos", "video_grid_thw")))


class _Encoder:
    """A model's `get_image_features` (or video) that keeps the pixels and grids it is called with, per thread, for
    `encoded`; its signature is the method's (generate() reads it); a deep copy of the model encodes with its own
    weights; `remove()` (a tracker handle) puts the method back."""

    def __init__(self, owner: Any, name: str, keys: tuple[str, ...], local: Any):
        self.owner, self.name, self.keys, self.local = owner, name, keys, local
        self.__signature__ = inspect.signature(getattr(type(owner), name).__get__(owner))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = {**dict(zip(self.__signature__.parameters, args)), **kwargs}
        kept = {k: given[k] for k in self.keys if given.get(k) is not None}
        self.local.encoded = {**getattr(self.local, "encoded", {}), **kept}
        return getattr(type(self.owner), self.name)(self.owner, *args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "_Encoder":
        return _Encoder(copy.deepcopy(self.owner, memo), self.name, self.keys, self.local)

    def __reduce__(self) -> tuple:
        """Pickled with its model: the plain method (the copy loads untracked, kvresume.pickling)."""
        return (method, (self.owner, self.name))

    def remove(self) -> None:
        self.owner.__dict__.pop(self.name, None)


def hook_encoders(model: torch.nn.Module, local: Any) -> list[_Encoder]:
    """Where generate() encodes the images before its first model call and hands that call `mm_encoder_outputs`
    (5.25) instead of pixels: each encoder call's pixels and grids, kept per thread (`local`) for `encoded`."""
    if not compat.accepts(model.forward, "mm_encoder_outputs"):
        return []
    owner, out = getattr(model, "base_model", model), []
    for name, keys in ENCODERS:
        if callable(getattr(type(owner), name, None)):
            owner.__dict__[name] = _Encoder(owner, name, keys, local)  # (shadows the method on this instance)
            out.append(owner.__dict__[name])
    return out


def encoded(kwargs: dict[str, Any], local: Any) -> dict[str, Any]:
    """A forward call's kwargs with the pixels and grids its `mm_encoder_outputs` were encoded from (taken once)."""
    if kwargs.get("mm_encoder_outputs") is None:
        return kwargs
    kept, local.encoded = getattr(local, "encoded", None) or {}, {}
    return {**kwargs, **kept}


def _kind_spans(ids: torch.Tensor, pixels: torch.Tensor, grid: torch.Tensor, token: int, merge: int, kind: int,
                offset: int) -> list[Span]:
    """Spans of one kind: the placeholders of each row in order, image by image (rows of pixels per grid entry)."""
    counts = [int(t) * int(h) * int(w) for t, h, w in grid.tolist()]
    tokens = [c // (merge * merge) for c in counts]
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return _placed(ids, token, tokens, [_digest(pixels[s:s + c]) for s, c in zip(starts, counts)], kind, offset)


def _placed(ids: torch.Tensor, token: int, tokens: list[int], digests: list[str], kind: int, offset: int) -> list[Span]:
    """The spans of the images in order over each row's placeholder slots (image i: tokens[i] slots, digests[i])."""
    out, image = [], 0
    for row in range(ids.shape[0]):
        slots = (ids[row] == token).nonzero().flatten()
        taken = 0
        while image < len(tokens) and taken < slots.numel():
            chunk = slots[taken:taken + tokens[image]]
            start, end = int(chunk[0]), int(chunk[-1]) + 1
            out.append(Span(row, offset + start, offset + end, digests[image], kind, image))
            taken += tokens[image]
            image += 1
    return out


def attach(cache: Any, past: int, written: list[Span] | None) -> None:
    """After a tracked write at `past`: spans at or after `past` are overwritten; the call's own are added."""
    if cache is None:
        return
    owner = ledger_owner(cache)
    kept = [s for s in owner.__dict__.get(ATTR, ()) if s.end <= past]
    if written is None and len(kept) == len(owner.__dict__.get(ATTR, ())):
        return
    owner.__dict__[ATTR] = kept + list(written or [])


def cached_spans(cache: Any, length: int) -> list[Span]:
    """The images the cache's first `length` slots hold (spans cut by a crop count as another image)."""
    owner = ledger_owner(cache)
    return [s for s in owner.__dict__.get(ATTR, ()) if s.start < length]


def _cut(keep: int, cached: list[Span], given: list[Span]) -> int:
    """The reusable prefix: at most `keep`, ending before the first cached image the conversation does not repeat
    (other pixels, or cut by a crop) and before any given image that straddles the cut or that the cache holds no
    record of (its slots' picture unknown)."""
    same = {(s.row, s.start, s.end, s.digest) for s in given}
    known = {(s.row, s.start, s.end, s.digest) for s in cached}
    for s in cached:
        if s.start < keep and (s.row, s.start, s.end, s.digest) not in same:  # pragma: no mutate - start == keep: keep
            keep = min(keep, s.start)
    for s in given:  # split by the cut, or over cached slots written without this image's record
        if s.start < keep and (keep < s.end or (s.row, s.start, s.end, s.digest) not in known):  # pragma: no mutate - alike
            keep = s.start
    return keep


def limit_record(model: torch.nn.Module, cache: Any, input_ids: torch.Tensor, kwargs: dict[str, Any], record: Any,
                 length: int) -> None:
    """resume()'s record cut to the reusable prefix ending before the first cached image the conversation does not
    repeat and before any given image the cut would split (its reused count, reason "image" and a detail saying
    where); ids over cached image slots without pixels are refused."""
    cached = cached_spans(cache, length)
    given = spans(model, {**kwargs, "input_ids": input_ids})
    if cached and given is None and any(s.start < record.reused for s in cached):
        raise refuse("image_unverified", "the conversation's ids hold image placeholders the cache wrote with an "
                     "image, but no pixel_values were passed, so whether it is the same image cannot be told: pass "
                     "the whole conversation's pixel_values and image_grid_thw to resume()", resume=True)
    keep = record.reused if given is None else _cut(record.reused, cached, given)
    if keep < record.reused:
        record.detail = (f"the image at slot {keep} differs from the cached one's pixels (or a crop cut it): reused "
                         f"{keep} of {record.cached} cached tokens")
        record.reused, record.reason = keep, "image"


def fed(model: torch.nn.Module, input_ids: torch.Tensor, kwargs: dict[str, Any],
        keep: int) -> tuple[dict[str, Any], torch.Tensor | None, torch.Tensor | None]:
    """(the whole conversation's kwargs with pixels, grids and token types sliced to what is fed after `keep`, the fed
    tokens' 3-D positions and the model's rope_deltas from get_rope_index over the whole conversation), or (kwargs,
    None, None) where the call carries no pixels."""
    given = spans(model, {**kwargs, "input_ids": input_ids})
    if given is None:
        return kwargs, None, None
    positions, deltas = rope_index(model, input_ids, kwargs)
    return _sliced(kwargs, given, keep), (None if positions is None else positions[..., keep:]), deltas


def _sliced(kwargs: dict[str, Any], given: list[Span], keep: int) -> dict[str, Any]:
    """The kwargs of the fed part: the images that start at or after `keep`, token types from column `keep`."""
    out = dict(kwargs)
    for kind, (pixels_key, grid_key, _) in enumerate(KINDS):
        grid = kwargs.get(grid_key)
        if not isinstance(grid, torch.Tensor):
            pixels = kwargs.get(pixels_key)  # LLaVA-style: one pixel row per image
            if kind == 0 and isinstance(pixels, torch.Tensor) and pixels.dim() == 4:
                fed = sorted({s.index for s in given if s.kind == 0 and s.start >= keep})
                out[pixels_key] = pixels[fed] if fed else None
            continue
        fed = sorted({s.index for s in given if s.kind == kind and s.start >= keep})
        counts = [int(t) * int(h) * int(w) for t, h, w in grid.tolist()]
        rows = [r for i in fed for r in range(sum(counts[:i]), sum(counts[:i + 1]))]
        out[pixels_key] = kwargs[pixels_key][rows] if fed else None
        out[grid_key] = grid[fed] if fed else None
    if isinstance(kwargs.get("mm_token_type_ids"), torch.Tensor):
        out["mm_token_type_ids"] = kwargs["mm_token_type_ids"][:, keep:]
    return {k: v for k, v in out.items() if v is not None}


def rope_index(model: torch.nn.Module, input_ids: torch.Tensor,
               kwargs: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The model's own 3-D positions and rope_deltas of these ids with the call's grids, token types and mask (ones
    where none is given); (None, None) without get_rope_index."""
    owner = compat.rope_state_owner(model)
    if owner is None or not hasattr(owner, "get_rope_index"):
        return None, None
    extra = {k: kwargs[k] for k in ("image_grid_thw", "video_grid_thw") if kwargs.get(k) is not None}
    if kwargs.get("mm_token_type_ids") is not None and compat.accepts(owner.get_rope_index, "mm_token_type_ids"):
        extra["mm_token_type_ids"] = kwargs["mm_token_type_ids"]
    mask = kwargs.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) else torch.ones_like(input_ids)
    positions, deltas = owner.get_rope_index(input_ids, attention_mask=mask, **extra)
    return positions, deltas
