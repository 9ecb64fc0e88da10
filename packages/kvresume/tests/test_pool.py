"""kvresume.pool: every pooled call equals the model's own generate() over the whole input (a hit equals a miss), or
is re-prefilled with its cause; the budget, the identity and the whole-input arguments at their boundaries."""
from __future__ import annotations

import threading

import pytest
import torch
from transformers import DynamicCache, LogitsProcessor, StoppingCriteria

from kvresume import pool as pool_mod
from kvresume.pool import Pool, attach, identity, unpooled
from kvresume.testing import build

pytestmark = pytest.mark.e2e  # ~40 generate() calls on tiny models: `make test`, not the fast tier (its 60 s)
GREEDY = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def ref() -> torch.nn.Module:
    return build("llama")


def plain(model: torch.nn.Module, x: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        return type(model).generate(model, x, **{**GREEDY, **kw})


def chat(p: Pool, ref: torch.nn.Module, turns: int, **kw) -> list[int]:
    """Turns of a chat through the pool, each equal to the reference's no-pool run; the tokens reused per turn."""
    x, reused = ids(20), []
    for t in range(turns):
        got = p.generate(x, attention_mask=torch.ones_like(x), **{**GREEDY, **kw})
        assert torch.equal(got, plain(ref, x, attention_mask=torch.ones_like(x), **kw)), t
        reused.append(p.last.reused)
        x = torch.cat([got, ids(4, t + 1)], 1)
    return reused


def test_a_chat_reuses_each_earlier_turn_and_equals_a_miss(ref):
    p = Pool(build("llama"))
    assert chat(p, ref, 4) == [0, 24, 33, 42]  # 20 + 5 - 1 cached, then 9 more a turn
    assert p.last.reason == "extends" and p.held == 51 and len(p.entries) == 1


def test_a_regenerated_answer_branches_and_keeps_the_longer_path(ref):
    p = Pool(build("llama"))
    chat(p, ref, 2)
    longer = p.held
    x = ids(20)
    assert torch.equal(p.generate(x, **GREEDY), plain(ref, x))
    assert p.last.reused == 19 and p.last.reason == "regenerate"
    assert sorted(pool_mod._length(c) for _, c in p.entries.values()) == [24, longer]


@pytest.mark.parametrize("budget, kept", [(24, 1), (23, 0)])
def test_the_budget_keeps_a_cache_of_exactly_its_tokens_and_not_one_more(ref, budget, kept):
    p = Pool(build("llama"), max_tokens=budget)
    p.generate(ids(20), **GREEDY)  # 24 tokens cached
    assert len(p.entries) == kept and p.held <= budget


def test_the_least_recently_used_cache_goes_first(ref):
    p = Pool(build("llama"), max_tokens=60)
    a, b = ids(20, 1), ids(20, 2)
    p.generate(a, **GREEDY)
    p.generate(b, **GREEDY)
    p.generate(torch.cat([a, ids(2, 3)], 1), **GREEDY)  # a used again (extended: 22 + 4 = 26 tokens)
    p.generate(ids(20, 4), **GREEDY)  # 24 more: 24 + 26 + 24 > 60, b is the least recently used
    held = [c for _, c in p.entries.values()]
    assert len(held) == 2 and all(pool_mod.ledger_of(c).common_prefix(b) < 20 for c in held)


def test_other_weights_behind_the_same_ids_are_not_reused(ref):
    m = build("llama")
    p = Pool(m)
    x = ids(20)
    p.generate(x, **GREEDY)
    before = identity(m)
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # in place: same tensor, other values
    assert identity(m) != before
    out = p.generate(torch.cat([x, ids(3, 9)], 1), **GREEDY)
    assert p.last.reused == 0 and torch.equal(out, plain(m, torch.cat([x, ids(3, 9)], 1)))
    changed = identity(m)
    m.load_state_dict(ref.state_dict())  # other weights loaded in place: another identity again
    assert identity(m) != changed


@pytest.mark.parametrize("extra, why", [
    (dict(repetition_penalty=1.5), "repetition_penalty"), (dict(num_return_sequences=2, do_sample=True), "num_return"),
    (dict(num_beams=3), "num_beams"), (dict(no_repeat_ngram_size=2), "no_repeat"),
    (dict(cache_implementation="static"), "cache_implementation"), (dict(bad_words_ids=[[5, 6]]), "bad_words"),
])
def test_arguments_that_read_the_whole_input_or_expand_rows_are_re_prefilled_and_equal(ref, extra, why):
    p = Pool(build("llama"))
    chat(p, ref, 1)
    x = torch.cat([ids(20), ids(4, 1)], 1)
    torch.manual_seed(0)
    got = p.generate(x, **{**GREEDY, **extra})
    torch.manual_seed(0)
    assert torch.equal(got, plain(ref, x, **extra))
    assert p.last.reused == 0 and p.last.reason in ("whole_input", "re-prefilled") and why in p.last.detail


@pytest.mark.parametrize("extra", [dict(max_length=30, max_new_tokens=None), dict(min_length=30, max_new_tokens=12)])
def test_length_limits_count_the_whole_sequence(ref, extra):
    p = Pool(build("llama"))
    chat(p, ref, 1)
    x = ids(20)
    x = torch.cat([x, plain(ref, x)[:, 20:], ids(2, 5)], 1)  # 27 tokens, 24 of them cached
    got = p.generate(x, **{**GREEDY, **extra})
    assert p.last.reused == 24 and torch.equal(got, plain(ref, x, **extra))


class Recorder(LogitsProcessor):
    """Bans the token the whole sequence ends with, and records the lengths it saw."""

    def __init__(self):
        self.seen: list[int] = []

    def __call__(self, input_ids, scores):
        self.seen.append(int(input_ids.shape[1]))
        return scores.scatter(1, input_ids[:, :1], -1e9)


class StopAt(StoppingCriteria):
    def __init__(self, n: int):
        self.n, self.seen = n, []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append(int(input_ids.shape[1]))
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)


