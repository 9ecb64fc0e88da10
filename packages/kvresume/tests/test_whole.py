"""resume() with generation arguments that read or count the whole input (kvresume.whole): each call equals a run
without the cache over the whole sequence; settings it cannot resume exactly are re-prefilled, with their name."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessor

from kvresume import resume, resume_report, track
from kvresume.testing import build
from kvresume.whole import counts_whole, needs_prefill

GREEDY = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)


@pytest.fixture(scope="module")
def model():
    m = build("llama")
    track(m)
    return m


def turn(model, seed: int = 0):
    """(a cache holding a first turn, the whole second-turn sequence: 24 of its 27 tokens cached)."""
    x = torch.randint(10, 2000, (1, 20), generator=torch.Generator().manual_seed(seed))
    cache = DynamicCache()
    with torch.no_grad():
        out = model.generate(x, past_key_values=cache, **{**GREEDY, "max_new_tokens": 5})
    return cache, torch.cat([out, torch.tensor([[33, 44]])], 1)


def plain(model, ids, **kw):
    with torch.no_grad():
        return model.generate(ids, **{**GREEDY, **kw})


def resumed(model, cache, ids, **kw):
    with torch.no_grad():
        out = resume(model, ids, cache, **{**GREEDY, **kw})
    rec = resume_report(out)
    return torch.cat([ids[:, : ids.shape[1] - rec.fed].expand(out.shape[0], -1), out], 1), rec


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [dict(repetition_penalty=1.5), dict(no_repeat_ngram_size=2),
                                   dict(num_beams=3), dict(num_return_sequences=2, do_sample=True)])
def test_settings_that_read_the_whole_input_or_expand_rows_are_re_prefilled(model, extra):
    cache, ids = turn(model)
    torch.manual_seed(0)
    got, rec = resumed(model, cache, ids, **extra)
    torch.manual_seed(0)
    assert torch.equal(got, plain(model, ids, **extra))
    assert rec.reused == 0 and rec.reason == "whole_input" and next(iter(extra)) in rec.detail


class Ban(LogitsProcessor):
    """Bans the first token of what it is given, and records the lengths it saw."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(int(input_ids.shape[1]))
        return scores.scatter(1, input_ids[:, :1], -1e9)


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [dict(max_length=30, max_new_tokens=None), dict(min_length=31, max_new_tokens=6),
                                   "processor"])
def test_length_limits_and_processors_count_the_whole_sequence(model, extra):
    cache, ids = turn(model)
    kw = dict(extra) if extra != "processor" else {}
    a = b = None
    if extra == "processor":
        a, b = Ban(), Ban()
    got, rec = resumed(model, cache, ids, **kw, **({"logits_processor": [a]} if a else {}))
    want = plain(model, ids, **kw, **({"logits_processor": [b]} if b else {}))
    assert rec.reused == 24 and torch.equal(got, want)
    if a:
        assert a.seen == b.seen == [27, 28, 29, 30]


def test_needs_prefill_at_the_neutral_value_and_just_past_it():
    assert needs_prefill(GenerationConfig(repetition_penalty=1.0, num_beams=1, num_return_sequences=1)) is None
    assert needs_prefill(GenerationConfig(repetition_penalty=1.01))[0] == "repetition_penalty"
    assert needs_prefill(GenerationConfig(num_beams=2))[0] == "num_beams"
    assert needs_prefill(GenerationConfig(num_beams=2, num_return_sequences=2))[0] == "num_beams"


def test_counts_whole_only_where_a_limit_or_a_callers_piece_counts_it():
    assert not counts_whole(GenerationConfig(max_new_tokens=3), {})
    assert counts_whole(GenerationConfig(max_length=30), {})
    assert not counts_whole(GenerationConfig(max_length=30, max_new_tokens=3), {})
    assert counts_whole(GenerationConfig(max_new_tokens=3, min_length=1), {})
    assert not counts_whole(GenerationConfig(max_new_tokens=3, min_length=0), {})
    assert counts_whole(GenerationConfig(max_new_tokens=3), {"stopping_criteria": [object()]})


def test_needs_prefill_says_why_and_reads_a_config_without_every_field():
    from types import SimpleNamespace

    assert needs_prefill(GenerationConfig(no_repeat_ngram_size=3))[1] == (
        "no_repeat_ngram_size=3: its processor reads the whole input, of which a resumed call feeds the suffix")
    assert needs_prefill(GenerationConfig(num_return_sequences=2, do_sample=True))[1] == (
        "num_return_sequences=2: generate() expands the ids to more rows, and not the cache")
    assert needs_prefill(SimpleNamespace(repetition_penalty=1.0)) is None  # an older release's config lacks fields
    assert needs_prefill(SimpleNamespace(num_beams=4))[0] == "num_beams"


@pytest.mark.parametrize("kwargs, config", [({"logits_processor": [object()]}, {}), ({}, {"stop_strings": ["x"]}),
                                            ({"logits_processor": []}, {})])
def test_counts_whole_for_each_piece_alone(kwargs, config):
    assert counts_whole(GenerationConfig(max_new_tokens=3, **config), kwargs) == bool(kwargs.get("logits_processor")
                                                                                     or config)
