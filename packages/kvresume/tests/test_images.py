"""A Qwen3-VL conversation passed whole to resume(): image slots keyed by their pixels, "a cache hit equals a miss".

Each case compares resume() on a cache of turn 1 with a no-cache generate() of the whole conversation: the greedy
tokens equal, the first step's logits within the floor, and the reused-token count (what the first model call did
not have to feed) asserted.
"""
from __future__ import annotations

import pytest
import torch

import kvresume
from kvresume import testing as T

NEW = 4


@pytest.fixture(scope="module")
def vl() -> torch.nn.Module:
    model = T.build("multimodal")
    kvresume.track(model)
    return model


def _config() -> dict:
    return dict(do_sample=False, max_new_tokens=NEW, return_dict_in_generate=True, output_logits=True, pad_token_id=0)


def _fed(model: torch.nn.Module, run) -> tuple[object, int]:
    """(run()'s output, the tokens its first model call was fed)."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(int(kw["input_ids"].shape[-1])) if kw.get("input_ids") is not None else None,
        with_kwargs=True)
    try:
        return run(), seen[0]
    finally:
        handle.remove()


def _reference(model: torch.nn.Module, conversation: dict) -> object:
    model.model.rope_deltas = None
    return model.generate(**conversation, **_config())


def _check(model: torch.nn.Module, conversation: dict, cache, reused: int) -> None:
    """resume() with the whole conversation equals the no-cache run and reuses `reused` cached tokens."""
    ref = _reference(model, conversation)
    extra = {k: v for k, v in conversation.items() if k != "input_ids"}
    out, fed = _fed(model, lambda: kvresume.resume(model, conversation["input_ids"], cache, **extra, **_config()))
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    T.assert_close(out.logits[0], ref.logits[0], "multimodal")
    assert conversation["input_ids"].shape[-1] - fed == reused


def _with_image_a_replaced(conversation: dict) -> dict:
    """The same token ids, turn 1's image replaced by another picture of the same size."""
    out = dict(conversation)
    rows = int(T.prompt("multimodal")["image_grid_thw"].prod())
    other = torch.randn(rows, conversation["pixel_values"].shape[1], generator=torch.Generator().manual_seed(7))
    out["pixel_values"] = torch.cat([other, conversation["pixel_values"][rows:]])
    return out


def test_turn_two_with_a_new_image_passed_whole_reuses_turn_one(vl):
    cache = T.first_turn_cache(vl)
    _check(vl, T.both_turns(), cache, reused=T.prompt("multimodal")["input_ids"].shape[-1])


def test_turn_two_text_only_passed_whole_reuses_turn_one(vl):
    cache = T.first_turn_cache(vl)
    _check(vl, T.both_turns(text_only=True), cache, reused=T.prompt("multimodal")["input_ids"].shape[-1])


def test_another_image_behind_the_same_ids_ends_the_prefix_before_it(vl):
    cache = T.first_turn_cache(vl)
    conversation = _with_image_a_replaced(T.both_turns())
    first_placeholder = int((conversation["input_ids"][0] == T.IMAGE_TOKEN).nonzero()[0])
    _check(vl, conversation, cache, reused=first_placeholder)
    record = kvresume.resume_report(cache)
    assert (record.reason, record.reused, record.cached) == ("image", first_placeholder, 82)


def test_the_same_ids_without_pixels_are_refused_and_passing_them_restores(vl):
    cache = T.first_turn_cache(vl)
    conversation = T.both_turns(text_only=True)
    with pytest.raises(kvresume.ResumeInputError) as refused:
        kvresume.resume(vl, conversation["input_ids"], cache, **_config())
    assert refused.value.check == "image_unverified" and "pixel_values" in str(refused.value)
    _check(vl, conversation, cache, reused=T.prompt("multimodal")["input_ids"].shape[-1])


def test_a_crop_inside_an_image_and_a_rewrite_drop_its_span(vl):
    """A cache cropped inside turn 1's image and written on with text holds no image there any more."""
    from kvresume import images

    cache = T.first_turn_cache(vl)
    spans = images.cached_spans(cache, cache.get_seq_length())
    assert [(s.start, s.end) for s in spans] == [(13, 62)]
    images.attach(cache, 20, None)
    assert images.cached_spans(cache, 20) == []


def test_spans_place_each_image_on_its_placeholders():
    from kvresume import images

    conversation = T.both_turns()
    got = images.spans(T.model("multimodal"), conversation)
    assert [(s.start, s.end, s.index) for s in got] == [(13, 62, 0), (91, 116, 1)]
    assert got[0].digest != got[1].digest


def test_cut_ends_before_a_changed_image_and_a_straddling_one():
    """The decision `_cut` fed contradicting cases: same pixels keep all; other pixels, or a given image the cut would
    split, end the prefix at that image's first slot."""
    from kvresume.images import Span, _cut

    cached = [Span(0, 13, 62, "a", 0, 0)]
    assert _cut(82, cached, [Span(0, 13, 62, "a", 0, 0)]) == 82
    assert _cut(82, cached, [Span(0, 13, 62, "b", 0, 0)]) == 13
    assert _cut(82, cached, [Span(0, 13, 62, "a", 0, 0), Span(0, 70, 95, "c", 0, 1)]) == 70
    assert _cut(82, [], [Span(0, 13, 62, "a", 0, 0)]) == 13  # pixels given for slots the cache holds as text