def test_a_callers_processors_and_criteria_see_the_whole_sequence(ref):
    p = Pool(build("llama"))
    chat(p, ref, 1)
    x = torch.cat([ids(20), plain(ref, ids(20))[:, 20:], ids(2, 5)], 1)
    a, b = Recorder(), Recorder()
    s, t = StopAt(30), StopAt(30)
    got = p.generate(x, logits_processor=[a], stopping_criteria=[s], **GREEDY)
    want = plain(ref, x, logits_processor=[b], stopping_criteria=[t])
    assert p.last.reused == 24 and torch.equal(got, want)
    assert a.seen == b.seen == [27, 28, 29] and s.seen == t.seen == [28, 29, 30]


def test_stop_strings_are_matched_over_the_whole_sequence():
    from kvresume.serving.folders import tokenizer

    tok = tokenizer()
    m = build("llama")
    p = Pool(m)
    x = ids(20)
    first = p.generate(x, **GREEDY)
    stop = tok.decode(first[0, 22:24])  # a string the reply holds
    y = torch.cat([x, ids(3, 2)], 1)
    got = p.generate(y, stop_strings=[stop], tokenizer=tok, **{**GREEDY, "max_new_tokens": 8})
    assert torch.equal(got, plain(m, y, stop_strings=[stop], tokenizer=tok, max_new_tokens=8))


def test_the_guards_refusal_is_re_prefilled_never_raised(ref, monkeypatch):
    from kvresume.checks import ResumeInputError

    p = Pool(build("llama"))
    chat(p, ref, 1)

    def refuse(*a, **k):
        raise ResumeInputError("ledger_tokens", "refused for the test")

    monkeypatch.setattr(pool_mod, "resume", refuse)
    x = torch.cat([ids(20), ids(3, 1)], 1)
    assert torch.equal(p.generate(x, **GREEDY), plain(ref, x))
    assert p.last.reason == "re-prefilled" and "ledger_tokens" in p.last.detail


def test_off_is_the_models_own_generate(ref):
    p = Pool(build("llama"), enabled=False)
    chat(p, ref, 2)
    assert p.last.reused == 0 and p.last.detail == "the pool is off" and not p.entries


def test_attach_makes_model_generate_the_pools_and_kvresume_never_re_enters_it(ref):
    m = build("llama")
    p = attach(m)
    x = ids(20)
    out = m.generate(x, **GREEDY)
    m.generate(torch.cat([out, ids(4, 1)], 1), **GREEDY)
    assert p.last.reused == 24  # the pool's own resume() called the class's generate, not the pool again


