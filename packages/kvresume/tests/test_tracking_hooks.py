"""The tracker's hooks called one at a time, each fed the case that contradicts it: which calls the pre-hook skips, which
side's mask and positions it reads, when it takes the given positions and puts the rotary hook on or off, what the
rotary hook learns, what one chunk holds (slab, unfollowed, the model-side state), what the post-hook records (a short
write, the decode step's fast path, linear layers, a fold) and what `track` sets up."""
from __future__ import annotations

import pytest
import torch

from kvresume import images, ledger_of, linear_checks, steps, track, tracking, writes
from kvresume.compat import rotary_embedding
from kvresume.fingerprint import grown_layer, known_layer
from kvresume.ledger import TAIL, Ledger, ledger_owner
from kvresume.testing import build
from kvresume.writes import recorded
from kvresume.tracking import (UNFOLLOWED, Tracker, _chunk, _hook_rotary, _Pending, _post, _pre, _rotary, eager,
                               is_tracked)

IDS = torch.arange(10, 16).view(1, -1)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    return build("dense")


def _plain_cache(m: torch.nn.Module, ids: torch.Tensor = IDS) -> object:
    with torch.no_grad():
        return m(input_ids=ids, use_cache=True).past_key_values


def _pending(cache: object, past: int, f: int, layer: int | None = None, grown: object = None,
             given: torch.Tensor | None = None) -> _Pending:
    return _Pending(cache, past, IDS[:, :f], 1, f, None, None, layer, grown, None, given)


def test_the_pre_hook_skips_calls_that_write_nothing(dense):
    t = Tracker(dense)
    pre = _pre(t)
    for kwargs in ({}, {"input_ids": IDS[:, :0]}, {"input_ids": IDS, "use_cache": False}):
        pre(dense, (), kwargs)
        assert t.pending == [None], kwargs
    pre(dense, (), {"input_ids": IDS, "use_cache": True})
    assert t.pending[0].f == 6 and t.pending[0].cache is None and t.pending[0].past == 0


def test_the_pre_hook_reads_the_decoder_side_mask_and_positions_of_an_encoder_decoder():
    bart = build("bart")
    t = Tracker(bart, decoder=True)
    enc_mask, dec_mask = torch.ones(1, 5, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)
    pos, dec_pos = torch.arange(5).view(1, -1), torch.arange(3).view(1, -1)
    _pre(t)(bart, (), {"input_ids": torch.arange(5, 10).view(1, -1), "decoder_input_ids": torch.tensor([[2, 40, 41]]),
                       "attention_mask": enc_mask, "decoder_attention_mask": dec_mask, "position_ids": pos,
                       "decoder_position_ids": dec_pos})
    p = t.pending[0]
    assert p.f == 3 and p.mask is dec_mask and p.given is dec_pos and p.positions is dec_pos  # no rotary: the given


def test_the_trackers_decoder_flag_picks_the_fed_side(dense):
    t = Tracker(dense, decoder=True)
    _pre(t)(dense, (), {"input_ids": IDS, "decoder_input_ids": IDS[:, :2]})
    assert t.pending[0].f == 2


def test_the_pre_hook_reads_a_text_models_own_mask_and_position_ids(dense):
    t = Tracker(dense)
    mask, pos, other = torch.ones(1, 6, dtype=torch.long), torch.arange(6).view(1, -1), torch.arange(6).view(1, -1)
    _pre(t)(dense, (), {"input_ids": IDS, "attention_mask": mask, "decoder_attention_mask": IDS,
                        "position_ids": pos, "decoder_position_ids": other})
    assert t.pending[0].mask is mask and t.pending[0].given is pos and t.pending[0].positions is pos
    _pre(t)(dense, (), {"input_ids": IDS, "position_ids": [0, 1, 2, 3, 4, 5]})
    assert t.pending[0].given is None and t.pending[0].positions is None  # not a tensor: not read


