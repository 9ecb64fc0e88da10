"""kvresume.images on hand-made ids, pixels and grids (no model runs): the spans each kind of image places (Qwen-style
grids, videos, LLaVA-style whole images), the encoder wrappers 5.25's generate() calls and what they keep, the
spans a write keeps, the reusable cut, the refusal of image ids without pixels, the fed slices."""
from __future__ import annotations

import copy
import inspect
import pickle
import threading
from types import SimpleNamespace

import pytest
import torch

from kvresume import images as im
from kvresume.call import ResumeInputError

T = torch.tensor
IMG, VID = 7, 8


def qwen(merge=2, **extra):
    vision = SimpleNamespace(spatial_merge_size=merge)
    return SimpleNamespace(config=SimpleNamespace(vision_config=vision, image_token_id=IMG, video_token_id=VID, **extra))


def pixels(rows, seed=0):
    return torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) + seed


def test_grid_images_span_their_placeholders_with_their_pixels_hash():
    ids = T([[1, IMG, 2, IMG, IMG, 3]])
    grid = T([[1, 2, 2], [1, 2, 4]])  # 4 and 8 pixel rows: 1 and 2 tokens after a 2x2 merge
    px = pixels(12)
    got = im.spans(qwen(merge=2), {"input_ids": ids, "pixel_values": px, "image_grid_thw": grid}, offset=10)
    assert [(s.row, s.start, s.end, s.kind, s.index) for s in got] == [(0, 11, 12, 0, 0), (0, 13, 15, 0, 1)]
    assert got[0].digest == im._digest(px[:4]) and got[1].digest == im._digest(px[4:12])
    assert got[0].digest != got[1].digest and len(got[0].digest) == 32


def test_a_merge_of_one_and_images_over_rows_and_videos():
    ids = T([[IMG, IMG, VID, 0], [IMG, IMG, VID, VID]])
    kwargs = {"input_ids": ids, "pixel_values": pixels(4), "image_grid_thw": T([[1, 1, 2], [1, 2, 1]]),
              "pixel_values_videos": pixels(3, 5), "pixel_values_extra": None, "video_grid_thw": T([[1, 1, 1], [1, 1, 2]])}
    got = im.spans(qwen(merge=1), kwargs)
    assert [(s.row, s.start, s.end, s.kind, s.index) for s in got] == [
        (0, 0, 2, 0, 0), (1, 0, 2, 0, 1), (0, 2, 3, 1, 0), (1, 2, 4, 1, 1)]
    no_merge = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=None),
                                                      image_token_id=IMG))
    assert len(im.spans(no_merge, {"input_ids": ids[:1], "pixel_values": pixels(2), "image_grid_thw": T([[1, 1, 2]])})) == 1


def test_no_spans_without_2d_ids_or_pixels():
    kwargs = {"pixel_values": pixels(4), "image_grid_thw": T([[1, 2, 2]])}
    assert im.spans(qwen(), {**kwargs, "input_ids": T([IMG])}) is None
    assert im.spans(qwen(), kwargs) is None
    assert im.spans(qwen(), {"input_ids": T([[IMG]])}) is None
    assert im.spans(qwen(), {"input_ids": T([[1, 2]]), **kwargs}) == []  # pixels, no placeholder: no span
    no_token = SimpleNamespace(config=SimpleNamespace(vision_config=None))
    assert im.spans(no_token, {"input_ids": T([[IMG]]), **kwargs}) is None


def llava(**extra):
    return SimpleNamespace(config=SimpleNamespace(image_token_index=IMG, **extra))


def test_whole_images_split_their_placeholders_evenly():
    ids = T([[1, IMG, IMG, 2, IMG, IMG]])
    px = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2)
    got = im.spans(llava(), {"input_ids": ids, "pixel_values": px}, offset=3)
    assert [(s.row, s.start, s.end, s.kind, s.index) for s in got] == [(0, 4, 6, 0, 0), (0, 7, 9, 0, 1)]
    assert [s.digest for s in got] == [im._digest(px[0]), im._digest(px[1])]
    by_id = SimpleNamespace(config=SimpleNamespace(image_token_index=None, image_token_id=IMG))
    assert len(im.spans(by_id, {"input_ids": ids, "pixel_values": px})) == 2
    assert im.spans(llava(), {"input_ids": ids, "pixel_values": px[:, 0]}) is None  # 3-D
    assert im.spans(llava(), {"input_ids": T([[IMG, IMG, IMG]]), "pixel_values": px}) is None  # uneven
    assert im.spans(llava(), {"input_ids": T([[1]]), "pixel_values": px[:0]}) is None  # no image
    assert im.spans(SimpleNamespace(config=SimpleNamespace()), {"input_ids": ids, "pixel_values": px}) is None
    grid = {"input_ids": ids, "pixel_values": px, "image_grid_thw": [1]}  # a grid given (not a tensor): not these
    assert im._whole_image_spans(llava().config, ids, grid, 0) is None


