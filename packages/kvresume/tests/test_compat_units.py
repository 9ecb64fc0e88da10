"""kvresume.compat on stand-ins (no model runs): which keyword carries the cache, where the cache and the logits are
read, the rope state's owner and its errors, the linear layers' own count, the key/value geometry, the caches a
resume cannot continue (a restarting scan, a static capacity), the text rotary embedding."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from kvresume import compat


def fn(*names):
    """A callable whose parameters are `names`."""
    exec(f"def f({', '.join(names)}): pass", scope := {})
    return scope["f"]


def test_accepts_reads_the_signature_and_a_builtin_without_one_accepts_nothing():
    assert compat.accepts(fn("a", "b"), "b") and not compat.accepts(fn("a"), "b")
    assert compat._params(fn("x")).keys() == {"x"}
    assert compat._params(object()) == {} and not compat.accepts(3, "x")


@pytest.mark.parametrize("names, want", [(("input_ids", "past_key_values"), "past_key_values"),
                                         (("input_ids", "cache"), "cache"),
                                         (("cache", "past_key_values"), "past_key_values"),
                                         (("input_ids", "cache_params"), "cache_params"),
                                         (("cache_params", "past_key_values"), "past_key_values"),
                                         (("input_ids",), "past_key_values")])
def test_the_cache_keyword_follows_the_forward_signature(names, want):
    model = SimpleNamespace(forward=fn(*names))
    assert compat.cache_kwarg(model) == want and compat.generate_cache_kwarg(model) == want


def test_the_cache_in_a_calls_kwargs_and_in_its_output():
    a, b = object(), object()
    assert compat.cache_from_kwargs({"past_key_values": a, "cache": b}) is a
    assert compat.cache_from_kwargs({"past_key_values": None, "cache": b}) is b
    assert compat.cache_from_kwargs({"other": a}) is None
    assert compat.output_cache(SimpleNamespace(cache=a, past_key_values=b)) is a
    assert compat.output_cache(SimpleNamespace(cache=None, past_key_values=b)) is b
    assert compat.output_cache(SimpleNamespace()) is None


def test_plain_generate_is_the_classs_own_bound_to_the_instance():
    class M:
        def generate(self, x):
            return ("class", self, x)

    m = M()
    m.generate = lambda x: "instance"
    assert compat.plain_generate(m)(1) == ("class", m, 1)


def test_the_per_step_logits_or_an_error_naming_the_output():
    assert compat.generate_logits(SimpleNamespace(logits=[1, 2])) == (1, 2)
    with pytest.raises(AttributeError, match=f"^Out carries no per-step logits on transformers {compat.TRANSFORMERS_VERSION}$"):
        compat.generate_logits(type("Out", (), {"logits": None})())
    with pytest.raises(AttributeError, match="^SimpleNamespace carries no per-step logits"):
        compat.generate_logits(SimpleNamespace())


def test_layers_and_their_keys_values():
    layer = SimpleNamespace(keys=1, values=2)
    assert compat.layer_kv(layer) == (1, 2) and compat.layer_kv(object()) == (None, None)
    assert compat.cache_layers(SimpleNamespace(layers=(layer,))) == [layer] and compat.cache_layers(object()) == []


def test_the_tensor_data_constructor_where_the_release_has_one():
    pairs = [(torch.ones(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))]
    if compat.has_tensor_data_constructor():
        cache = compat.dynamic_cache_from_pairs(pairs, None)
        assert cache.get_seq_length() == 2
    else:
        with pytest.raises(NotImplementedError, match="no ddp_cache_data/config constructor on transformers"):
            compat.dynamic_cache_from_pairs(pairs, None)


def test_the_text_config_of_a_multimodal_or_a_text_config():
    text = object()
    assert compat.text_config(SimpleNamespace(get_text_config=lambda decoder: (text, decoder))) == (text, True)
    assert compat.text_config(SimpleNamespace(text_config=text)) is text
    plain = SimpleNamespace()
    assert compat.text_config(plain) is plain


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rope_deltas = None


def test_the_rope_state_owner_its_value_and_its_errors():
    outer = torch.nn.Module()
    outer.model = Inner()
    assert compat.rope_state_owner(outer) is outer.model
    base = SimpleNamespace(model=None, base_model=SimpleNamespace(rope_deltas=5))
    assert compat.rope_state_owner(base) is base.base_model and compat.get_rope_state(base) == 5
    own = SimpleNamespace(rope_deltas=7)
    assert compat.rope_state_owner(own) is own
    value = torch.tensor([3])
    compat.put_rope_state(outer, value)
    assert torch.equal(outer.model.rope_deltas, value) and outer.model.rope_deltas is not value
    compat.put_rope_state(outer, None)
    assert outer.model.rope_deltas is None and compat.get_rope_state(outer) is None
    compat.set_rope_state(outer, value)
    assert outer.model.rope_deltas is value
    text = torch.nn.Linear(1, 1)
    assert compat.rope_state_owner(text) is None and compat.get_rope_state(text) is None
    compat.put_rope_state(text, value)  # keeps none: nothing
    assert not hasattr(text, "rope_deltas")
    with pytest.raises(AttributeError, match=f"^Linear keeps no rope_deltas on transformers {compat.TRANSFORMERS_VERSION}$"):
        compat.set_rope_state(text, value)


def test_mm_token_type_ids():
    assert compat.accepts_mm_token_type_ids(SimpleNamespace(forward=fn("input_ids", "mm_token_type_ids")))
    assert not compat.accepts_mm_token_type_ids(SimpleNamespace(forward=fn("input_ids")))


def test_the_release_described():
    pytest.importorskip("PIL")  # the image processor's backend
    info = compat.describe_release()
    assert info == {"transformers": compat.TRANSFORMERS_VERSION,
                    "tensor_data_constructor": compat.has_tensor_data_constructor(),
                    "image_processor": "Qwen2VLImageProcessorPil"}


def test_a_linear_layers_own_count_is_carried_where_both_keep_one():
    target = SimpleNamespace(cumulative_length_linear=torch.tensor(0))
    assert compat.carry_linear_length(target, SimpleNamespace(cumulative_length_linear=torch.tensor(5)))
    assert int(target.cumulative_length_linear) == 5
    assert compat.carry_linear_length(target, 7) and int(target.cumulative_length_linear) == 7
    assert compat.carry_linear_length(target, torch.tensor(9)) and int(target.cumulative_length_linear) == 9
    assert not compat.carry_linear_length(target, SimpleNamespace()) and int(target.cumulative_length_linear) == 9
    assert not compat.carry_linear_length(SimpleNamespace(cumulative_length_linear=3), 4)
    assert not compat.carry_linear_length(SimpleNamespace(), 4)


def test_the_key_value_geometry():
    assert compat.kv_geometry(SimpleNamespace(num_key_value_heads=2, head_dim=16, num_attention_heads=8,
                                              hidden_size=64)) == (2, 16)
    assert compat.kv_geometry(SimpleNamespace(num_key_value_heads=None, head_dim=None, num_attention_heads=8,
                                              hidden_size=64)) == (8, 8)
    assert compat.kv_geometry(SimpleNamespace(num_attention_heads=4, hidden_size=64)) == (4, 16)


def test_pairs_are_detached_clones_and_a_cache_is_built_from_them():
    keys = torch.arange(8.0).view(1, 1, 2, 4).requires_grad_()
    cache = compat.cache_from_pairs([(keys, keys * 2), (keys + 1, keys)])
    assert cache.get_seq_length() == 2 and len(compat.cache_layers(cache)) == 2
    pairs = compat.kv_pairs(cache)
    assert len(pairs) == 2 and torch.equal(pairs[0][1], keys * 2) and torch.equal(pairs[1][0], keys + 1)
    assert not pairs[0][0].requires_grad and pairs[0][0].data_ptr() != compat.cache_layers(cache)[0].keys.data_ptr()
    assert isinstance(compat.dynamic_cache(), DynamicCache)
    assert compat.dynamic_cache(None, ddp_cache_data=[(keys, keys)]).get_seq_length() == 2  # keywords passed on
    from transformers import MistralConfig

    config = MistralConfig(num_hidden_layers=1, sliding_window=4, num_attention_heads=2, num_key_value_heads=1,
                           hidden_size=8)
    sliding = compat.cache_from_pairs([(keys, keys)], config)
    assert "Sliding" in type(compat.cache_layers(sliding)[0]).__name__


def test_the_text_rotary_embedding_not_a_vision_towers():
    class VisionRotaryEmbedding(torch.nn.Module):
        pass

    model = torch.nn.Module()
    model.visual = torch.nn.Module()
    model.visual.rotary_emb = torch.nn.Module()
    model.tower = torch.nn.Module()
    model.tower.rotary_emb = VisionRotaryEmbedding()
    assert compat.rotary_embedding(model) is None
    model.text = torch.nn.Module()
    model.text.rotary_emb = torch.nn.Module()
    model.text.other = torch.nn.Module()
    assert compat.rotary_embedding(model) is model.text.rotary_emb


@pytest.mark.parametrize("kind, want", [("mamba", True), ("falcon_mamba", True), ("llama", False), (None, False)])
def test_a_restarting_scan_is_told_by_the_model_type(kind, want):
    config = SimpleNamespace(text_config=SimpleNamespace(model_type=kind) if kind else SimpleNamespace())
    assert compat.restarts_scan(SimpleNamespace(config=config)) is want


def test_a_static_capacity_is_its_smallest_full_layer():
    def layer(size, sliding=False):
        return SimpleNamespace(max_cache_len=size, is_sliding=sliding)

    assert compat.static_capacity(SimpleNamespace(layers=[layer(8), layer(6), layer(4, True)])) == 6
    assert compat.static_capacity(SimpleNamespace(layers=[layer(4, True), SimpleNamespace(max_cache_len=None)])) is None
    owner = SimpleNamespace(self_attention_cache=SimpleNamespace(layers=[layer(5)]), layers=[layer(9)])
    assert compat.static_capacity(owner) == 5
    assert compat.static_capacity(SimpleNamespace(self_attention_cache=None, layers=[layer(9)])) == 9
    assert compat.static_capacity(SimpleNamespace(layers=[SimpleNamespace(max_cache_len=3)])) == 3  # not said: full


def test_both_releases_build_a_cache_from_tensor_data_with_its_config():
    from transformers import MistralConfig

    assert compat.has_tensor_data_constructor()  # 5.17.0 and 5.25.0 both take ddp_cache_data and config
    config = MistralConfig(num_hidden_layers=1, sliding_window=4, num_attention_heads=2, num_key_value_heads=1,
                           hidden_size=8)
    cache = compat.dynamic_cache_from_pairs([(torch.ones(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))], config)
    assert "Sliding" in type(compat.cache_layers(cache)[0]).__name__ and cache.get_seq_length() == 2


def test_without_the_tensor_data_constructor_it_says_so(monkeypatch):
    monkeypatch.setattr(compat, "has_tensor_data_constructor", lambda: False)
    with pytest.raises(NotImplementedError, match=f"^DynamicCache has no ddp_cache_data/config constructor on "
                                                   f"transformers {compat.TRANSFORMERS_VERSION}$"):
        compat.dynamic_cache_from_pairs([], None)
