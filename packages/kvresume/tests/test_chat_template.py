"""A chat server's multi-turn calls through a tiny local tokenizer (BPE trained in-process, a chat template that
strips earlier answers' <think> blocks): resume() reuses what still matches, equals the no-cache greedy run, and its
record says why the common prefix broke: `template` (earlier text re-rendered), `tokenizer` (the same text split
differently at the join), `edit` (a message's content changed), `extends` (nothing broke)."""
from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from kvresume import resume, testing as T, track
from kvresume.prefix import explain, record_of

NEW = 3
TEMPLATE = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
            "{{ m.content.split('</think>')[-1] | trim }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor -%}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
WORDS = ("hello there how are you today the weather is fine thanks what about tomorrow please tell me a story about "
         "cats and dogs").split()


@functools.lru_cache(maxsize=None)
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE of ~340 tokens trained here on a few sentences, with a small chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|im_start|>",
                            "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>",
                                  additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    out.chat_template = TEMPLATE
    return out


def render(messages: list[dict[str, str]]) -> torch.Tensor:
    """The chat template's ids of the messages, with the generation prompt."""
    tok = tokenizer()
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])


def encode(text: str) -> torch.Tensor:
    return torch.tensor([tokenizer()(text, add_special_tokens=False)["input_ids"]])


@torch.no_grad()
def turn_one(m: torch.nn.Module, prompt: torch.Tensor, answer: torch.Tensor) -> Any:
    """The cache a first turn leaves: its prompt and the answer's tokens (as generated: written one by one)."""
    cache = DynamicCache(config=m.config)
    m(input_ids=prompt, **{T.cache_kw(m): cache}, use_cache=True)
    for i in range(answer.shape[1]):
        m(input_ids=answer[:, i:i + 1], position_ids=torch.tensor([[prompt.shape[1] + i]]),
          **{T.cache_kw(m): cache}, use_cache=True)
    return cache


@torch.no_grad()
def check(m: torch.nn.Module, ids: torch.Tensor, cache: Any, messages: list[dict[str, str]]) -> Any:
    """resume() of the turn-2 ids equals the no-cache greedy run; returns its record."""
    out = resume(m, ids, cache, generation_config=T.config(max_new_tokens=NEW), tokenizer=tokenizer(),
                 messages=messages)
    ref = m.generate(ids, attention_mask=torch.ones_like(ids), generation_config=T.config(max_new_tokens=NEW))
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    T.assert_close(out.logits[-1], ref.logits[-1], "dense")
    rec = record_of(out)
    assert rec is not None
    return rec


def common(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[1], b.shape[1])
    differ = (a[0, :n] != b[0, :n]).nonzero()
    return int(differ[0]) if differ.numel() else n


U1, U2 = "how are you today", "please tell me a story about cats"


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = T.build("dense")
    track(m)
    return m


def test_next_turn_extends_the_whole_cache(model: torch.nn.Module) -> None:
    answer = "hello there the weather is fine"
    p1 = render([{"role": "user", "content": U1}])
    cache = turn_one(model, p1, encode(answer))
    msgs = [{"role": "user", "content": U1}, {"role": "assistant", "content": answer}, {"role": "user", "content": U2}]
    rec = check(model, render(msgs), cache, msgs)
    assert (rec.reused, rec.reason) == (p1.shape[1] + encode(answer).shape[1], "extends")


def test_template_re_renders_the_earlier_answer(model: torch.nn.Module) -> None:
    answer = "<think> what about cats </think> hello there"
    p1 = render([{"role": "user", "content": U1}])
    cache = turn_one(model, p1, encode(answer))
    msgs = [{"role": "user", "content": U1}, {"role": "assistant", "content": answer}, {"role": "user", "content": U2}]
    ids = render(msgs)
    rec = check(model, ids, cache, msgs)
    assert rec.reason == "template", rec.detail
    assert rec.reused == p1.shape[1] == common(torch.cat([p1, encode(answer)], 1), ids)


def test_tokenizer_splits_the_answer_differently_at_the_join(model: torch.nn.Module) -> None:
    generated = torch.cat([encode("hel"), encode("lo"), encode(" there")], 1)  # decodes to "hello there"
    assert tokenizer().decode(generated[0]) == "hello there" and not torch.equal(generated, encode("hello there"))
    p1 = render([{"role": "user", "content": U1}])
    cache = turn_one(model, p1, generated)
    msgs = [{"role": "user", "content": U1}, {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": U2}]
    rec = check(model, render(msgs), cache, msgs)
    assert (rec.reused, rec.reason) == (p1.shape[1], "tokenizer"), rec.detail


def test_user_edits_an_earlier_message(model: torch.nn.Module) -> None:
    answer = "hello there"
    p1 = render([{"role": "user", "content": U1}])
    cache = turn_one(model, p1, encode(answer))
    msgs = [{"role": "user", "content": "how are the dogs today"}, {"role": "assistant", "content": answer},
            {"role": "user", "content": U2}]
    ids = render(msgs)
    rec = check(model, ids, cache, msgs)
    assert rec.reason == "edit" and "message 0" in rec.detail, rec.detail
    assert rec.reused == common(torch.cat([p1, encode(answer)], 1), ids) > 0


def test_explain_contradicting_cases() -> None:
    """Each reason fed the case that contradicts the others: same text/other split; markup change; content change;
    no tokenizer; no messages."""
    a = encode("<|im_start|>user\nhello there<|im_end|>")
    b = encode("<|im_start|>user\nhow are you<|im_end|>")
    p = common(a, b)
    msgs = [{"role": "user", "content": "how are you"}]
    assert explain(a, b, p, tokenizer(), msgs)[0] == "edit"
    assert explain(a, b, p, None, msgs)[0] == "differs"
    assert explain(a, b, p, tokenizer(), None)[0] == "template"  # without messages it cannot say edit
    c = encode("<|im_start|>system\nhello there<|im_end|>")
    assert explain(a, c, common(a, c), tokenizer(), [{"role": "system", "content": "hello there"}])[0] == "template"
    split = torch.cat([encode("<|im_start|>user\nhel"), encode("lo there")], 1)
    whole = encode("<|im_start|>user\nhello there<|im_end|>")
    assert explain(split, whole, common(split, whole), tokenizer(), None)[0] == "tokenizer"
