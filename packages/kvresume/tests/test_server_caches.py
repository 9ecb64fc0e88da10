"""The calls a chat server makes beside a cache, each decision fed the case that contradicts it: a StaticCache shorter
than the conversation and its new tokens, `cache_implementation` beside a cache, the caller's own `cache_position` /
`position_ids`, a Mamba model (its multi-token forward over a filled cache restarts the SSM scan), a QuantizedCache.
resume() equals the no-cache greedy run or refuses by name before any work, its fix applied here and shown to work;
the pool never raises where generate() would not."""
from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
import transformers
from transformers import Cache, DynamicCache, GenerationConfig, StaticCache
from transformers.cache_utils import QuantizedLayer

from kvresume import ResumeInputError, compat, resume, track
from kvresume import testing as T
from kvresume.ledger import ledger_of
from kvresume.pool import Pool
from kvresume.prefix import record_of
from kvresume.reuse import apply_fix

NEW = 4
G = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
IDS = torch.randint(10, 2000, (1, 20), generator=torch.Generator().manual_seed(0))
LONGER = torch.cat([IDS, torch.randint(10, 2000, (1, 6), generator=torch.Generator().manual_seed(1))], 1)


@pytest.fixture(scope="module")
def dense() -> torch.nn.Module:
    m = T.build("dense")
    track(m)
    return m


@pytest.fixture(scope="module")
def mamba() -> torch.nn.Module:
    torch.manual_seed(0)
    m = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=2048, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)).eval()
    track(m)
    return m


@torch.no_grad()
def prefill(m: torch.nn.Module, cache: Any = None, ids: torch.Tensor = IDS) -> Any:
    """A tracked cache (a DynamicCache unless given) written by one forward over ids."""
    cache = DynamicCache(config=m.config) if cache is None else cache
    m(input_ids=ids, attention_mask=torch.ones_like(ids), **{compat.cache_kwarg(m): cache}, use_cache=True)
    return cache


def static(m: torch.nn.Module, length: int) -> StaticCache:
    return StaticCache(config=compat.text_config(m.config), max_cache_len=length)


_REFS: dict[tuple, Any] = {}


@torch.no_grad()
def reference(m: torch.nn.Module, ids: torch.Tensor = LONGER, **kw: Any) -> Any:
    """The no-cache greedy run over the whole conversation (remembered per model, ids and arguments)."""
    key = (id(m), tuple(ids.reshape(-1).tolist()), repr(sorted(kw.items())))
    if key not in _REFS:
        _REFS[key] = type(m).generate(m, ids, attention_mask=torch.ones_like(ids), **{**G, **kw})
    return _REFS[key]


def diff(out: Any, ref: Any) -> float:
    """Max |logit diff| over the new tokens; the tokens asserted equal."""
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    return max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits))


@torch.no_grad()
def call(m: torch.nn.Module, cache: Any, **kw: Any) -> Any:
    return resume(m, LONGER, cache, attention_mask=torch.ones_like(LONGER), **{**G, **kw})


def refused(m: torch.nn.Module, cache: Any, check: str, **kw: Any) -> ResumeInputError:
    """The refusal by name, raised before any work: the cache holds what it held."""
    held = ledger_of(cache).length if ledger_of(cache) is not None else None
    with pytest.raises(ResumeInputError) as info:
        call(m, cache, **kw)
    assert info.value.check == check, info.value
    assert (ledger_of(cache).length if ledger_of(cache) is not None else None) == held
    return info.value


def fixed(m: torch.nn.Module, exc: ResumeInputError, cache: Any, **kw: Any) -> Any:
    """resume() with the refusal's fix applied."""
    cache, kwargs = apply_fix(exc.fix, cache, {"attention_mask": torch.ones_like(LONGER), **G, **kw})
    with torch.no_grad():
        return resume(m, LONGER, cache, **kwargs)


