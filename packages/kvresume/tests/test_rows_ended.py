"""A batch row that ended early: generate() wrote EOS, then padding (attended, at positions counting on) after it; the
caller's mask hides that padding (0) and each row goes on with its next message, the suffix left- or right-padded.
The ledger records per row the positions the slots were written at, so the row's last slot sits past its EOS; what a
no-cache run of the same mask (and so the plain call) continues at is 1 + the last slot the mask attends. The plain
call passes and equals the no-cache run; calls that are truly wrong stay refused: positions that continue the hidden
padding (the old advice, 0.63 off), and a mask hiding a slot before attended ones (the slots after it were written
counting it)."""
from __future__ import annotations

import copy

import pytest
import torch

from kvresume import ResumeInputError, guarded_generate, ledger_of, track
from kvresume.reuse import apply_fix
from kvresume.testing import build, floor

NEW, PROMPT, STEPS = 3, 8, 6
A = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)


@pytest.fixture(scope="module")
def model():
    m = build("dense")
    tracker = track(m)
    yield m
    tracker.remove()


@pytest.fixture(scope="module")
def ended(model):
    """(sequences, cache, mask hiding row 0's padding after its EOS): row 0 ends at its 2nd new token, row 1 runs on."""
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(10, 2000, (2, PROMPT), generator=g)
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=STEPS, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True)
    with torch.no_grad():
        free = model.generate(prompt, **kw).sequences[:, PROMPT:]
        eos = int(free[0, 1])
        assert eos not in free[1].tolist()
        out = model.generate(prompt, eos_token_id=eos, **kw)
    seq, cache = out.sequences, out.past_key_values
    assert seq[0, PROMPT + 2:].eq(0).all() and cache.get_seq_length() == PROMPT + STEPS - 1
    led = ledger_of(cache)  # row 0's padding was written attended, at positions counting on past its EOS
    assert led.mask.all() and led.positions[0, 0, -1] == PROMPT + STEPS - 2
    mask = torch.ones_like(seq)
    mask[0, PROMPT + 2:] = 0
    return seq, cache, mask, torch.randint(10, 2000, (2, 5), generator=g)


def conversation(ended, pad: str):
    """The whole ids and mask: each row's next message after the cached part, row 0's 3 tokens padded to 5."""
    seq, _, mask, message = ended
    suffix, suffix_mask = message.clone(), torch.ones_like(message)
    cols = slice(0, 2) if pad == "left" else slice(3, 5)
    suffix[0, cols], suffix_mask[0, cols] = 0, 0
    return torch.cat([seq, suffix], 1), torch.cat([mask, suffix_mask], 1)


@torch.no_grad()
def reference(m, whole, mask):
    return m.generate(whole, attention_mask=mask, use_cache=False, **A)


@torch.no_grad()
def unguarded(m, whole, cache, **kwargs):
    return m.generate(whole, past_key_values=copy.deepcopy(cache), **kwargs, **A)


def diff(out, ref) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(out.logits, ref.logits))


def assert_same(out, ref) -> float:
    assert torch.equal(out.sequences[:, -NEW:], ref.sequences[:, -NEW:])
    d = diff(out, ref)
    assert d <= floor("dense"), d
    return d


@pytest.mark.parametrize("pad", ["left", "right"])
def test_the_plain_call_passes_and_equals_no_cache(model, ended, pad):
    whole, mask = conversation(ended, pad)
    with torch.no_grad():
        out = guarded_generate(model, whole, attention_mask=mask, past_key_values=copy.deepcopy(ended[1]), **A)
    print(pad, "-padded suffix: plain call passes, max logit diff", assert_same(out, reference(model, whole, mask)))


def test_positions_continuing_the_hidden_padding_are_refused_and_the_fix_equals(model, ended):
    whole, mask = conversation(ended, "left")
    cache, f = ended[1], whole.shape[1] - ended[1].get_seq_length()
    old = (cache.get_seq_length() + torch.arange(f)).expand(2, f)  # the old advice: from each row's last slot
    ref = reference(model, whole, mask)
    wrong = diff(unguarded(model, whole, cache, attention_mask=mask, position_ids=old), ref)
    assert wrong > 100 * floor("dense"), wrong
    with pytest.raises(ResumeInputError) as exc:
        with torch.no_grad():
            guarded_generate(model, whole, attention_mask=mask, position_ids=old, past_key_values=copy.deepcopy(cache), **A)
    error = exc.value
    assert error.check == "ledger_positions" and "continue at [10, 13]" in str(error), str(error)
    fixed, kwargs = apply_fix(error.fix, cache, {"attention_mask": mask})
    with torch.no_grad():
        out = guarded_generate(model, whole, past_key_values=fixed, **kwargs, **A)
    print("old advice", wrong, "off: refused; its fix: max logit diff", assert_same(out, ref))


def test_a_mask_hiding_a_slot_before_attended_ones_is_refused(model, ended):
    whole, mask = conversation(ended, "left")
    mask = mask.clone()
    mask[1, 3] = 0  # row 1: a real prompt slot hidden; the slots after it were written counting it
    wrong = diff(unguarded(model, whole, ended[1], attention_mask=mask), reference(model, whole, mask))
    assert wrong > 100 * floor("dense"), wrong
    with pytest.raises(ResumeInputError) as exc:
        with torch.no_grad():
            guarded_generate(model, whole, attention_mask=mask, past_key_values=copy.deepcopy(ended[1]), **A)
    assert exc.value.check == "ledger_positions", str(exc.value)
    print("hole: plain call", wrong, "off: refused")


def test_padding_left_attended_continues_after_it(model, ended):
    """The mask attends row 0's padding after its EOS (as generate() wrote it): it continues after the last slot."""
    seq, cache, _, message = ended
    whole = torch.cat([seq, message], 1)
    mask = torch.ones_like(whole)
    with torch.no_grad():
        out = guarded_generate(model, whole, attention_mask=mask, past_key_values=copy.deepcopy(cache), **A)
    print("padding attended: max logit diff", assert_same(out, reference(model, whole, mask)))
