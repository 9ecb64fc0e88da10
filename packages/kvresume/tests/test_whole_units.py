"""kvresume.whole's rules on hand-made arguments, at their boundaries, no generate() call: the config generate() would
use (`effective_config`), length limits turned into new-token counts exactly at the whole sequence's length, one
short and one past it (`whole_input_kwargs`, `new_tokens`), the whole sequence a processor (lag 0) and a criterion
(lag 1) are handed (`_Whole`), arguments left out and unset on a copy of the config (`without`), and a server's
arguments (`server_kwargs`): each refusal by its check name, its cause and its fix, each pass returning the call's
arguments as generate() takes them. The whole calls' equality with a no-cache run: test_whole.py, test_server_caches.py."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StaticCache, StoppingCriteriaList, \
    StopStringCriteria

from kvresume import compat
from kvresume.call import ResumeInputError
from kvresume.testing import build
from kvresume.whole import _Whole, _WholeProcessor, effective_config, new_tokens, server_kwargs, whole_input_kwargs, \
    without

N = 26  # the whole sequence's tokens
IDS = torch.arange(10, 10 + N).view(1, -1)


@pytest.fixture(scope="module")
def model():
    return build("dense")


class Seen:
    """A processor or criterion that records the ids and scores it is handed and returns the scores, or True."""

    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, input_ids, scores, **kwargs):
        self.calls.append((input_ids.tolist(), scores, kwargs))
        return scores if self.result is None else self.result


def test_effective_config_is_a_copy_of_the_model_s_or_the_call_s_with_the_call_s_fields_on_top(model):
    before = model.generation_config.to_dict()
    config = effective_config(model, {"num_beams": 3, "attention_mask": torch.ones(1, 2), "max_new_tokens": 5})
    assert config.num_beams == 3 and config.max_new_tokens == 5 and not hasattr(config, "attention_mask")
    assert model.generation_config.to_dict() == before  # the model's own is left as it was
    given = GenerationConfig(num_beams=2, max_new_tokens=7, repetition_penalty=1.5)
    config = effective_config(model, {"generation_config": given, "max_new_tokens": 3})
    assert (config.num_beams, config.max_new_tokens, config.repetition_penalty) == (2, 3, 1.5)
    assert given.max_new_tokens == 7 and config is not given
    assert effective_config(model, {}).to_dict() == before


@pytest.mark.parametrize("limit, new", [(N - 1, 0), (N, 0), (N + 1, 1), (N + 4, 4)])
def test_max_length_counts_the_whole_sequence_in_new_tokens(model, limit, new):
    out = whole_input_kwargs(model, IDS, {"max_length": limit, "max_new_tokens": None, "attention_mask": "kept"})
    config = out["generation_config"]
    assert (config.max_new_tokens, config.max_length) == (new, None)
    assert out["attention_mask"] == "kept" and "max_length" not in out and "max_new_tokens" not in out


@pytest.mark.parametrize("limit, new", [(N - 1, 0), (N, 0), (N + 1, 1), (N + 3, 3)])
def test_min_length_counts_the_whole_sequence_in_new_tokens(model, limit, new):
    config = whole_input_kwargs(model, IDS, {"min_length": limit, "max_new_tokens": 6})["generation_config"]
    assert (config.min_new_tokens, config.min_length, config.max_new_tokens) == (new, None, 6)


def test_limits_given_in_new_tokens_are_left_as_they_are(model):
    kwargs = {"max_new_tokens": 4, "min_length": 0, "attention_mask": "kept"}
    assert whole_input_kwargs(model, IDS, kwargs) is kwargs  # nothing counts the whole input: unchanged
    config = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "min_new_tokens": 2, "min_length": 40,
                                             "max_length": 50, "logits_processor": [Seen()]})["generation_config"]
    assert (config.max_new_tokens, config.min_new_tokens, config.min_length, config.max_length) == (4, 2, 40, 50)


def test_processors_and_criteria_are_wrapped_each_with_its_lag(model):
    p, c = Seen(), Seen(result=True)
    out = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "logits_processor": [p], "stopping_criteria": [c],
                                          "tokenizer": None, "streamer": "kept"})
    assert isinstance(out["logits_processor"], LogitsProcessorList)
    assert isinstance(out["stopping_criteria"], StoppingCriteriaList) and out["streamer"] == "kept"
    (wp,), (wc,) = out["logits_processor"], out["stopping_criteria"]
    assert isinstance(wp, _WholeProcessor) and (wp.inner, wp.lag) == (p, 0) and torch.equal(wp.prompt, IDS)
    assert type(wc) is _Whole and (wc.inner, wc.lag) == (c, 1)
    assert "tokenizer" in out and out["tokenizer"] is None
    only = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "stopping_criteria": [c]})
    assert "logits_processor" not in only and len(only["stopping_criteria"]) == 1
    only = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "logits_processor": [p]})
    assert "stopping_criteria" not in only and len(only["logits_processor"]) == 1


def test_stop_strings_become_a_criterion_over_the_whole_sequence_only_with_a_tokenizer(model):
    from kvresume.serving.folders import tokenizer

    tok = tokenizer()
    out = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "stop_strings": ["ab"], "tokenizer": tok})
    (wc,) = out["stopping_criteria"]
    assert isinstance(wc.inner, StopStringCriteria) and wc.lag == 1 and out["generation_config"].stop_strings is None

    class Processor:  # a multimodal processor carries its tokenizer
        tokenizer = tok

    out = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "stop_strings": ["ab"], "tokenizer": Processor()})
    assert isinstance(out["stopping_criteria"][0].inner, StopStringCriteria)
    out = whole_input_kwargs(model, IDS, {"max_new_tokens": 4, "stop_strings": ["ab"]})  # generate()'s own error
    assert "stopping_criteria" not in out and out["generation_config"].stop_strings == ["ab"]


def test_a_processor_is_handed_the_prompt_then_the_tokens_generated_so_far():
    prompt = torch.tensor([[1, 2, 3]])
    inner = Seen()
    wrapped = _WholeProcessor(inner, prompt, 0)
    scores = torch.zeros(2, 5)
    assert wrapped(torch.tensor([[7, 8], [7, 9]]), scores) is scores  # first call: nothing generated yet
    wrapped(torch.tensor([[7, 8, 40], [7, 9, 41]]), scores)
    wrapped(torch.tensor([[7, 8, 40, 50], [7, 9, 41, 51]]), scores)
    assert [ids for ids, _, _ in inner.calls] == [[[1, 2, 3]] * 2, [[1, 2, 3, 40], [1, 2, 3, 41]],
                                                  [[1, 2, 3, 40, 50], [1, 2, 3, 41, 51]]]
    assert all(s is scores and kw == {} for _, s, kw in inner.calls)


def test_a_criterion_is_handed_its_step_s_token_and_its_keyword_arguments():
    inner = Seen(result=torch.tensor([False]))
    wrapped = _Whole(inner, torch.tensor([[1, 2]]), 1)
    scores = torch.ones(1, 3)
    assert wrapped(torch.tensor([[5, 60]]), scores, flag=1).tolist() == [False]
    wrapped(torch.tensor([[5, 60, 70]]), scores)
    assert [ids for ids, _, _ in inner.calls] == [[[1, 2, 60]], [[1, 2, 60, 70]]]
    assert inner.calls[0][2] == {"flag": 1} and inner.calls[0][1] is scores


@pytest.mark.parametrize("config, n, new", [(GenerationConfig(max_new_tokens=3), 20, 3),
                                            (GenerationConfig(max_new_tokens=1), 20, 1),
                                            (GenerationConfig(max_length=22, max_new_tokens=None), 20, 2),
                                            (GenerationConfig(max_length=21, max_new_tokens=None), 20, 1),
                                            (GenerationConfig(max_length=20, max_new_tokens=None), 20, 1),
                                            (GenerationConfig(max_length=None, max_new_tokens=None), 20, 1)])
def test_new_tokens_at_the_whole_length_and_past_it(config, n, new):
    assert new_tokens(config, n) == new


def test_without_leaves_out_the_names_and_unsets_them_on_a_copy_of_the_config():
    given = GenerationConfig(cache_implementation="static", max_new_tokens=3)
    out = without({"cache_implementation": "static", "generation_config": given, "x": 1}, ("cache_implementation",))
    assert "cache_implementation" not in out and out["x"] == 1
    assert out["generation_config"].cache_implementation is None and out["generation_config"].max_new_tokens == 3
    assert given.cache_implementation == "static"  # the caller's config is not edited
    plain = GenerationConfig(max_new_tokens=3)
    assert without({"generation_config": plain}, ("cache_implementation",))["generation_config"] is plain
    assert without({"a": 1, "b": 2}, ("a", "b")) == {}
    two = GenerationConfig(max_new_tokens=3, max_length=40)
    both = without({"generation_config": two}, ("cache_implementation", "max_length"))["generation_config"]
    assert both.max_length is None and both.cache_implementation is None and two.max_length == 40


def refused(model, cache, kwargs, check: str) -> ResumeInputError:
    with pytest.raises(ResumeInputError) as exc:
        server_kwargs(model, IDS, cache, kwargs)
    assert exc.value.check == check, exc.value
    return exc.value


def test_a_callers_cache_position_is_refused_and_none_passes(model):
    error = refused(model, DynamicCache(), {"cache_position": torch.arange(20, 26)}, "cache_position")
    assert str(error).startswith("resume(): cache_position given") and error.fix == {"drop": ("cache_position",)}
    kwargs = {"cache_position": None, "max_new_tokens": 4}
    assert server_kwargs(model, IDS, DynamicCache(), kwargs) is kwargs


@pytest.mark.parametrize("columns", [N - 1, N + 1])
def test_position_ids_one_column_short_or_past_the_ids_are_refused(model, columns):
    error = refused(model, DynamicCache(), {"position_ids": torch.arange(columns).view(1, -1)}, "position_ids")
    assert str(error).startswith(f"resume(): position_ids has {columns} columns and the ids {N}: "), str(error)
    assert error.fix == {"drop": ("position_ids",)}


def test_position_ids_of_the_whole_sequence_pass(model):
    kwargs = {"position_ids": torch.arange(N).view(1, -1), "max_new_tokens": 4}
    assert server_kwargs(model, IDS, DynamicCache(), kwargs) is kwargs
    assert server_kwargs(model, IDS, DynamicCache(), {"position_ids": None}) == {"position_ids": None}


@pytest.mark.parametrize("where", ["kwargs", "config"])
def test_cache_implementation_of_the_cache_s_class_is_dropped_another_refused(model, where):
    def kw(impl):
        return {"cache_implementation": impl, "max_new_tokens": 4} if where == "kwargs" else {
            "generation_config": GenerationConfig(cache_implementation=impl, max_new_tokens=4)}

    static = StaticCache(config=compat.text_config(model.config), max_cache_len=64)
    for impl, cache in (("static", static), ("dynamic", DynamicCache())):
        out = server_kwargs(model, IDS, cache, kw(impl))
        assert "cache_implementation" not in out and effective_config(model, out).cache_implementation is None
    for impl, cache in (("static", DynamicCache()), ("dynamic", static), ("offloaded", DynamicCache())):
        error = refused(model, cache, kw(impl), "cache_implementation")
        assert str(error).startswith(f"resume(): cache_implementation={impl!r} asks generate() to build a cache of its "
                                     f"own, beside the given {type(cache).__name__}"), str(error)
        assert error.fix == {"drop": ("cache_implementation",)}
    assert server_kwargs(model, IDS, None, kw("static")) == kw("static")  # no cache: generate() builds the one asked


@pytest.mark.parametrize("room, ok", [(N + 3, False), (N + 4, True), (N + 5, True)])
def test_a_static_cache_one_slot_short_of_the_ids_and_new_tokens_is_refused(model, room, ok):
    cache, kwargs = StaticCache(config=compat.text_config(model.config), max_cache_len=room), {"max_new_tokens": 4}
    if ok:
        assert server_kwargs(model, IDS, cache, kwargs) is kwargs
        return
    error = refused(model, cache, kwargs, "static_cache_short")
    assert str(error).startswith(f"resume(): the StaticCache holds max_cache_len={room} tokens, and this call needs "
                                 f"{N + 4}: the {N} ids of the conversation + 4 new tokens"), str(error)
    assert set(error.fix) == {"cache"} and compat.static_capacity(error.fix["cache"]) == N + 4
    assert server_kwargs(model, IDS, DynamicCache(), kwargs) is kwargs  # no fixed length: nothing to count


def test_a_static_cache_counts_max_length_from_the_whole_sequence(model):
    cache = StaticCache(config=compat.text_config(model.config), max_cache_len=N + 2)
    kwargs = {"max_new_tokens": None, "max_length": N + 2}
    assert server_kwargs(model, IDS, cache, kwargs) is kwargs
    error = refused(model, cache, {"max_new_tokens": None, "max_length": N + 3}, "static_cache_short")
    assert f"needs {N + 3}" in str(error)