@pytest.mark.parametrize("room, ok", [(29, False), (30, True)])  # 20 cached + 6 new ids + 4 new tokens = 30
def test_a_static_cache_one_slot_short_is_refused_and_its_fix_equals(dense, room, ok):
    cache, ref = prefill(dense, static(dense, room)), reference(dense)
    if ok:
        out = call(dense, cache)
        assert diff(out, ref) < 1e-4 and record_of(out).reused == 20
        return
    exc = refused(dense, cache, "static_cache_short")
    assert "max_cache_len=29" in str(exc) and "needs 30" in str(exc) and compat.static_capacity(exc.fix["cache"]) == 30
    assert diff(fixed(dense, exc, cache), ref) < 1e-4


def test_a_static_cache_counts_max_length_as_well(dense):
    exc = refused(dense, prefill(dense, static(dense, 29)), "static_cache_short", max_new_tokens=None, max_length=30)
    assert "needs 30" in str(exc)
    out = call(dense, prefill(dense, static(dense, 29)), max_new_tokens=None, max_length=29)  # 3 new tokens: fits
    ref = reference(dense, max_new_tokens=3)
    assert torch.equal(out.sequences[:, -3:], ref.sequences[:, -3:]) and record_of(out).reused == 20


@pytest.mark.parametrize("where", ["kwargs", "config"])
def test_cache_implementation_of_the_cache_s_own_class_resumes_another_is_refused(dense, where):
    def kw(impl: str) -> dict[str, Any]:
        return {"cache_implementation": impl} if where == "kwargs" else {
            "generation_config": GenerationConfig(cache_implementation=impl, **G)}
    ref = reference(dense)
    out = call(dense, prefill(dense, static(dense, 64)), **kw("static"))
    assert diff(out, ref) < 1e-4 and record_of(out).reused == 20
    if where == "kwargs":
        out = call(dense, prefill(dense), **kw("dynamic"))
        assert diff(out, ref) < 1e-4 and record_of(out).reused == 20
    cache = prefill(dense)
    exc = refused(dense, cache, "cache_implementation", **kw("static"))
    assert "cache_implementation='static'" in str(exc) and "DynamicCache" in str(exc)
    out = fixed(dense, exc, cache, **kw("static"))
    assert diff(out, ref) < 1e-4 and record_of(out).reused == 20


def test_a_callers_cache_position_is_refused_and_dropping_it_equals(dense):
    cache = prefill(dense)
    exc = refused(dense, cache, "cache_position", cache_position=torch.arange(20, 26))
    out = fixed(dense, exc, cache, cache_position=torch.arange(20, 26))
    assert diff(out, reference(dense)) < 1e-4 and record_of(out).reused == 20


def test_the_callers_position_ids_are_reused_where_equal_and_re_prefilled_with_where_not(dense):
    same = torch.arange(26).view(1, -1)
    out = call(dense, prefill(dense), position_ids=same)
    assert diff(out, reference(dense)) < 1e-4 and record_of(out).reused == 20
    other = same.clone()
    other[:, 20:] += 9  # a gap before the new turn: not what resume() would feed after the cached slots
    out = call(dense, prefill(dense), position_ids=other)
    assert record_of(out).reason == "positions" and record_of(out).reused == 0
    ref = reference(dense, position_ids=other)
    assert diff(out, ref) < 1e-4  # and they change the answer: resumed at its own positions it would differ
    assert max(float((a - b).abs().max()) for a, b in zip(ref.logits, reference(dense).logits)) > 1e-3
    cache = prefill(dense)
    exc = refused(dense, cache, "position_ids", position_ids=same[:, 20:])
    assert "6 columns and the ids 26" in str(exc)
    assert diff(fixed(dense, exc, cache, position_ids=same[:, 20:]), reference(dense)) < 1e-4