class Owner:
    def get_image_features(self, pixel_values, image_grid_thw=None, extra=None):
        return ("image", self, pixel_values, image_grid_thw)

    def get_video_features(self, pixel_values_videos, video_grid_thw=None):
        return ("video", self, pixel_values_videos)


def model_with_encoders():
    class Model:
        def forward(self, input_ids=None, mm_encoder_outputs=None):
            pass

    m = Model()
    m.base_model = Owner()
    return m


def test_encoders_are_wrapped_where_generate_encodes_first_and_keep_what_they_were_given():
    local = threading.local()
    m = model_with_encoders()
    wrapped = im.hook_encoders(m, local)
    owner = m.base_model
    assert [e.name for e in wrapped] == ["get_image_features", "get_video_features"]
    assert owner.get_image_features is wrapped[0] and wrapped[0].keys == ("pixel_values", "image_grid_thw")
    assert list(inspect.signature(wrapped[0]).parameters) == ["pixel_values", "image_grid_thw", "extra"]
    assert owner.get_image_features("px", image_grid_thw=None) == ("image", owner, "px", None)
    assert local.encoded == {"pixel_values": "px"}
    owner.get_video_features(pixel_values_videos="v", video_grid_thw="g")
    assert local.encoded == {"pixel_values": "px", "pixel_values_videos": "v", "video_grid_thw": "g"}
    got = im.encoded({"mm_encoder_outputs": "enc", "input_ids": 1}, local)
    assert got == {"mm_encoder_outputs": "enc", "input_ids": 1, "pixel_values": "px", "pixel_values_videos": "v",
                   "video_grid_thw": "g"}
    assert local.encoded == {}
    assert im.encoded({"mm_encoder_outputs": "enc"}, SimpleNamespace()) == {"mm_encoder_outputs": "enc"}
    plain = {"input_ids": 1, "mm_encoder_outputs": None}
    assert im.encoded(plain, local) is plain
    wrapped[0].remove()
    assert "get_image_features" not in vars(owner) and owner.get_image_features("q")[0] == "image"
    wrapped[0].remove()  # twice: nothing left to remove


def test_a_wrapped_encoder_copies_with_its_model_and_pickles_as_the_plain_method():
    m = model_with_encoders()
    enc = im.hook_encoders(m, threading.local())[0]
    twin = copy.deepcopy(enc)
    assert twin.owner is not enc.owner and twin.name == enc.name and twin.keys == enc.keys and twin.local is enc.local
    assert twin("p")[1] is twin.owner
    fn, args = enc.__reduce__()
    assert fn is im.method and args == (m.base_model, "get_image_features")
    loaded = pickle.loads(pickle.dumps(m.base_model))
    assert "get_image_features" not in vars(loaded) or loaded.get_image_features.__self__ is loaded


def test_no_encoders_are_wrapped_where_the_forward_takes_no_encoder_outputs():
    m = SimpleNamespace(forward=lambda input_ids=None: None, base_model=Owner())
    assert im.hook_encoders(m, threading.local()) == []
    class Own:  # noqa: E306 - an owner without a video encoder, as the model itself (no base_model)
        def forward(self, mm_encoder_outputs=None):
            pass

        def get_image_features(self, pixel_values):
            return pixel_values

    own = Own()
    assert [e.name for e in im.hook_encoders(own, threading.local())] == ["get_image_features"]


def span(start, end, digest="a", row=0, kind=0, index=0):
    return im.Span(row, start, end, digest, kind, index)


def test_a_write_keeps_the_spans_before_it_and_adds_its_own():
    cache = SimpleNamespace()
    im.attach(None, 0, [span(0, 2)])  # no cache: nothing
    im.attach(cache, 0, None)
    assert im.ATTR not in vars(cache)
    im.attach(cache, 0, [span(1, 3), span(4, 6, "b")])
    im.attach(cache, 6, None)  # nothing overwritten, nothing new: kept as it is
    assert vars(cache)[im.ATTR] == [span(1, 3), span(4, 6, "b")]
    im.attach(cache, 5, [span(5, 7, "c")])
    assert vars(cache)[im.ATTR] == [span(1, 3), span(5, 7, "c")]
    im.attach(cache, 3, None)
    assert vars(cache)[im.ATTR] == [span(1, 3)]
    assert im.cached_spans(cache, 1) == [] and im.cached_spans(cache, 2) == [span(1, 3)]
    inner = SimpleNamespace()
    im.attach(SimpleNamespace(self_attention_cache=inner), 0, [span(0, 1)])
    assert vars(inner)[im.ATTR] == [span(0, 1)]


