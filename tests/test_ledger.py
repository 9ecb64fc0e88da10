"""The token ledger (kvresume.ledger / track), the guard's ledger checks, resume and the factory's ledger: each
ledger check pinned by a case it must refuse and a valid twin it must pass, on a tiny Llama (CPU, float32)."""
from __future__ import annotations

import copy
import io

import pytest
import torch
from transformers import DynamicCache

from kvresume import ResumeInputError, check_resume_inputs, export_tensors, kv_cache_from_tensors, ledger_of, resume, track
from kvresume.factory import FactoryError
from kvresume.ledger import keep_slots, without_ledger
from kvresume.reuse import apply_fix
from kvresume import compat
from helpers.proposal.shapes import last_logits
from helpers.models import tiny_llama
from helpers.continuation import generate_first_step, greedy_config

FLOOR = 1e-5  # float32 CPU, a 2-layer model: same computation reordered stays far below this


@pytest.fixture(scope="module")
def model():
    m = tiny_llama(0)
    track(m)
    return m


def ids_of(*lengths: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 2000, (1, n), generator=gen) for n in lengths]


@torch.no_grad()
def prefill(model, ids, **kwargs):
    return model(input_ids=ids, past_key_values=DynamicCache(config=model.config), **kwargs).past_key_values


def refusal(model, ids, cache, **kwargs) -> ResumeInputError | None:
    try:
        check_resume_inputs(model, ids, past_key_values=copy.deepcopy(cache), **kwargs)
    except ResumeInputError as exc:
        return exc
    return None


def restores(model, ids, cache, error, kwargs) -> float:
    """max |diff| of the call with the refusal's fix applied vs the full forward over `ids`."""
    fixed_cache, fixed = apply_fix(error.fix, cache, {"input_ids": ids, **kwargs})
    out = generate_first_step(model, fixed.pop("input_ids"), fixed_cache, **fixed)
    return float((out.logits - last_logits(model, input_ids=ids)).abs().max())


def reused(model):
    """The documented prefix-caching recipe without copy.deepcopy: question 1's generate() extended the shared cache."""
    prefix, q1, q2 = ids_of(8, 4, 10)
    shared = prefill(model, prefix)
    kept = copy.deepcopy(shared)
    first = torch.cat([prefix, q1], 1)
    with torch.no_grad():
        model.generate(first, attention_mask=torch.ones_like(first), past_key_values=shared, max_new_tokens=3,
                       min_new_tokens=3, do_sample=False)
    return torch.cat([prefix, q2], 1), shared, kept


def test_the_ledger_records_tokens_and_positions_and_travels(model):
    (ids,) = ids_of(10)
    cache = prefill(model, ids)
    led = ledger_of(cache)
    assert torch.equal(led.token_ids, ids) and led.positions.tolist() == [[list(range(10))]]
    assert torch.equal(ledger_of(copy.deepcopy(cache)).token_ids, ids)
    buf = io.BytesIO()
    torch.save(cache, buf)
    buf.seek(0)
    assert torch.equal(ledger_of(torch.load(buf, weights_only=False)).token_ids, ids)
    cropped = copy.deepcopy(cache)
    cropped.crop(-3)
    assert torch.equal(ledger_of(cropped).token_ids, ids[:, :7])
    beams = copy.deepcopy(cache)
    beams.batch_repeat_interleave(2)
    assert ledger_of(beams).batch == 2
    assert ledger_of(without_ledger(cache)) is None
    stale = copy.deepcopy(cache)
    keep_slots(stale, [0, 1, 9])
    assert ledger_of(stale) is None  # the K/V still hold 10 slots: a ledger of 3 does not describe them


def test_an_eviction_keeps_the_retained_slots_entries_and_the_guard_names_the_positions(model):
    (ids,) = ids_of(13)
    cache = prefill(model, ids[:, :12])
    kept = [0, 1, 2, 3, 8, 9, 10, 11]  # a sink of 4 and a window of 4 (06's streaming shape)
    pairs = [(k[:, :, kept], v[:, :, kept]) for k, v in export_tensors(cache)[0]]
    led = ledger_of(cache).slots(kept)
    evicted = kv_cache_from_tensors(pairs, model.config, token_ids=led.token_ids, positions=led.positions)
    assert ledger_of(evicted).positions[0, 0].tolist() == kept
    mask = torch.ones(1, 9, dtype=torch.long)
    error = refusal(model, ids[:, -1:], evicted, attention_mask=mask)
    assert error.check == "ledger_positions" and "[12]" in str(error) and error.fix["position_ids"].tolist() == [[12]]
    assert refusal(model, ids[:, -1:], evicted, attention_mask=mask, position_ids=torch.tensor([[12]])) is None