def test_two_threads_on_one_model_each_get_their_own_answer(ref):
    p = Pool(build("llama"))
    convs = {i: ids(15 + i, i) for i in range(2)}
    wrong: list[tuple[int, int]] = []
    start = threading.Barrier(2)

    def run(i: int) -> None:
        x = convs[i]
        start.wait()
        for t in range(3):
            got = p.generate(x, **GREEDY)
            if not torch.equal(got, plain(ref, x)):
                wrong.append((i, t))
            x = torch.cat([got, ids(3, 10 * i + t)], 1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == [] and len(p.entries) == 2


def test_a_multimodal_chat_reuses_its_image_and_not_another_behind_the_same_ids():
    from kvresume import testing

    m, ref_vl = build("multimodal"), build("multimodal")
    p = Pool(m)
    one, both_ = testing.prompt("multimodal"), testing.both_turns()
    g = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(p.generate(**dict(one), **g), plain(ref_vl, None, **dict(one), **g))
    assert torch.equal(p.generate(**dict(both_), **g), plain(ref_vl, None, **dict(both_), **g))
    assert p.last.reused > one["input_ids"].shape[1] - 2  # turn 1's image and text kept (5.25: encoded before the call)
    other = {**both_, "pixel_values": torch.flip(both_["pixel_values"], [0])}  # other pictures, the same ids
    assert torch.equal(p.generate(**other, **g), plain(ref_vl, None, **other, **g))
    assert p.last.reused <= 13  # the prefix ends before the first image (12 text tokens and its vision start)


@pytest.mark.parametrize("shared, reused", [(5, 5), (4, 0)])
def test_a_prefix_under_a_quarter_of_the_prompt_is_re_prefilled(ref, shared, reused):
    p = Pool(build("llama"))
    x = ids(20)
    p.generate(x, **GREEDY)
    y = torch.cat([x[:, :shared], ids(20 - shared, 99) + 2048 // 2], 1).clamp(max=2047)  # 20 tokens, `shared` cached
    assert torch.equal(p.generate(y, **GREEDY), plain(ref, y))
    assert p.last.reused == reused and (reused or "under 25%" in p.last.detail)


def test_a_llava_chat_reuses_its_images_by_pixels_and_not_another_behind_the_same_ids(tmp_path):
    pytest.importorskip("PIL")  # the image processor's
    from transformers import AutoModelForImageTextToText

    from kvresume.serving.folders import vlm_folder

    folder = vlm_folder(tmp_path / "vlm")
    m, ref_vl = (AutoModelForImageTextToText.from_pretrained(folder).eval() for _ in range(2))
    token, g = m.config.image_token_index, dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    pics = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    def conv(*parts):  # text ids, or an image's 16 placeholders
        return torch.tensor([sum(([token] * 16 if p == "img" else p for p in parts), [])])

    p = Pool(m)
    turns = [(conv([5, 6, 7], "img", [8, 9]), pics[:1]),
             (conv([5, 6, 7], "img", [8, 9], [40, 41, 42], [10, 11]), pics[:1]),
             (conv([5, 6, 7], "img", [8, 9], [40, 41, 42], [10, 11], [50, 51, 52], "img", [12]), pics[:2]),
             (conv([5, 6, 7], "img", [8, 9], [40, 41, 42], [10, 11], [50, 51, 52], "img", [12]), pics[[2, 1]])]
    reused = []
    for x, px in turns:
        got = p.generate(x, attention_mask=torch.ones_like(x), pixel_values=px, **g)
        want = plain(ref_vl, x, attention_mask=torch.ones_like(x), pixel_values=px, **g)
        assert torch.equal(got, want)
        reused.append(p.last.reused)
    assert reused[1] >= 21 and reused[2] >= 26  # turn 1's image and text kept; turn 3 after the new image's start
    assert reused[3] <= 3  # another first picture behind the same ids: reuse ends before it


def test_a_tracked_model_deep_copied_tracks_resumes_and_encodes_with_its_own_weights():
    import copy

    from kvresume import ledger_of, resume, resume_report, testing, track

    m = build("multimodal")
    track(m)
    twin = copy.deepcopy(m)  # (raised TypeError: cannot pickle '_thread._local' object before)
    with torch.no_grad():
        twin.model.visual.blocks[0].mlp.linear_fc1.weight.mul_(2.0)
    untracked = copy.deepcopy(build("multimodal"))
    untracked.load_state_dict(twin.state_dict())
    one, both_ = testing.prompt("multimodal"), testing.both_turns()
    g = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    cache = DynamicCache()
    with torch.no_grad():
        out = twin.generate(**one, past_key_values=cache, **g)
        assert torch.equal(out, untracked.generate(**one, **g))  # the twin's own vision weights
        assert torch.equal(ledger_of(cache).token_ids, out[:, :-1])
        got = resume(twin, both_["input_ids"], cache, **{k: v for k, v in both_.items() if k != "input_ids"}, **g)
        rec = resume_report(got)
        want = untracked.generate(**both_, **g)
    assert rec.reused > 60 and torch.equal(torch.cat([both_["input_ids"][:, :rec.reused], got], 1), want)


def test_the_byte_budget_keeps_a_cache_of_exactly_its_bytes_and_not_one_more(ref):
    p = Pool(build("llama"))
    p.generate(ids(20), **GREEDY)
    size = p.held_bytes  # 24 tokens: 2 layers x (keys + values) x [1, 2, 24, 16] floats
    assert size == 2 * 2 * 2 * 24 * 16 * 4
    for budget, kept in ((size, 1), (size - 1, 0)):
        q = Pool(build("llama"), max_bytes=budget)
        q.generate(ids(20), **GREEDY)
        assert len(q.entries) == kept