def test_the_reusable_cut():
    cached = [span(2, 4, "a"), span(6, 8, "b")]
    assert im._cut(10, cached, list(cached)) == 10
    assert im._cut(10, cached, [span(2, 4, "a"), span(6, 8, "x")]) == 6  # another picture at 6
    assert im._cut(7, cached, [span(2, 4, "a"), span(6, 9, "b")]) == 6  # other slots: not the cached image
    assert im._cut(6, cached, [span(2, 4, "a")]) == 6  # the cached image at 6 lies past the cut
    assert im._cut(3, [span(2, 4, "a")], [span(2, 4, "a")]) == 2  # the cut splits it
    assert im._cut(4, [span(2, 4, "a")], [span(2, 4, "a")]) == 4  # right after it
    assert im._cut(10, [], [span(5, 7)]) == 5  # the cache holds no record of it
    assert im._cut(5, [], [span(5, 7)]) == 5
    assert im._cut(10, [span(2, 4, row=1)], [span(2, 4)]) == 2  # another row


def record(reused, cached=10):
    return SimpleNamespace(reused=reused, cached=cached, reason="extends", detail="")


def cache_holding(*spans):
    cache = SimpleNamespace()
    vars(cache)[im.ATTR] = list(spans)
    return cache


def test_resume_cuts_its_record_before_another_picture_and_refuses_image_ids_without_pixels():
    ids = T([[1, IMG, IMG, 2, 3, 4]])
    px = torch.ones(1, 3, 2, 2)
    cache = cache_holding(span(1, 3, im._digest(px[0] * 2)))
    rec = record(5)
    im.limit_record(llava(), cache, ids, {"pixel_values": px}, rec, 5)
    assert (rec.reused, rec.reason) == (1, "image") and rec.detail == (
        "the image at slot 1 differs from the cached one's pixels (or a crop cut it): reused 1 of 10 cached tokens")
    same = cache_holding(span(1, 3, im._digest(px[0])))
    rec = record(5)
    im.limit_record(llava(), same, ids, {"pixel_values": px}, rec, 5)
    assert (rec.reused, rec.reason, rec.detail) == (5, "extends", "")
    with pytest.raises(ResumeInputError) as info:
        im.limit_record(llava(), same, ids, {}, record(2), 5)
    assert info.value.check == "image_unverified" and info.value.fix == {"resume": True}
    assert str(info.value) == (
        "the conversation's ids hold image placeholders the cache wrote with an image, but no pixel_values were passed, "
        "so whether it is the same image cannot be told: pass the whole conversation's pixel_values and image_grid_thw "
        "to resume()")
    rec = record(1)
    im.limit_record(llava(), same, ids, {}, rec, 5)  # the reuse ends before the image: nothing to tell
    assert rec.reused == 1
    rec = record(4)
    im.limit_record(llava(), SimpleNamespace(), T([[1, 2, 3, 4]]), {}, rec, 4)  # no image anywhere
    assert (rec.reused, rec.reason) == (4, "extends")
    rec = record(2)
    im.limit_record(llava(), cache_holding(span(3, 5)), ids, {}, rec, 2)  # cached past the length read: none
    assert rec.reused == 2


def test_the_fed_part_gets_the_images_that_start_after_the_cut():
    grid = T([[1, 1, 2], [1, 2, 2], [1, 1, 1]])  # 2, 4 and 1 pixel rows
    px = torch.arange(7, dtype=torch.float32).view(7, 1)
    given = [span(0, 2, index=0), span(4, 6, index=1), span(8, 9, index=2)]
    kwargs = {"pixel_values": px, "image_grid_thw": grid, "mm_token_type_ids": T([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]),
              "input_ids": "kept"}
    out = im._sliced(kwargs, given, 4)
    assert torch.equal(out["pixel_values"], px[2:7]) and torch.equal(out["image_grid_thw"], grid[1:])
    assert torch.equal(out["mm_token_type_ids"], T([[4, 5, 6, 7, 8, 9]])) and out["input_ids"] == "kept"
    out = im._sliced(kwargs, given, 5)
    assert torch.equal(out["pixel_values"], px[6:7]) and torch.equal(out["image_grid_thw"], grid[2:])
    out = im._sliced(kwargs, given, 9)
    assert "pixel_values" not in out and "image_grid_thw" not in out
    assert kwargs["pixel_values"] is px  # the caller's kwargs untouched