def test_generate_extends_the_ledger_and_an_untracked_cache_stays_untracked(model):
    ids, shared, kept = reused(model)
    assert ledger_of(shared).length == shared.get_seq_length() == 14
    bare = tiny_llama(0)
    with torch.no_grad():
        assert ledger_of(bare(input_ids=ids, use_cache=True).past_key_values) is None


def test_ledger_tokens_refuses_a_reused_cache_and_its_crop_restores(model):
    ids, shared, kept = reused(model)
    mask = {"attention_mask": torch.ones_like(ids)}
    error = refusal(model, ids, shared, **mask)
    assert error.check == "ledger_tokens" and "position 8" in str(error) and error.fix == {"crop": 8}
    assert restores(model, ids, shared, error, mask) < FLOOR
    assert refusal(model, ids, kept, **mask) is None  # the valid twin: copy.deepcopy before reuse
    assert refusal(model, ids, without_ledger(shared), **mask) is None  # untracked: today's guard misses it


def resumed(model, whole, cache) -> float:
    """max |diff| of resume() on the whole sequence from a copy of the cache vs the full forward over `whole`."""
    out = resume(model, whole, copy.deepcopy(cache), generation_config=greedy_config(model))
    return float((compat.generate_logits(out)[0] - last_logits(model, input_ids=whole)).abs().max())


def test_ledger_tokens_names_resume_on_the_whole_sequence_for_a_suffix_read_as_whole_ids(model):
    (ids,) = ids_of(20)
    cache = prefill(model, ids[:, :8])
    error = refusal(model, ids[:, 8:], cache, attention_mask=torch.ones(1, 12, dtype=torch.long))
    assert error.check == "ledger_tokens" and error.fix == {"resume": True} and "20 columns" in str(error)
    assert resumed(model, ids, cache) < FLOOR
    assert refusal(model, ids[:, 8:], cache, attention_mask=torch.ones(1, 20, dtype=torch.long)) is None


def test_ledger_tokens_advice_restores_a_reused_cache_given_only_the_new_token(model):
    """06's reused_no_copy · neither: the mask-and-positions route would continue the other request (wrong); resume on
    the whole sequence crops to the common prefix."""
    ids, shared, kept = reused(model)
    error = refusal(model, ids[:, -1:], shared)
    assert error.check == "ledger_tokens" and error.fix == {"resume": True}
    assert resumed(model, ids, shared) < FLOOR
    continued = torch.ones(1, shared.get_seq_length() + 1, dtype=torch.long)
    out = generate_first_step(model, ids[:, -1:], copy.deepcopy(shared), attention_mask=continued)
    assert float((out.logits - last_logits(model, input_ids=ids)).abs().max()) > FLOOR  # the other route: wrong


def test_ledger_length_refuses_a_cache_holding_every_given_id(model):
    (ids,) = ids_of(12)
    full = prefill(model, ids)
    error = refusal(model, ids, full, attention_mask=torch.ones_like(ids))
    assert error.check == "ledger_length" and error.fix == {"crop": 11}
    assert restores(model, ids, full, error, {"attention_mask": torch.ones_like(ids)}) < FLOOR
    assert refusal(model, ids, prefill(model, ids[:, :11]), attention_mask=torch.ones_like(ids)) is None


def _padded(model):
    rows = ids_of(8, 14, seed=3)
    ids, mask = torch.zeros(2, 14, dtype=torch.long), torch.zeros(2, 14, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 14 - r.shape[1]:], mask[i, 14 - r.shape[1]:] = r, 1
    new = ids_of(6, seed=4)[0].view(2, 3)
    whole, full = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new)], 1)
    ref = torch.cat([last_logits(model, input_ids=torch.cat([r, new[i:i + 1]], 1)) for i, r in enumerate(rows)])
    return ids, mask, whole, full, ref


def test_ledger_positions_refuses_a_padded_prefix_prefilled_without_positions(model):
    ids, mask, whole, full, ref = _padded(model)
    bare = prefill(model, ids, attention_mask=mask)
    placed = prefill(model, ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).masked_fill(mask == 0, 1))
    error = refusal(model, whole, bare, attention_mask=full)
    assert error.check == "ledger_positions" and "[14, 14]" in str(error)
    fixed_cache, fixed = apply_fix(error.fix, bare, {"attention_mask": full})
    out = generate_first_step(model, whole, fixed_cache, **fixed)
    assert float((out.logits - ref).abs().max()) < FLOOR
    assert refusal(model, whole, placed, attention_mask=full) is None


