"""kvresume.guard's parts on stand-ins (no model runs): the positions a model without a rotary embedding is checked
with (given, else the cache positions of what is fed; the decoder's for an encoder-decoder), and which checks a single
forward call gets (those on its arguments, then those on its positions where it is given them)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from kvresume import guard

T = torch.tensor


def model(enc_dec=False):
    return SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=enc_dec))


def call(enc_dec=False, rows=2, f=3, held=(5, 7)):
    return SimpleNamespace(model=model(enc_dec), given_rows=rows, f=f, lengths=held)


def test_without_positions_given_the_cache_positions_of_what_is_fed():
    got = guard.cache_positions(call(), {})
    assert got.shape == (1, 2, 3) and torch.equal(got, T([[[5, 6, 7], [5, 6, 7]]]))
    assert torch.equal(guard.cache_positions(call(rows=1, f=1, held=(0, 4)), {}), T([[[0]]]))


def test_positions_given_are_read_as_rows_the_decoders_for_an_encoder_decoder():
    given = T([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert torch.equal(guard.cache_positions(call(), {"position_ids": given}), T([[[2, 3, 4], [6, 7, 8]]]))
    dec = {"position_ids": given, "decoder_position_ids": T([[9, 9, 9]])}
    assert torch.equal(guard.cache_positions(call(enc_dec=True), dec), T([[[9, 9, 9], [9, 9, 9]]]))
    assert torch.equal(guard.cache_positions(call(enc_dec=True), {"position_ids": given})[0, 0], T([5, 6, 7]))
    assert torch.equal(guard.cache_positions(call(), {"position_ids": [1, 2, 3]})[0, 0], T([5, 6, 7]))  # not a tensor


@pytest.fixture
def checked(monkeypatch):
    seen = []
    monkeypatch.setattr(guard, "run_checks", lambda c, positions=None: seen.append(
        (c, positions, None if c is None or c.fed_positions is None else c.fed_positions.clone())))
    return seen


def test_a_forward_call_is_checked_on_its_arguments_then_on_the_positions_it_is_given(checked):
    ids, cache = T([[1, 2], [3, 4]]), DynamicCache()
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    guard.check_forward_call(m, {"input_ids": ids, "past_key_values": cache, "position_ids": T([[4, 5], [6, 7]])})
    (first, p1, _), (second, p2, fed) = checked
    assert first is second and first.cache is cache and first.model is m and (p1, p2) == (False, True)
    assert torch.equal(fed, T([[[4, 5], [6, 7]]]))


def test_a_forward_call_without_positions_or_without_a_cache_gets_its_argument_checks_only(checked):
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=False))
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "past_key_values": DynamicCache()})
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "position_ids": T([[0, 1]])})
    guard.check_forward_call(m, {"input_ids": T([[1, 2]]), "past_key_values": DynamicCache(), "position_ids": [0, 1]})
    guard.check_forward_call(m, {"input_ids": T([[]]).long(), "past_key_values": DynamicCache(),
                                 "position_ids": T([[]]).long()})  # nothing fed
    assert [p for _, p, _ in checked] == [False] * 4 and checked[1][0] is None


def test_an_encoder_decoders_forward_call_is_checked_on_the_decoders_positions(checked):
    m = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
    guard.check_forward_call(m, {"input_ids": T([[1, 2, 3]]), "decoder_input_ids": T([[7]]), "cache": DynamicCache(),
                                 "position_ids": T([[0, 1, 2]]), "decoder_position_ids": T([[4]])})
    assert [p for _, p, _ in checked] == [False, True] and torch.equal(checked[1][2], T([[[4]]]))
    checked.clear()
    guard.check_forward_call(m, {"decoder_input_ids": T([[7]]), "cache": DynamicCache(), "position_ids": T([[0]])})
    assert [p for _, p, _ in checked] == [False]


@pytest.fixture
def parts(monkeypatch):
    """guard's collaborators replaced by recorders: generate() (its inputs and keywords), the first-call checks, the
    expansion note, the rope state; the call from_generate reads holds one cached slot."""
    from contextlib import contextmanager

    from kvresume import compat

    seen: dict = {"generate": [], "notes": [], "put": [], "checked": 0}

    def generate(inputs, *args, **kwargs):
        seen["generate"].append((inputs, args, kwargs))
        if kwargs.get("refuse"):
            raise guard.ResumeInputError("refused")
        return "generated"

    @contextmanager
    def checked(model, call, then=None):
        seen["checked"] += 1
        yield

    one = SimpleNamespace(lengths=(0, 1))
    monkeypatch.setattr(compat, "plain_generate", lambda model: generate)
    monkeypatch.setattr(compat, "get_rope_state", lambda model: "state")
    monkeypatch.setattr(compat, "put_rope_state", lambda model, state: seen["put"].append((model, state)))
    monkeypatch.setattr(guard, "checked_first_call", checked)
    monkeypatch.setattr(guard, "note_expansion", lambda c, model, kwargs: seen["notes"].append((c, model, kwargs)))
    monkeypatch.setattr(guard, "from_generate", lambda model, inputs, kwargs, processed: seen.get("call", one))
    return seen


def test_the_dry_run_asks_for_one_new_token_beside_the_callers_arguments_without_a_streamer(parts):
    m = object()
    guard._dry_run(m, "ids", {"do_sample": False, "streamer": "s"}, None)
    assert parts["generate"] == [("ids", (), {"max_new_tokens": 1, "do_sample": False})] and parts["put"] == [(m, "state")]


def test_the_dry_run_asks_for_one_new_token_in_the_callers_generation_config(parts):
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=9, do_sample=False)
    guard._dry_run(object(), None, {"generation_config": config}, None)
    (_, _, kwargs), = parts["generate"]
    assert list(kwargs) == ["generation_config"] and kwargs["generation_config"].max_new_tokens == 1
    assert config.max_new_tokens == 9  # the caller's config untouched


def test_check_resume_inputs_notes_the_expansion_and_dry_runs_a_call_on_a_filled_cache(parts, monkeypatch):
    runs = []
    monkeypatch.setattr(guard, "_dry_run", lambda model, inputs, kwargs, c: runs.append((model, inputs, kwargs, c)))
    m = object()
    guard.check_resume_inputs(m, "ids", do_sample=False)
    c = parts.get("call", SimpleNamespace())
    assert len(runs) == 1 and runs[0][:3] == (m, "ids", {"do_sample": False})
    assert parts["notes"] == [(runs[0][3], m, {"do_sample": False})]
    parts["call"] = SimpleNamespace(lengths=(0, 0))
    guard.check_resume_inputs(m, "ids")
    parts["call"] = None
    guard.check_resume_inputs(m, "ids")
    assert len(runs) == 1 and len(parts["notes"]) == 1 and c is not None


def test_guarded_generate_checks_a_call_on_a_filled_cache_and_puts_the_rope_state_back_on_a_refusal(parts):
    m = object()
    assert guarded_call(m, parts) == "generated"
    assert parts["checked"] == 1 and parts["notes"][0][1:] == (m, {"x": 1})
    with pytest.raises(guard.ResumeInputError):
        guard.guarded_generate(m, "ids", refuse=True)
    assert parts["put"] == [(m, "state")]
    parts["call"] = None
    assert guard.guarded_generate(m, "ids", "positional", x=2) == "generated"
    assert parts["generate"][-1] == ("ids", ("positional",), {"x": 2}) and parts["checked"] == 2
    parts["call"] = SimpleNamespace(lengths=(0, 0))
    guard.guarded_generate(m, "ids", x=3)
    assert parts["checked"] == 2 and len(parts["notes"]) == 2


def guarded_call(m, parts):
    out = guard.guarded_generate(m, "ids", "positional", x=1)
    assert parts["generate"][-1] == ("ids", ("positional",), {"x": 1})
    return out


def test_run_checks_reads_a_filled_cache_only_and_passes_which_checks_on(monkeypatch):
    seen = []
    monkeypatch.setattr(guard, "first_error", lambda c, checks, positions: seen.append(positions))
    guard.run_checks(None)
    guard.run_checks(SimpleNamespace(lengths=(0, 0)))
    assert seen == []
    guard.run_checks(SimpleNamespace(lengths=(0, 1)), positions=True)
    guard.run_checks(SimpleNamespace(lengths=(3, 3)), positions=False)
    assert seen == [True, False]
    error = guard.ResumeInputError("no")
    monkeypatch.setattr(guard, "first_error", lambda c, checks, positions: error)
    with pytest.raises(guard.ResumeInputError) as info:
        guard.run_checks(SimpleNamespace(lengths=(0, 1)))
    assert info.value is error
