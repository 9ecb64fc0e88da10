"""kvresume.call.from_forward on stand-ins (no model runs): one forward call's own keyword arguments read as a call of
its own, the decoder's side for an encoder-decoder; no call where no cache or nothing fed is given."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import DynamicCache

from kvresume import call as c

T = torch.tensor


def model(enc_dec=False, start=None):
    return SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=enc_dec, layer_types=["full_attention"]),
                           generation_config=SimpleNamespace(decoder_start_token_id=start))


def test_a_decoder_only_forward_call():
    m, cache = model(), DynamicCache()
    ids, mask, pos = T([[1, 2, 3], [4, 5, 6]]), torch.ones(2, 5, dtype=torch.long), T([[2, 3, 4]])
    call = c.from_forward(m, {"input_ids": ids, "past_key_values": cache, "attention_mask": mask, "position_ids": pos})
    assert (call.n, call.fed, call.f) == (3, 3, 3) and call.cache is cache and call.model is m
    assert call.fed_ids is ids and call.given_ids is ids and call.attention_mask is mask and call.fed_mask is mask
    assert call.position_ids is pos and call.decoder_start is None and call.layer_types == ("full_attention",)


def test_an_encoder_decoder_forward_call_reads_the_decoders_side():
    m, cache = model(enc_dec=True, start=7), DynamicCache()
    dec, dmask, dpos = T([[8, 9]]), torch.ones(1, 4, dtype=torch.long), T([[2, 3]])
    call = c.from_forward(m, {"input_ids": T([[1, 2, 3, 4, 5]]), "attention_mask": torch.ones(1, 5), "cache": cache,
                              "decoder_input_ids": dec, "decoder_attention_mask": dmask, "decoder_position_ids": dpos})
    assert (call.n, call.fed) == (2, 2) and call.fed_ids is dec and call.given_ids is dec
    assert call.attention_mask is dmask and call.fed_mask is dmask and call.position_ids is dpos
    assert call.decoder_start == 7


def test_embeddings_are_fed_without_ids():
    call = c.from_forward(model(), {"inputs_embeds": torch.zeros(1, 4, 8), "past_key_values": DynamicCache()})
    assert (call.n, call.fed) == (4, 4) and call.fed_ids is None and call.given_ids is None


def test_no_call_without_a_cache_or_without_anything_fed():
    assert c.from_forward(model(), {"input_ids": T([[1, 2]])}) is None
    assert c.from_forward(model(), {"input_ids": T([[1, 2]]), "past_key_values": None}) is None
    assert c.from_forward(model(), {"past_key_values": DynamicCache()}) is None
    assert c.from_forward(model(), {"past_key_values": DynamicCache(), "attention_mask": torch.ones(1, 2)}) is None


def test_the_decoder_start_token_the_generation_config_first():
    assert c.decoder_start(model(start=3)) == 3
    both = SimpleNamespace(generation_config=SimpleNamespace(decoder_start_token_id=None),
                           config=SimpleNamespace(decoder_start_token_id=5))
    assert c.decoder_start(both) == 5
    both.generation_config.decoder_start_token_id = 4
    assert c.decoder_start(both) == 4
    assert c.decoder_start(SimpleNamespace(config=SimpleNamespace(decoder_start_token_id=6))) == 6
    assert c.decoder_start(SimpleNamespace(generation_config=SimpleNamespace(decoder_start_token_id=2))) == 2
    assert c.decoder_start(SimpleNamespace(generation_config=SimpleNamespace(decoder_start_token_id=[1]),
                                           config=SimpleNamespace())) is None
    assert c.decoder_start(SimpleNamespace()) is None


def test_generates_positional_inputs_are_ids_or_embeddings():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
    call = c.from_generate(model(), torch.zeros(1, 3, 8), {"past_key_values": cache})
    assert (call.n, call.given_ids) == (3, None)
    ids = T([[1, 2]])
    call = c.from_generate(model(), ids, {"past_key_values": cache})
    assert call.n == 2 and call.given_ids is ids


def test_a_batchs_processed_counts_are_long_rows():
    assert c.processed(None) == (None, None) and c.processed(4) == (4, None)
    for value in ([2.0, 3.0], T([[2], [3]], dtype=torch.int32)):
        length, rows = c.processed(value)
        assert length == 3 and rows.dtype == torch.long and rows.tolist() == [2, 3]