def test_ledger_mask_refuses_attending_to_padding(model):
    ids, mask, whole, full, ref = _padded(model)
    placed = prefill(model, ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).masked_fill(mask == 0, 1))
    error = refusal(model, whole[:, 14:], placed, attention_mask=torch.ones(2, 17, dtype=torch.long))
    assert error.check == "ledger_mask" and torch.equal(error.fix["attention_mask"], full)
    assert refusal(model, whole[:, 14:], placed, attention_mask=full) is None


def test_ledger_positions_refuses_a_re_fed_token_at_a_cached_position(model):
    (ids,) = ids_of(12)
    full = prefill(model, ids)
    kwargs = {"attention_mask": torch.ones(1, 13, dtype=torch.long), "position_ids": torch.tensor([[11]])}
    error = refusal(model, ids[:, -1:], full, **kwargs)
    assert error.check == "ledger_positions" and error.fix["crop"] == 11
    fixed_cache, fixed = apply_fix(error.fix, full, {"input_ids": ids[:, -1:], **kwargs})
    out = generate_first_step(model, fixed.pop("input_ids"), fixed_cache, **fixed)
    assert float((out.logits - last_logits(model, input_ids=ids)).abs().max()) < FLOOR
    assert refusal(model, ids[:, -1:], prefill(model, ids[:, :11]), attention_mask=torch.ones(1, 12, dtype=torch.long),
                   position_ids=torch.tensor([[11]])) is None


def test_check_resume_inputs_raises_generates_own_error_unchanged(model):
    (ids,) = ids_of(12)
    cache = prefill(model, ids[:, :11])
    with pytest.raises(ValueError) as info:
        check_resume_inputs(model, ids, past_key_values=cache, attention_mask=torch.ones_like(ids), not_an_argument=1)
    assert not isinstance(info.value, ResumeInputError) and "not_an_argument" in str(info.value)


def test_resume_keeps_the_common_prefix_and_matches_the_full_forward(model):
    ids, shared, _ = reused(model)
    out = resume(model, ids, copy.deepcopy(shared), generation_config=greedy_config(model))
    assert float((out.logits[0] - last_logits(model, input_ids=ids)).abs().max()) < FLOOR
    _, mask, whole, full, ref = _padded(model)
    bare = prefill(model, _padded(model)[0], attention_mask=mask)
    out = resume(model, whole, bare, generation_config=greedy_config(model))
    assert float((out.logits[0] - ref).abs().max()) < FLOOR


def test_the_factory_takes_a_ledger_and_checks_it(model):
    (ids,) = ids_of(10)
    pairs, _, n = export_tensors(prefill(model, ids))
    built = kv_cache_from_tensors(pairs, model.config, token_ids=ids)
    assert torch.equal(ledger_of(built).token_ids, ids) and ledger_of(built).positions[0, 0, -1] == 9
    with pytest.raises(FactoryError, match="token_ids"):
        kv_cache_from_tensors(pairs, model.config, token_ids=ids[:, :9])
    assert ledger_of(kv_cache_from_tensors(pairs, model.config)) is None


def test_ledger_positions_crops_a_reused_cache_to_the_prefix_the_fed_position_continues(model):
    """06's reused_no_copy · both: explicit positions at the caller's next token, the cache holding another request's
    slots at and after them: crop to the slots before; the valid twin (copy.deepcopy before reuse) passes."""
    (ids,) = ids_of(12)
    n = 11
    kept = prefill(model, ids[:, :n])
    shared = copy.deepcopy(kept)
    other = torch.cat([ids[:, :n], ids_of(4, seed=7)[0]], 1)  # another request's question on the same cache object
    with torch.no_grad():
        model.generate(other, attention_mask=torch.ones_like(other), past_key_values=shared, max_new_tokens=2,
                       min_new_tokens=2, do_sample=False)
    assert shared.get_seq_length() == n + 5
    kwargs = {"attention_mask": torch.ones(1, n + 6, dtype=torch.long), "position_ids": torch.tensor([[n]])}
    error = refusal(model, ids[:, -1:], shared, **kwargs)
    assert error.check == "ledger_positions" and error.fix["crop"] == n and error.fix["attention_mask"].shape == (1, n + 1)
    assert "another request" in str(error)
    fixed_cache, fixed = apply_fix(error.fix, shared, {"input_ids": ids[:, -1:], **kwargs})
    out = generate_first_step(model, fixed.pop("input_ids"), fixed_cache, **fixed)
    assert float((out.logits - last_logits(model, input_ids=ids)).abs().max()) < FLOOR
    twin = {"attention_mask": torch.ones(1, n + 1, dtype=torch.long), "position_ids": torch.tensor([[n]])}
    assert refusal(model, ids[:, -1:], kept, **twin) is None