@torch.no_grad()
def test_mamba_restarts_its_scan_on_a_filled_cache_so_resume_re_prefills_and_equals(mamba, dense):
    full = mamba(LONGER).logits
    cache = prefill(mamba)
    chunk = mamba(LONGER[:, 20:], **{compat.cache_kwarg(mamba): cache}, use_cache=True).logits
    assert float((chunk - full[:, 20:]).abs().max()) > 1e-3  # transformers' own multi-token continuation: not exact
    cache = prefill(mamba)
    for i in range(20, 26):  # one token at a time it is
        step = mamba(LONGER[:, i:i + 1], **{compat.cache_kwarg(mamba): cache}, use_cache=True).logits
    assert float((step[:, -1] - full[:, -1]).abs().max()) < 1e-4
    ref = reference(mamba)
    out = call(mamba, prefill(mamba))
    assert diff(out, ref) == 0.0 and record_of(out).reason == "recurrent" and record_of(out).reused == 0
    assert compat.restarts_scan(mamba) and not compat.restarts_scan(dense)
    pool = Pool(mamba)
    x = LONGER
    for _ in range(2):  # a chat through the pool: re-prefilled, with its reason, equal to generate()
        got = pool.generate(x, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        assert torch.equal(got, reference(mamba, x).sequences) and "restarts its SSM scan" in pool.last.detail
        x = torch.cat([got, LONGER[:, :3]], 1)


class HalfLayer(QuantizedLayer):
    """transformers' QuantizedLayer with bfloat16 as its "quantization" (no quanto / HQQ needed)."""

    def _quantize(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        return tensor.to(torch.bfloat16)

    def _dequantize(self, q: torch.Tensor) -> torch.Tensor:
        return q.float()


def quantized(m: torch.nn.Module, backend: str | None) -> Cache:
    if backend is None:
        return Cache(layers=[HalfLayer(residual_length=8) for _ in range(m.config.num_hidden_layers)])
    return transformers.QuantizedCache(backend=backend, config=m.config, residual_length=8)


QUANTO = importlib.util.find_spec("optimum") is not None and transformers.utils.is_optimum_quanto_available()


@pytest.mark.parametrize("backend", [None, pytest.param("quanto", marks=pytest.mark.skipif(
    not QUANTO, reason="optimum-quanto is not installed: QuantizedCache(backend='quanto') raises ImportError"))])
def test_a_quantized_cache_is_refused_and_a_new_cache_equals(dense, backend):
    cache = prefill(dense, quantized(dense, backend))
    exc = refused(dense, cache, "ledger_unfollowed")
    assert "quantized" in str(exc) and exc.fix == {"cache": None}
    assert diff(fixed(dense, exc, cache), reference(dense)) < 1e-4
    out = call(dense, prefill(dense))  # the contradicting case: a DynamicCache is followed and reused
    assert record_of(out).reused == 20


def test_the_pool_re_prefills_a_servers_arguments_never_raising_where_generate_does_not(dense, monkeypatch):
    pool, plain = Pool(dense), (lambda **kw: type(dense).generate(dense, LONGER, **kw))
    greedy = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    for extra in ({"cache_implementation": "static"}, {"generation_config": GenerationConfig(
            cache_implementation="static", **greedy)}, {"position_ids": torch.arange(26).view(1, -1) + 3}):
        assert torch.equal(pool.generate(LONGER, **greedy, **extra), plain(**greedy, **extra))
        assert pool.last.reason == "re-prefilled" and pool.last.reused == 0
    with pytest.raises(ValueError):  # generate() itself rejects a cache_position (the model's forward takes none)
        plain(**greedy, cache_position=torch.arange(26))
    with pytest.raises(ValueError):  # and so does the pool, as generate() does
        pool.generate(LONGER, **greedy, cache_position=torch.arange(26))
    assert torch.equal(pool.generate(LONGER, **greedy), plain(**greedy))
    longer = torch.cat([plain(**greedy), LONGER[:, :2]], 1)
    monkeypatch.setattr("kvresume.pool.resume", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    got = pool.generate(longer, **greedy)  # a resume that raises anything: a miss, never the pool's error
    assert torch.equal(got, type(dense).generate(dense, longer, **greedy)) and "RuntimeError: boom" in pool.last.detail
    streamer = transformers.generation.streamers.BaseStreamer()  # what it streamed cannot be taken back
    with pytest.raises(RuntimeError, match="boom"):
        pool.generate(longer, **greedy, streamer=streamer)
