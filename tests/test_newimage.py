"""Notebook 09's helpers: the two-turn prompt, the call shapes, the repair, the tables, the resume guard's
new-vision-token check and the plain-transformers repro (the tiny Qwen3-VL, on the installed release)."""
from __future__ import annotations

import torch
import pytest

from kvresume import compat
from helpers.compare import NoiseFloor
from helpers.newimage import decisions, repair, shapes, tables, turns
from kvresume import vision as guardcheck

FLOOR = NoiseFloor(measured=4e-7, resolution=6e-8, margin=4.0, dtype="float32", scale=1.0)
SPAN = (9, 34)


@pytest.fixture(scope="module")
def chat(bundle):
    return turns.build(bundle)


@pytest.fixture(scope="module")
def state(bundle, chat):
    """(turn-1 cache, turn-1 rope_deltas, reference logits, repaired positions)."""
    reference = turns.reference(bundle.model, chat)
    cache = turns.turn1_cache(bundle.model, chat)
    turn1 = compat.get_rope_state(bundle.model).clone()
    return cache, turn1, reference, repair.full_positions(bundle.model, chat)


def test_two_turns_have_the_issue_layout(chat):
    assert chat.cached == 82 and chat.turn2_ids.shape[1] == 49 and chat.full_ids.shape[1] == 131
    assert chat.image_b_span() == SPAN and chat.grid_b.tolist() == [[1, 10, 10]]
    text_ids, text_prompt = chat.text_turn()
    assert text_ids.shape[1] == 22 and text_prompt.length == 104 and not (text_ids == chat.image_token_id).any()


def test_full_positions_place_image_b_on_its_grid(state):
    _, turn1, _, positions = state
    t, h, w = positions.as_lists()
    assert turn1.flatten().tolist() == [-42] and positions.rope_deltas.flatten().tolist() == [-62]
    assert t[SPAN[0]:SPAN[1]] == [49] * 25
    assert h[SPAN[0]:SPAN[1]] == [49 + i // 5 for i in range(25)] and w[SPAN[0]:SPAN[1]] == [49 + i % 5 for i in range(25)]
    assert positions.with_text_row()[0, 0].tolist() == list(range(82, 131))


def test_natural_call_is_one_text_row_and_the_repair_matches(bundle, chat, state):
    cache, turn1, reference, positions = state
    shape = next(s for s in shapes.SHAPES if s.key == shapes.NATURAL)
    out, call = shapes.run_shape(bundle.model, shape, chat, cache, turn1)
    row = shapes.row(shape.key, shape.label, out, call, reference, FLOOR)
    assert row["outcome"] == "silently wrong" and row["position_rows"][0] == list(range(40, 89)) * 1
    assert row["position_rows"][0] == row["position_rows"][1] == row["position_rows"][2]
    assert decisions.decide_positions_explain(row, positions.as_lists(), SPAN, [-42], [-62]).holds
    fixed = repair.rows(bundle.model, chat, cache, positions, turn1, reference, FLOOR)
    assert fixed["forward"]["outcome"] == "matches" and fixed["generate"]["outcome"] == "matches"
    assert fixed["next_stale"]["outcome"] == "silently wrong" and fixed["next_carried"]["outcome"] == "matches"
    assert fixed["generate"]["position_rows"] == positions.as_lists()


def test_tables_show_every_shape(bundle, chat, state):
    cache, turn1, reference, _ = state
    rows = shapes.run_all(bundle.model, chat, cache, turn1, {"image": reference, "text": reference}, FLOOR)
    assert [r["key"] for r in rows] == [s.key for s in shapes.SHAPES]
    assert list(tables.table(rows).columns) == list(tables.OUTCOME_COLUMNS[1:])
    assert "image B t/h/w (first .. last)" in tables.first_calls(rows, SPAN).columns
    assert compat.get_rope_state(bundle.model).flatten().tolist() == [-42]  # put back


# decisions: tests/test_kill_newimage.py (its CASES feed tests/test_decisions.py's registry)


# --- the guard's check -------------------------------------------------------------------------------

def test_check_refuses_the_natural_call_and_names_a_route(bundle, chat, state):
    cache = state[0]
    ids, kwargs = shapes.call_kwargs(bundle.model, next(s for s in shapes.SHAPES if s.key == shapes.NATURAL), chat)
    message = guardcheck.check_new_vision_tokens(bundle.model, ids, cache=cache, **kwargs)
    assert message and "25 new image/video tokens" in message and "get_rope_index" in message
    assert compat.TRANSFORMERS_VERSION in message


def test_check_passes_text_turns_explicit_positions_and_empty_caches(bundle, chat, state):
    cache, _, _, positions = state
    text_ids = chat.text_turn()[0]
    full = torch.ones(1, 82 + text_ids.shape[1], dtype=torch.long)
    assert guardcheck.check_new_vision_tokens(bundle.model, text_ids, full, cache=cache) is None
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.turn2_ids, chat.full_mask, past_key_values=cache,
                                              position_ids=positions.with_text_row()) is None
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.turn2_ids, chat.full_mask, cache=None) is None
    empty = compat.dynamic_cache()
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.full_ids, chat.full_mask, cache=empty) is None


