"""resume() across cache families on a chat server's calls: the next turn over the output's own cache (no copy),
a regenerated answer and an edited earlier message on dense, sliding past its window, hybrid (linear states) and a
StaticCache; each equals the no-cache greedy run with its reused-token count; where the cache cannot drop slots the
guard's refusal names it and its advice (resume) restores."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers.cache_utils import StaticLayer

from kvresume import ResumeInputError, check_resume_inputs, resume, testing as T
from kvresume.reuse import apply_fix

from chat_common import NEW, assert_same, cache_kw, cfg, prefill, record, reference, tracked

STATIC_CROPS = hasattr(StaticLayer, "crop")  # 5.25.0 gives static layers a crop; 5.17.0 has none
FAMILIES = [("dense", False), ("sliding", False), ("hybrid", False), ("dense", True)]


def _ids(k: int, seed: int) -> torch.Tensor:
    return torch.randint(10, 2038, (1, k), generator=torch.Generator().manual_seed(seed))


def _crops(kind: str, static: bool, keep: int, held: int) -> bool:
    """Whether this family's cache can drop its slots after `keep` (what resume() then reuses)."""
    if keep >= held:
        return True
    if static:
        return STATIC_CROPS
    return kind == "dense" or (kind == "sliding" and held < 15)


@pytest.mark.e2e  # a multi-step run: in `make test`, not test-fast
@pytest.mark.parametrize("kind,static", FAMILIES)
def test_three_turns_over_the_outputs_cache(kind: str, static: bool) -> None:
    """Each turn: the whole conversation so far (the last answer included) + a new message, resumed from the cache
    the previous resume() wrote: all of it reused but the answer's last token (never fed), the cache not copied."""
    m = tracked(kind)
    conv = _ids(20, 1)
    cache = prefill(m, conv[:, :-1], static=static)
    held = conv.shape[1] - 1
    for turn in range(3):
        out = resume(m, conv, cache, generation_config=cfg())
        assert_same(out, reference(m, conv), kind)
        assert (record(out).cached, record(out).reused, record(out).reason) == (held, held, "extends")
        written = getattr(out, "past_key_values", None) or out.cache
        assert written is cache  # resumed in place: no copy of the cache
        held = conv.shape[1] + NEW - 1  # the answer's last token was never fed
        conv = torch.cat([conv, out.sequences[:, -NEW:], _ids(3, 10 + turn)], 1)


@pytest.mark.parametrize("kind,static", FAMILIES)
@pytest.mark.parametrize("case", ["regenerate", "edit"])
def test_regenerate_and_edit(kind: str, static: bool, case: str) -> None:
    """Regenerate: ids = the prompt, the cache also holds the old answer. Edit: an earlier token changed. resume()
    reuses what the cache can keep (re-prefills where it cannot drop slots); the guard's refusal of the plain call
    says crop where the cache crops, else resume, and that advice restores."""
    m = tracked(kind)
    held_ids = _ids(24, 2)
    cache = prefill(m, held_ids, static=static)
    if case == "regenerate":
        whole, common = held_ids[:, :18], 18
    else:
        whole, common = torch.cat([held_ids[:, :10], _ids(8, 3)], 1), 10
    keep = min(common, whole.shape[1] - 1)
    ref = reference(m, whole)
    with pytest.raises(ResumeInputError) as err:
        check_resume_inputs(m, whole, **{cache_kw(m): copy.deepcopy(cache)}, generation_config=cfg())
    crops = _crops(kind, static, keep, 24)
    if err.value.fix.get("resume"):
        assert not crops or kind == "hybrid", err.value
    else:
        fixed, kw = apply_fix(err.value.fix, cache, {"input_ids": whole, "generation_config": cfg()})
        assert_same(m.generate(**kw, **{cache_kw(m): fixed}), ref, kind)
    out = resume(m, whole, cache, generation_config=cfg())
    assert_same(out, ref, kind)
    want = keep if crops and kind != "hybrid" else 0
    assert record(out).reused == want, record(out)
    assert record(out).fed == whole.shape[1] - want


def test_record_on_a_plain_tensor_output() -> None:
    """generate() returning a tensor (return_dict_in_generate False): the record is on it and on the cache."""
    m = tracked("dense")
    conv = _ids(20, 1)
    cache = prefill(m, conv[:, :12])
    out = resume(m, conv, cache, generation_config=T.config(max_new_tokens=NEW, return_dict_in_generate=False,
                                                             output_logits=False))
    ref = reference(m, conv)
    assert torch.equal(out[:, -NEW:], ref.sequences[:, -NEW:])
    from kvresume import resume_report
    assert resume_report(out) == resume_report(cache) and resume_report(out).reused == 12