def test_the_fed_part_of_whole_images_and_of_videos():
    px = torch.arange(3 * 3 * 2 * 2, dtype=torch.float32).view(3, 3, 2, 2)
    given = [span(0, 2, index=0), span(2, 4, index=1), span(4, 6, index=2)]
    out = im._sliced({"pixel_values": px}, given, 2)
    assert torch.equal(out["pixel_values"], px[1:])
    assert "pixel_values" not in im._sliced({"pixel_values": px}, given, 6)
    flat = torch.ones(3, 4)
    assert im._sliced({"pixel_values": flat}, given, 2)["pixel_values"] is flat  # no grid, not 4-D: as given
    videos = {"pixel_values_videos": torch.arange(3.0).view(3, 1), "video_grid_thw": T([[1, 1, 1], [1, 1, 2]])}
    out = im._sliced(videos, [span(0, 1, kind=1, index=0), span(3, 5, kind=1, index=1), span(0, 2, index=0)], 2)
    assert torch.equal(out["pixel_values_videos"], T([[1.0], [2.0]])) and torch.equal(out["video_grid_thw"], T([[1, 1, 2]]))


def test_without_pixels_the_fed_kwargs_are_the_callers_and_without_get_rope_index_no_positions():
    kwargs = {"attention_mask": None}
    assert im.fed(llava(), T([[1, 2]]), kwargs, 1) == (kwargs, None, None)
    assert im.rope_index(SimpleNamespace(), T([[1]]), {}) == (None, None)
    assert im.rope_index(SimpleNamespace(rope_deltas=None), T([[1]]), {}) == (None, None)


def test_rope_index_gets_the_grids_the_token_types_where_taken_and_a_mask_of_ones():
    seen = {}

    class Owner3D:
        rope_deltas = None

        def get_rope_index(self, input_ids, attention_mask=None, image_grid_thw=None, video_grid_thw=None,
                           mm_token_type_ids=None):
            seen.update(mask=attention_mask, image=image_grid_thw, video=video_grid_thw, types=mm_token_type_ids)
            return torch.arange(3 * input_ids.shape[-1]).view(3, 1, -1), T([[5]])

    m = SimpleNamespace(model=Owner3D(), config=qwen().config)
    ids = T([[1, IMG, 2, IMG, IMG, 3]])
    kwargs = {"pixel_values": pixels(12), "image_grid_thw": T([[1, 2, 2], [1, 2, 4]]), "mm_token_type_ids": T([[9]])}
    out, positions, deltas = im.fed(m, ids, kwargs, 3)
    assert torch.equal(positions, torch.arange(18).view(3, 1, 6)[..., 3:]) and torch.equal(deltas, T([[5]]))
    assert torch.equal(seen["mask"], torch.ones_like(ids)) and torch.equal(seen["image"], kwargs["image_grid_thw"])
    assert seen["video"] is None and torch.equal(seen["types"], T([[9]]))
    assert torch.equal(out["image_grid_thw"], T([[1, 2, 4]]))
    mask = torch.zeros_like(ids)
    im.rope_index(m, ids, {"attention_mask": mask, "video_grid_thw": T([[1, 1, 1]])})
    assert seen["mask"] is mask and seen["image"] is None and torch.equal(seen["video"], T([[1, 1, 1]]))

    class NoTypes(Owner3D):
        def get_rope_index(self, input_ids, attention_mask=None, image_grid_thw=None):
            seen.update(types="not taken")
            return None, None

    m.model = NoTypes()
    assert im.rope_index(m, ids, kwargs) == (None, None) and seen["types"] == "not taken"
    assert im.fed(m, ids, kwargs, 3)[1] is None


def test_three_images_in_a_row_and_placeholders_past_the_last_image():
    ids = T([[IMG, 1, IMG, IMG, IMG, IMG, IMG]])
    grid = T([[1, 1, 1], [1, 1, 2], [1, 1, 1]])  # 1, 2 and 1 tokens (merge 1); two placeholders left over
    got = im.spans(qwen(merge=1), {"input_ids": ids, "pixel_values": pixels(4), "image_grid_thw": grid})
    assert [(s.start, s.end, s.index) for s in got] == [(0, 1, 0), (2, 4, 1), (4, 5, 2)]


def test_a_model_without_a_config_or_a_merge_size():
    assert im.spans(SimpleNamespace(), {"input_ids": T([[IMG]]), "pixel_values": pixels(1),
                                        "image_grid_thw": T([[1, 1, 1]])}) is None
    plain = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(), image_token_id=IMG))
    got = im.spans(plain, {"input_ids": T([[IMG, IMG]]), "pixel_values": pixels(2), "image_grid_thw": T([[1, 1, 2]])})
    assert [(s.start, s.end) for s in got] == [(0, 2)]  # a merge of 1: two tokens