def test_check_reads_full_ids_after_the_cache(bundle, chat, state):
    cache = state[0]
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.full_ids, chat.full_mask, cache=cache)  # image B after it
    only_a = chat.full_ids[:, :82 + 8]  # full ids whose uncached part is text
    assert guardcheck.check_new_vision_tokens(bundle.model, only_a, torch.ones_like(only_a), cache=cache) is None


def test_check_trusts_the_release_branch_only_where_it_exists(bundle, chat, state, monkeypatch):
    cache = state[0]
    types = chat.types(chat.full_ids)
    monkeypatch.setattr(guardcheck, "recomputes_new_vision_positions", lambda model: False)
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.full_ids, chat.full_mask, cache=cache, mm_token_type_ids=types)
    monkeypatch.setattr(guardcheck, "recomputes_new_vision_positions", lambda model: model is bundle.model)  # this model's class
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.full_ids, chat.full_mask, cache=cache, mm_token_type_ids=types) is None
    short = chat.types(chat.turn2_ids)  # turn 2's own types: the release's branch never sees the new tokens
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.turn2_ids, chat.full_mask, cache=cache, mm_token_type_ids=short)
    monkeypatch.setattr(guardcheck, "takes_encoded_images", lambda model: True)
    assert "mm_encoder_outputs" in guardcheck.working_route(bundle.model)


def test_release_probes_read_the_installed_source(bundle):
    from packaging.version import Version

    recomputes = guardcheck.recomputes_new_vision_positions(bundle.model)
    assert recomputes == (Version(compat.TRANSFORMERS_VERSION) >= Version("5.23.0"))
    assert guardcheck.check_new_vision_tokens(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long)) is None


def test_a_real_checkpoint_folder_goes_through_its_chat_template(tmp_path):
    """The real path (chat template, the checkpoint's image processor) on a local folder shaped like the hub's."""
    import fakeckpt  # tests/ is on sys.path

    from helpers import models

    real = models.load(str(fakeckpt.build_folder(tmp_path / "qwen3-vl", "legacy")))
    chat = turns.build(real)
    start, end = chat.image_b_span()
    assert chat.turn1.is_multimodal and end - start == int(chat.grid_b.prod()) // 4
    reference = turns.reference(real.model, chat)
    cache = turns.turn1_cache(real.model, chat)
    turn1 = compat.get_rope_state(real.model).clone()
    positions = repair.full_positions(real.model, chat)
    floor = turns.noise_floor(real.model, chat, reference, real.dtype)
    natural = next(s for s in shapes.SHAPES if s.key == shapes.NATURAL)
    out, call = shapes.run_shape(real.model, natural, chat, cache, turn1)
    assert shapes.row(natural.key, natural.label, out, call, reference, floor)["outcome"] == "silently wrong"
    assert repair.rows(real.model, chat, cache, positions, turn1, reference, floor)["generate"]["outcome"] == "matches"