def test_ledger_positions_names_the_cropped_token_a_prefix_one_short_lacks(model):
    """06's crop_short · both: copy.deepcopy + crop(n - 1) keeps the ledger whole (trimmed lazily); positions at the
    caller's next token skip the cropped one: resume re-feeds it. Twins: the same positions on the uncropped cache, and
    a crop then another token at the cropped position (assisted decoding's step) pass."""
    (ids,) = ids_of(12)
    full = prefill(model, ids[:, :11])
    short = copy.deepcopy(full)
    short.crop(-1)
    assert ledger_of(short).length == 10 and ledger_of(short).token_ids.tolist() == ids[:, :10].tolist()
    kwargs = {"attention_mask": torch.ones(1, 11, dtype=torch.long), "position_ids": torch.tensor([[11]])}
    error = refusal(model, ids[:, -1:], short, **kwargs)
    assert error.check == "ledger_positions" and error.fix == {"resume": True} and f"[{int(ids[0, 10])}]" in str(error)
    assert resumed(model, ids, short) < FLOOR
    assert refusal(model, ids[:, -1:], full, attention_mask=torch.ones(1, 12, dtype=torch.long),
                   position_ids=torch.tensor([[11]])) is None
    assert refusal(model, ids[:, -1:], short, attention_mask=torch.ones(1, 11, dtype=torch.long),
                   position_ids=torch.tensor([[10]])) is None


def test_group_06_judges_an_exact_prefix_against_the_full_forward_and_an_eviction_against_its_own(model):
    """08's group 06 reference, decided from 06's slot comparison: a prefix one short or extended by another request
    (crop_short, reused_no_copy) -> the full forward; the same lengths with the first slot evicted, or the cache
    unchanged (identity) -> the explicit-position forward over what it holds."""
    from helpers.proposal.groups import exact_prefix

    (ids,) = ids_of(11)
    full = prefill(model, ids)
    short = copy.deepcopy(full)
    short.crop(-1)
    extended = copy.deepcopy(full)
    with torch.no_grad():
        model(input_ids=ids_of(3, seed=9)[0], past_key_values=extended)
    first = kv_cache_from_tensors([(k[:, :, 1:], v[:, :, 1:]) for k, v in export_tensors(full)[0]], model.config)
    assert exact_prefix(full, short) and exact_prefix(full, extended)
    assert not exact_prefix(full, first) and not exact_prefix(full, copy.deepcopy(full))


def test_ledger_processed_crops_slots_after_the_processed_length_and_re_feeds_tokens_a_crop_removed(model):
    """06's mask_only cells given the caller's processed length: a cache another request extended (crop to it,
    restores) and a prefix one short (resume re-feeds, restores); the twin: the cache holding exactly what was processed."""
    (ids,) = ids_of(12)
    n = 11
    kept = prefill(model, ids[:, :n])
    shared = copy.deepcopy(kept)
    with torch.no_grad():
        model(input_ids=ids_of(5, seed=8)[0], past_key_values=shared)  # another request's 5 slots on the same object
    wide = {"attention_mask": torch.ones(1, n + 6, dtype=torch.long)}
    assert refusal(model, ids[:, -1:], shared, **wide) is None  # its own inputs: the other request's valid next step
    error = refusal(model, ids[:, -1:], shared, processed_length=n, **wide)
    assert error.check == "ledger_processed" and error.fix["crop"] == n and error.fix["attention_mask"].shape == (1, n + 1)
    assert _fixed(model, ids, shared, error, wide) < FLOOR
    short = copy.deepcopy(kept)
    short.crop(-1)
    error = refusal(model, ids[:, -1:], short, processed_length=n, attention_mask=torch.ones(1, n, dtype=torch.long))
    assert error.check == "ledger_processed" and error.fix == {"resume": True} and resumed(model, ids, short) < FLOOR
    assert refusal(model, ids[:, -1:], kept, processed_length=n, attention_mask=torch.ones(1, n + 1, dtype=torch.long)) is None


def _fixed(model, ids, cache, error, kwargs) -> float:
    """max |diff| of the last token's call with the fix applied vs the full forward over `ids`."""
    fixed_cache, fixed = apply_fix(error.fix, cache, {"input_ids": ids[:, -1:], **kwargs})
    out = generate_first_step(model, fixed.pop("input_ids"), fixed_cache, **fixed)
    return float((out.logits - last_logits(model, input_ids=ids)).abs().max())
