"""What the tracker reads of each call, each fed the case that contradicts it: the fed ids (1-D, a batch, embeddings,
an encoder-decoder's decoder side), the positions a rotary embedding receives (keyword or positional), a forward's
positional parameters, one tracker per model, and the ledger a positional call, an embeddings call and a decoder record."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvresume import ledger_of, track
from kvresume.ledger import UNKNOWN
from kvresume.testing import build
from kvresume.call import is_encoder_decoder as _decoder
from kvresume.tracking import _named, fed_ids, rotary_positions

IDS = torch.arange(10, 16).view(1, -1)


def test_the_decoder_flag_comes_from_the_config_alone():
    assert _decoder(SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))) is True
    assert _decoder(SimpleNamespace(config=SimpleNamespace())) is False and _decoder(SimpleNamespace()) is False


def test_fed_ids_read_the_ids_or_embeddings_of_the_side_that_writes_the_cache():
    dec = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
    plain = SimpleNamespace(config=SimpleNamespace())
    ids, batch, n = fed_ids(plain, {"input_ids": torch.tensor([4, 5, 6])})
    assert ids.tolist() == [[4, 5, 6]] and (batch, n) == (1, 3)
    ids, batch, n = fed_ids(plain, {"input_ids": torch.zeros(2, 5, dtype=torch.long)})
    assert (batch, n) == (2, 5)
    assert fed_ids(plain, {"inputs_embeds": torch.zeros(3, 4, 8)}) == (None, 3, 4)
    assert fed_ids(plain, {}) == (None, None, None)
    both = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "decoder_input_ids": torch.zeros(2, 3, dtype=torch.long)}
    assert fed_ids(dec, both)[1:] == (2, 3) and fed_ids(plain, both)[1:] == (1, 7)
    assert fed_ids(plain, both, decoder=True)[1:] == (2, 3) and fed_ids(dec, both, decoder=False)[1:] == (1, 7)
    assert fed_ids(dec, {"decoder_inputs_embeds": torch.zeros(2, 6, 8)}) == (None, 2, 6)


def test_rotary_positions_are_the_keyword_or_the_second_positional_argument():
    pos = torch.arange(3).view(1, -1)
    assert rotary_positions((None, pos), {}) is pos and rotary_positions((None,), {"position_ids": pos}) is pos
    assert rotary_positions((None,), {}) is None and rotary_positions((None, [0, 1]), {}) is None
    assert rotary_positions((None, pos, "third"), {}) is pos


def test_named_lists_the_positional_parameters_only():
    class M(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, *, past_key_values=None, **kwargs):
            return input_ids

    assert _named(M()) == ["input_ids", "attention_mask"]


def test_one_tracker_per_model_and_a_positional_call_or_embeddings_are_recorded():
    m = build("dense")
    tracker = track(m)
    try:
        assert track(m) is tracker and len(tracker.handles) >= 2
        with torch.no_grad():
            cache = m(IDS, use_cache=True).past_key_values  # input_ids passed positionally
            assert ledger_of(cache).token_ids.equal(IDS) and ledger_of(cache).positions.tolist() == [[list(range(6))]]
            embeds = m.get_input_embeddings()(IDS)
            cache = m(inputs_embeds=embeds, use_cache=True).past_key_values
        assert ledger_of(cache).token_ids.tolist() == [[UNKNOWN] * 6]
    finally:
        tracker.remove()
    with torch.no_grad():
        assert ledger_of(m(IDS, use_cache=True).past_key_values) is None  # removed: untracked


def test_an_encoder_decoder_records_the_decoder_ids():
    bart = build("bart")
    enc = torch.tensor([[5, 6, 7, 8, 9]])
    with track(bart), torch.no_grad():
        out = bart(input_ids=enc, decoder_input_ids=torch.tensor([[2, 40, 41]]), use_cache=True)
    cache = out.past_key_values
    assert ledger_of(cache).token_ids.tolist() == [[2, 40, 41]]


def _cache(m: torch.nn.Module, ids: torch.Tensor) -> object:
    with track(m), torch.no_grad():
        return m(input_ids=ids, use_cache=True).past_key_values


def test_rebase_fits_the_stored_ledger_to_the_cache_before_a_write_or_leaves_it_untracked():
    from kvresume import kv_cache_from_tensors
    from kvresume.ledger import stored_ledger
    from kvresume.steps import rebase as _rebase

    m = build("dense")
    ids = torch.arange(10, 22).view(2, 6)
    with torch.no_grad():
        assert _rebase(m(input_ids=ids, use_cache=True).past_key_values, 6, 2) is False  # untracked
    cache = _cache(m, ids)
    assert _rebase(cache, 7, 2) is False  # written past the ledger while untracked
    before = stored_ledger(cache)
    assert _rebase(cache, 6, 2) is True and stored_ledger(cache) is before  # nothing to fit
    assert _rebase(cache, 4, 2) is True and stored_ledger(cache).token_ids.equal(ids[:, :4])  # a crop
    twice = _cache(m, ids)
    twice.batch_repeat_interleave(2)
    assert _rebase(twice, 6, 4) is True
    assert stored_ledger(twice).token_ids.tolist() == [ids[0].tolist()] * 2 + [ids[1].tolist()] * 2
    three = _cache(m, ids)
    three.batch_select_indices(torch.tensor([1, 0, 1]))
    assert _rebase(three, 6, 3) is True and stored_ledger(three).token_ids.tolist() == [ids[1].tolist(), ids[0].tolist(),
                                                                                      ids[1].tolist()]
    pairs = [(l.keys, l.values) for l in _cache(m, ids).layers]
    built = kv_cache_from_tensors(pairs, m.config, token_ids=ids)
    assert stored_ledger(built).prints is None
    assert _rebase(built, 6, 2) is True and stored_ledger(built).prints is not None  # the cache's fingerprints adopted
    by_count = kv_cache_from_tensors(pairs, m.config, token_ids=ids)
    by_count.batch_repeat_interleave(2)
    assert _rebase(by_count, 6, 4) is True and stored_ledger(by_count).batch == 4


def test_the_hooks_are_skipped_while_torch_compile_traces():
    """Traced, the ledger's Python state guards the compiled graph (transformers'
    test_static_cache_no_recompile_with_smaller_length failed tracked, 7 models, 5.17.0), and a
    torch.compiler.disable'd hook is a graph break fullgraph=True refuses (test_generate_compile_model_forward_fullgraph
    failed tracked, 7 models). `eager` skips the hook while tracing, fullgraph or not; a plain hook is traced."""
    from kvresume.tracking import eager

    seen: list[bool] = []
    for wrap, want in ((eager, [False]), (lambda h: h, [False, True])):
        for fullgraph in (False, True):
            seen.clear()
            hook = wrap(lambda x: seen.append(torch.compiler.is_compiling()))
            hook(torch.ones(2))
            out = torch.compile(lambda x: (hook(x), x + 1)[1], backend="eager", fullgraph=fullgraph)(torch.ones(2))
            assert torch.equal(out, torch.full((2,), 2.0)) and seen == want, (fullgraph, seen)
            torch.compiler.reset()