def test_a_continued_cache_is_read_from_the_last_write_without_started(dense, monkeypatch):
    calls: list[int] = []
    real = steps.started
    monkeypatch.setattr(tracking, "started", lambda cache, batch: calls.append(batch) or real(cache, batch))
    with track(dense), torch.no_grad():
        cache = dense(input_ids=IDS, use_cache=True).past_key_values
        assert calls == [1]  # the first write: no cache yet
        layer = known_layer(cache)
        tail = ledger_owner(cache).__dict__[TAIL]
        assert tail.layer == layer and tail.grown is cache.layers[layer]  # where the next step continues
        t = dense.__dict__[tracking.HANDLE_ATTR]
        pos = torch.tensor([[6]])
        _pre(t)(dense, (), {"input_ids": torch.tensor([[7]]), "past_key_values": cache, "position_ids": pos})
        p = t.pending[0]
        assert calls == [1] and p.cache is cache and p.past == 6 and p.layer == layer
        assert p.grown is cache.layers[layer] and p.given is pos
        t.pending[:] = []
        dense(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
        assert calls == [1] and ledger_of(cache).length == 7


def _rotary_tracker(m: torch.nn.Module, passthrough: bool | None) -> Tracker:
    t = Tracker(m, rope=rotary_embedding(m), passthrough=passthrough)
    _hook_rotary(t)
    return t


def test_given_positions_are_taken_only_where_the_rotary_would_get_them_as_they_are(dense):
    pos2, pos3 = torch.arange(6).view(1, -1), torch.arange(6).view(1, 1, -1).expand(3, 1, 6)
    t = Tracker(dense)  # no rotary embedding: the given positions are the ones used
    _pre(t)(dense, (), {"input_ids": IDS, "position_ids": pos2})
    assert t.pending[0].positions is pos2
    t = _rotary_tracker(dense, True)
    handle = t.rope_handle
    _pre(t)(dense, (), {"input_ids": IDS, "position_ids": pos2})
    assert t.pending[0].positions is pos2 and t.rope_handle is None and handle not in t.handles  # hook taken off
    _pre(t)(dense, (), {"input_ids": IDS, "position_ids": pos3})
    assert t.pending[0].positions is None and t.rope_handle is not None  # 3 M-RoPE rows: the rotary reads them again
    _pre(t)(dense, (), {"input_ids": IDS})
    assert t.pending[0].positions is None and t.rope_handle is not None
    t = _rotary_tracker(dense, False)
    _pre(t)(dense, (), {"input_ids": IDS, "position_ids": pos2})
    assert t.pending[0].positions is None and t.rope_handle is not None  # not passed on as they are: the rotary reads


def test_the_rotary_hook_learns_passthrough_only_from_the_given_2d_ids_passed_on_as_they_are(dense):
    pos2, pos3 = torch.arange(6).view(1, -1), torch.arange(6).view(1, 1, -1).expand(3, 1, 6)

    def seen(given: torch.Tensor, got: torch.Tensor, **fields: object) -> Tracker:
        t = Tracker(dense, rope=rotary_embedding(dense), **fields)
        rot = _rotary(t)
        rot(t.rope, (None, got), {})  # nothing pending: nothing read
        t.pending[:] = [_pending(None, 0, 6, given=given)]
        rot(t.rope, (None, got), {})
        assert t.pending[0].positions is got
        return t

    assert seen(pos2, pos2).passthrough is True
    assert seen(pos2, pos2.clone()).passthrough is False  # the model made its own
    assert seen(pos2, pos2, rope_state=True).passthrough is False and seen(pos2, pos2, decoder=True).passthrough is False
    assert seen(pos3, pos3).passthrough is None  # M-RoPE rows: not learnt
    assert seen(pos2, pos2, passthrough=False).passthrough is False  # learnt once


def test_a_chunk_copies_the_grown_layers_written_keys(dense):
    cache = _plain_cache(dense)
    layer = known_layer(cache)
    grown = grown_layer(cache, layer)
    w = _chunk(Tracker(dense), _pending(cache, 2, 4, layer, grown), cache)
    assert w.slab is True and w.prints.equal(grown.keys[:, :, 2:6]) and w.prints.data_ptr() != grown.keys.data_ptr()
    w = _chunk(Tracker(dense), _pending(cache, 2, 4, layer), cache)  # no grown layer: slot fingerprints
    assert w.slab is False and w.prints.shape[:2] == (1, 4)


def test_a_chunk_whose_slots_the_cache_cannot_show_is_unfollowed(dense):
    cache = _plain_cache(dense)
    assert _chunk(Tracker(dense), _pending(cache, 4, 6, known_layer(cache)), cache) is None  # past the keys
    assert ledger_owner(cache).__dict__[UNFOLLOWED] == "its last full-attention layer lacks the slots"
    w = _chunk(Tracker(dense), _pending(cache, 0, 6), cache)  # no layer, nothing quantized: kept without prints
    assert w is not None and w.prints is None
    cache.layers[0].residual_length = 4  # a quantized layer
    assert _chunk(Tracker(dense), _pending(cache, 0, 6), cache) is None
    assert "quantized" in ledger_owner(cache).__dict__[UNFOLLOWED]


def test_a_chunk_keeps_a_copy_of_the_model_side_state_only_where_the_tracker_reads_it():
    m = build("dense")
    cache = _plain_cache(m)
    m.model.rope_deltas = torch.tensor([[3]])
    w = _chunk(Tracker(m, rope_state=True), _pending(cache, 0, 6), cache)
    assert w.state.equal(m.model.rope_deltas) and w.state is not m.model.rope_deltas
    assert _chunk(Tracker(m), _pending(cache, 0, 6), cache).state is None


def test_the_post_hook_leaves_a_short_write_untracked(dense):
    t = Tracker(dense)
    post = _post(t)
    post(dense, (), {}, None)  # nothing pending
    cache = _plain_cache(dense)
    t.pending[:] = [_pending(cache, 0, 4)]  # the cache took 6 slots, not 4
    post(dense, (), {}, None)
    assert ledger_of(cache) is None and recorded(cache) is None and t.pending == []


def test_the_grown_layer_not_the_reported_length_tells_what_a_write_took(dense):
    t = Tracker(dense)
    cache = _plain_cache(dense)
    cache.get_seq_length = lambda *_: 0  # a cache reporting another count (5.25.0: linear layers count their own)
    t.pending[:] = [_pending(cache, 0, 6)]
    _post(t)(dense, (), {}, None)
    assert recorded(cache) == (6, 1)


def test_a_text_write_over_an_images_slots_drops_the_image(dense):
    cache = _plain_cache(dense)
    ledger_owner(cache).__dict__[images.ATTR] = [images.Span(0, 4, 6, "digest", 0, 0)]
    t = Tracker(dense)
    t.pending[:] = [_pending(cache, 0, 6)]  # no pictures in this call
    _post(t)(dense, (), {}, None)
    assert recorded(cache) == (6, 1) and ledger_owner(cache).__dict__[images.ATTR] == []


def test_a_fold_keeps_the_tail_and_the_next_write_goes_on_in_it(dense, monkeypatch):
    monkeypatch.setattr(writes, "FOLD", 2)
    with track(dense), torch.no_grad():
        cache = dense(input_ids=IDS, use_cache=True).past_key_values
        tail = ledger_owner(cache).__dict__[TAIL]
        for n, tok in enumerate((7, 8, 9)):  # given their positions: the second and third take the decode path
            dense(input_ids=torch.tensor([[tok]]), position_ids=torch.tensor([[IDS.shape[1] + n]]),
                  past_key_values=cache, use_cache=True)
        assert ledger_owner(cache).__dict__[TAIL] is tail and [type(c) for c in tail.chunks] == [Ledger]
        dense(input_ids=torch.tensor([[10]]), past_key_values=cache, use_cache=True)
    assert ledger_of(cache).token_ids.tolist() == [IDS[0].tolist() + [7, 8, 9, 10]]


def test_linear_layers_are_marked_after_each_write_and_only_on_a_model_that_has_them(dense):
    hybrid = build("hybrid")
    with track(hybrid) as t, torch.no_grad():
        cache = hybrid(input_ids=IDS, use_cache=True).past_key_values
        assert t.linear is True and [n for n, _ in getattr(ledger_owner(cache), linear_checks.ATTR)] == [6]
        hybrid(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
        assert [n for n, _ in getattr(ledger_owner(cache), linear_checks.ATTR)] == [6, 7]
    with track(dense) as t, torch.no_grad():
        dense(input_ids=IDS, use_cache=True)
        assert t.linear is False


def test_track_reads_the_rotary_the_state_and_the_side_and_removes_cleanly():
    m, bart = build("dense"), build("bart")
    t = track(m)
    assert is_tracked(m) and t.rope is rotary_embedding(m) and t.rope_handle in t.handles and len(t.handles) == 3
    assert t.rope_state is False and t.decoder is False
    t.remove()
    t.remove()  # twice: nothing left to take off
    assert not is_tracked(m)
    m.model.rope_deltas = None
    with track(m) as t, track(bart) as b:
        assert t.rope_state is True and b.decoder is True and b.rope_state is False


def test_eager_passes_keyword_arguments_and_is_skipped_compiled(dense):
    got: list[object] = []
    hook = eager(lambda x=None: got.append(x))
    hook(x=1)
    t = Tracker(dense)
    pre, post = _pre(t), _post(t)  # the model's hooks make the same check themselves
    torch.compile(lambda y: (hook(x=2), pre(dense, (), {}), post(dense, (), {}, None), y + 1)[3],
                  backend="eager")(torch.ones(2))
    torch.compiler.reset()
    assert got == [1] and getattr(t.local, "pending", None) is None
    pre(dense, (), {})
    assert t.local.pending == [None], "run eagerly, the pre-hook sets its pending write"


def test_a_continued_step_whose_cache_took_other_slots_is_left_untracked(dense):
    with track(dense), torch.no_grad():
        cache = dense(input_ids=IDS, use_cache=True).past_key_values
    t = Tracker(dense, text=True)
    step = {"input_ids": torch.tensor([[7]]), "position_ids": torch.tensor([[6]]), "past_key_values": cache}
    _pre(t)(dense, (), step)
    assert t.pending[0][0] is ledger_owner(cache).__dict__[TAIL]  # a decode step continuing the last write
    with torch.no_grad():
        dense(input_ids=torch.tensor([[7, 8]]), past_key_values=cache, use_cache=True)  # two slots, not one
    _post(t)(dense, (), {}, None)
    assert ledger_of(cache) is None and recorded(cache) is None


def test_only_a_text_models_decode_step_given_its_own_2d_positions_takes_the_decode_path(dense):
    with track(dense), torch.no_grad():
        cache = dense(input_ids=IDS, use_cache=True).past_key_values
    step = {"input_ids": torch.tensor([[7]]), "position_ids": torch.tensor([[6]]), "past_key_values": cache}
    for tracker, kwargs in ((Tracker(dense), step), (Tracker(dense, text=True), {**step, "position_ids": None}),
                            (Tracker(dense, text=True), {**step, "position_ids": torch.tensor([[[6]]] * 3)}),
                            (Tracker(dense, text=True), {**step, "pixel_values": torch.ones(1)}),
                            (Tracker(dense, text=True, rope=dense, rope_handle=torch.nn.Identity().register_forward_pre_hook(print)), step)):
        _pre(tracker)(dense, (), kwargs)
        assert not isinstance(tracker.pending[0], tuple)