def test_the_plain_transformers_repro_shows_the_finding_and_the_repair(capsys):
    """examples/repro/qwen3_vl_new_image_turn.py (torch and transformers only) prints the distance and positions."""
    import re
    import runpy

    from helpers.pipeline.paths import repo_root

    script = repo_root() / "examples" / "repro" / "qwen3_vl_new_image_turn.py"
    assert set(re.findall(r"^(?:import|from) (\w+)", script.read_text(), flags=re.M)) <= {"copy", "inspect", "torch", "transformers"}
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    threshold, natural = map(float, re.search(r"natural call: expected max \|logit diff\| vs one forward <= "
                                              r"([\d.e+-]+); got ([\d.e+-]+)", out).groups())
    repaired = float(re.search(r"repair \(positions from get_rope_index.*?\): max \|logit diff\| ([\d.e+-]+)", out).group(1))
    assert natural > 250 * threshold and repaired <= max(threshold, 4e-7)
    assert "image B's tokens: expected t/h/w [49, 49, 49] .. [49, 53, 53]; got [49, 49, 49] .. [73, 73, 73]" in out
    assert out.splitlines()[0].startswith("transformers ") and out.splitlines()[-1].startswith(
        "verdict: the natural call is silently wrong on transformers ")


def test_images_from_files_replace_the_test_cards(bundle, tmp_path):
    from PIL import Image

    from helpers.inputs import synthetic_image

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    synthetic_image(224).save(a)
    Image.new("RGB", (96, 128), (10, 200, 30)).save(b)
    chat = turns.build(bundle, picture_a=str(a), picture_b=str(b))
    assert chat.grid_a.tolist() == [[1, 14, 14]] and chat.grid_b.tolist() == [[1, 8, 6]]
    assert chat.turn1.length == 82 and int((chat.turn2_ids == chat.image_token_id).sum()) == 12
    assert torch.equal(chat.turn1.input_ids, turns.build(bundle).turn1.input_ids)


def test_the_release_branch_is_read_off_the_models_own_class():
    """_recomputed: the model's class has the branch, and mm_token_type_ids marks a vision token after the cache."""

    class Branch(torch.nn.Module):
        def _prepare_position_ids_for_generation(self):
            has_new_vision_tokens = True
            return has_new_vision_tokens

    types = torch.tensor([[0, 0, 0, 1, 0]])
    assert guardcheck._recomputed(Branch(), types, 2) is True
    assert guardcheck._recomputed(Branch(), types, 4) is False  # the vision token is cached already
    assert guardcheck._recomputed(Branch(), types, 5) is False  # nothing after the cache
    assert guardcheck._recomputed(Branch(), None, 2) is False
    assert guardcheck._recomputed(torch.nn.Module(), types, 2) is False  # no branch on this class


def test_check_finds_the_cache_in_generates_keyword_and_reads_the_suffix_by_its_mask(bundle, chat, state):
    assert guardcheck.check_new_vision_tokens(bundle.model, chat.full_ids, chat.full_mask, past_key_values=state[0])
    cache = compat.dynamic_cache()
    cache.update(torch.zeros(1, 1, 10, 4), torch.zeros(1, 1, 10, 4), 0)  # 10 cached tokens
    suffix = torch.tensor([[bundle.model.config.image_token_id] * 4 + [5] * 12])  # 16 tokens, the image first
    message = guardcheck.check_new_vision_tokens(bundle.model, suffix, torch.ones(1, 26, dtype=torch.long), cache=cache)
    assert message and message.startswith("the cache holds 10 tokens and the 16 uncached ones include 4 new image")
    assert f"by the stored rope_deltas ({compat.get_rope_state(bundle.model).flatten().tolist()})" in message
    # a mask over the ids alone: they are the whole sequence, and what follows the cache (6 text tokens) has no image
    assert guardcheck.check_new_vision_tokens(bundle.model, suffix, torch.ones(1, 16, dtype=torch.long), cache=cache) is None
