"""helpers/proposal: the validated factory (every family, every refusal), the resume guard (each check raises on its
case and passes the working call, on generate()'s own inputs), guarded_generate (generate()'s signature, generate()
unchanged, nothing patched), the valid call shapes, the upstream contract file."""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import models
from kvresume import CHECKS, Check, FactoryError, ResumeInputError, check_forward_call, check_resume_inputs, export_tensors, guarded_generate, kv_cache_from_tensors
from helpers.proposal import blind, experiments, shapes
from kvresume import call as api_call, guard
from helpers.continuation import greedy_config
from helpers.families import checks, rebuilds, setup
from kvresume import layers, testing


@pytest.fixture(scope="module")
def runs() -> dict[str, checks.Runner]:
    dense = models.load(models.TINY_DENSE)
    others = {"multimodal": models.load(models.TINY_VL), "sliding": models.load(models.TINY_SLIDING),
              "hybrid": models.load(models.TINY_HYBRID)}
    fams = setup.build_all(dense, others, 24, 40, (12, 20), 0)
    return {name: checks.Runner(f) for name, f in fams.items()}


def test_factory_round_trip_is_bitwise_on_every_family(runs):
    trips = experiments.factory_round_trips(runs)
    assert set(trips) == set(setup.FAMILIES)
    assert all(t["state_equal"] and t["seq_length"][0] == t["seq_length"][1] for t in trips.values()), trips
    assert trips["sliding"]["seq_length"] == [39, 39] and trips["sliding"]["widths"][0] < 39
    assert trips["hybrid"]["linear_layers"] == [0, 1, 2, 4, 5, 6]


def test_factory_returns_transformers_own_dynamic_cache(runs):
    from transformers import DynamicCache

    pairs, states, n = export_tensors(runs["sliding"].cache)
    cache = kv_cache_from_tensors(pairs, runs["sliding"].family.model.config, processed_length=n)
    assert type(cache) is DynamicCache
    assert [type(l).__name__ for l in cache.layers][:2] == ["DynamicSlidingWindowLayer", "DynamicLayer"]


def test_every_malformed_input_is_refused_naming_its_mismatch(runs):
    rows = experiments.refusals(runs)
    assert len(rows) >= 10
    bad = [r for r in rows if not (r["refused"] and r["names_mismatch"])]
    assert not bad, bad


def test_a_refusal_names_the_first_mismatch_only(runs):
    pairs, _, _ = export_tensors(runs["dense"].cache)
    k, v = pairs[2]
    with pytest.raises(FactoryError, match=r"^layer 2: dtype"):
        kv_cache_from_tensors([pairs[0], pairs[1], (k.half(), v.half()), (k.half()[:1], v.half())], runs["dense"].family.model.config)


def test_processed_length_below_the_slots_is_refused_and_at_them_accepted(runs):
    pairs, _, n = export_tensors(runs["dense"].cache)
    config = runs["dense"].family.model.config
    with pytest.raises(FactoryError, match="processed_length 22 is smaller"):
        kv_cache_from_tensors(pairs, config, processed_length=n - 1)
    assert kv_cache_from_tensors(pairs, config, processed_length=n).get_seq_length() == n


# --- the guard ---------------------------------------------------------------------------------

def _dense(runs):
    run = runs["dense"]
    return run.family.model, run.cache, run.family.suffix, run.family.full_mask, run.family.processed_length


def check(model, cache, *args, **kwargs):
    """check_resume_inputs with the cache under generate()'s keyword on this release."""
    from kvresume import compat

    check_resume_inputs(model, *args, **{compat.generate_cache_kwarg(model): cache}, **kwargs)


def test_the_working_resume_passes(runs):
    model, cache, suffix, mask, n = _dense(runs)
    check(model, cache, suffix, attention_mask=mask)
    check(model, cache, input_ids=suffix, attention_mask=mask, position_ids=torch.tensor([[n]]), processed_length=n)
    ids = runs["dense"].family.prompt.input_ids
    check(model, cache, ids)  # the whole sequence, no mask: generate() slices the suffix itself
    check(model, cache, ids, attention_mask=runs["dense"].family.prompt.attention_mask)
    check_resume_inputs(model, suffix)  # no cache: nothing to check


@pytest.mark.parametrize("case,name,match", [
    ("suffix_mask", "nothing_fed", r"covers only the suffix \(1 columns\) while the cache holds 23 tokens: pass the full "
                                   r"mask of 24 columns"),
    ("no_mask", "nothing_fed", r"input_ids 1; .* slices off its first 23 tokens, .* Pass attention_mask with 24 columns"),
    ("position_only", "nothing_fed", "no attention_mask"),
    ("wide_mask", "mask_width", r"has 26 columns; .* needs 24 \(cached \+ suffix\)"),
    ("short_mask", "mask_width", r"has 10 columns"),
    ("empty_input", "empty_input", r"^input_ids is empty: pass the unprocessed suffix \(at least one token\)$"),
    ("already_cached", "already_cached", r"already holds 23 tokens but processed_length is 21: the first 2 suffix "
                                         r"token\(s\) .* after position 22 \(or a cache of the first 21 tokens\)"),
    ("wrong_positions", "positions_at_processed", r"start at \[24\] .* follows 23 processed tokens \(expected \[23\]\)"),
])
def test_each_check_raises_saying_what_to_pass(runs, case, name, match):
    model, cache, suffix, mask, n = _dense(runs)
    args = {"suffix_mask": ((suffix,), {"attention_mask": mask[:, -1:]}), "no_mask": ((suffix,), {}),
            "position_only": ((suffix,), {"position_ids": torch.tensor([[n]])}),
            "wide_mask": ((suffix,), {"attention_mask": torch.ones(1, 26, dtype=torch.long)}),
            "short_mask": ((suffix,), {"attention_mask": mask[:, :10]}),
            "empty_input": ((suffix[:, :0],), {"attention_mask": mask}),
            "already_cached": ((suffix,), {"attention_mask": mask, "processed_length": n - 2}),
            "wrong_positions": ((suffix,), {"attention_mask": mask, "position_ids": torch.tensor([[n + 1]]),
                                            "processed_length": n})}[case]
    with pytest.raises(ResumeInputError, match=match) as info:
        check(model, cache, *args[0], **args[1])
    assert info.value.check == name


def test_checks_needing_the_processed_length_are_skipped_without_it(runs):
    model, cache, suffix, mask, n = _dense(runs)
    check(model, cache, suffix, attention_mask=mask, position_ids=torch.tensor([[n + 1]]))  # 06's compressed caches do so
    assert [c.name for c in CHECKS if c.needs_processed_length] == ["already_cached", "positions_at_processed",
                                                                    "ledger_processed"]


def test_the_checks_run_in_order_and_one_entry_adds_one():
    names = [c.name for c in CHECKS]
    assert names == ["empty_input", "ledger_rows", "ledger_stale", "ledger_tokens", "ledger_length", "linear_state", "linear_length", "linear_rollback",
                     "nothing_fed", "fed_neither", "restart_token", "ledger_mask", "mask_width", "uneven_layers", "rope_state", "new_vision_tokens",
                     "already_cached", "positions_at_processed", "fed_mask_narrow", "ledger_positions", "ledger_processed"]
    assert [c.name for c in CHECKS if c.untracked_only] == ["nothing_fed", "mask_width", "uneven_layers", "rope_state",
                                                            "already_cached", "positions_at_processed"]
    call = api_call.ResumeCall(cache=None, n=1)

    def never(c):
        raise ResumeInputError("new tokens need new positions")

    assert guard.first_catch(call, [Check("new_vision_tokens", never)]) == ("new_vision_tokens", "new tokens need new positions")
    assert guard.first_catch(call, [Check("needs_length", never, needs_processed_length=True)]) is None


# --- 09's new image in a resumed chat: the new_vision_tokens check ---------------------------------------------

@pytest.fixture(scope="module")
def new_image():
    """09's two turns on the tiny Qwen3-VL: (model, chat, turn-1 cache, turn-1 rope_deltas, repaired positions)."""
    from kvresume import compat
    from helpers.newimage import repair, turns

    vl = models.load(models.TINY_VL)
    chat = turns.build(vl)
    cache = turns.turn1_cache(vl.model, chat)
    return vl.model, chat, cache, compat.get_rope_state(vl.model).clone(), repair.full_positions(vl.model, chat)


def _newimage_call(model, chat, key):
    from helpers.newimage import shapes as turn_shapes

    return turn_shapes.call_kwargs(model, next(s for s in turn_shapes.SHAPES if s.key == key), chat)


def test_the_guard_refuses_a_new_image_fed_beside_the_cache(new_image):
    from kvresume import compat
    from kvresume import vision as guardcheck

    model, chat, cache, turn1, _ = new_image
    for key in ("a_turn2_ids", "c_full_ids_image_b"):  # turn-2 ids, or the full ids generate() slices to turn 2
        ids, kwargs = _newimage_call(model, chat, key)
        compat.set_rope_state(model, turn1.clone())
        with pytest.raises(ResumeInputError, match="25 new image/video tokens") as info:
            check_resume_inputs(model, ids, past_key_values=copy.deepcopy(cache), **kwargs)
        assert info.value.check == "new_vision_tokens" and compat.TRANSFORMERS_VERSION in str(info.value)
        assert guardcheck.working_route(model) in str(info.value)  # the route that works on this release
        with pytest.raises(ResumeInputError, match="get_rope_index"):
            guarded_generate(model, ids, past_key_values=copy.deepcopy(cache), generation_config=greedy_config(model),
                             **kwargs)
    assert compat.get_rope_state(model).flatten().tolist() == turn1.flatten().tolist()  # the refusal changed nothing


def test_the_guard_passes_the_repaired_call_and_a_text_turn(new_image):
    from kvresume import compat
    from helpers.newimage import repair

    model, chat, cache, turn1, positions = new_image
    for ids, kwargs in (repair.call_kwargs(chat, positions), _newimage_call(model, chat, "control_text_turn")):
        compat.set_rope_state(model, turn1.clone())
        check_resume_inputs(model, ids, processed_length=chat.cached, past_key_values=copy.deepcopy(cache), **kwargs)
    ids, kwargs = repair.call_kwargs(chat, positions)
    three = {**kwargs, "position_ids": positions.rows}  # 3-row ids over the suffix: explicit too
    check_resume_inputs(model, ids, past_key_values=copy.deepcopy(cache), **three)
    compat.set_rope_state(model, turn1.clone())


def test_the_new_vision_check_reads_what_generate_fed(new_image, monkeypatch):
    from kvresume import vision as guardcheck

    model, chat, cache, turn1, _ = new_image
    call = api_call.ResumeCall(cache=cache, n=49, fed=49, keeps_rope_state=True, rope_deltas=turn1, model=model,
                               fed_ids=chat.turn2_ids)
    assert guard.first_catch(call)[0] == "new_vision_tokens"
    text = api_call.ResumeCall(cache=cache, n=22, fed=22, keeps_rope_state=True, rope_deltas=turn1, model=model,
                               fed_ids=chat.text_turn()[0])
    assert guard.first_catch(text) is None
    for quiet in ({"model": None}, {"fed_ids": None}, {"keeps_rope_state": False}, {"decoder_start": 2}):
        assert guard.first_catch(api_call.ResumeCall(**{**call.__dict__, **quiet})) is None, quiet
    types = {"mm_token_type_ids": chat.types(chat.full_ids)}
    monkeypatch.setattr(guardcheck, "recomputes_new_vision_positions", lambda m: True)  # 5.23.0's branch: it recomputes
    assert guard.first_catch(api_call.ResumeCall(**{**call.__dict__, "multimodal": types})) is None
    assert guard.first_catch(call)[0] == "new_vision_tokens"  # turn 2's own types, or none: the branch never fires


def test_the_whole_sequence_forms(runs):
    model, cache, suffix, mask, n = _dense(runs)
    ids = runs["dense"].family.prompt.input_ids  # the 23 cached + the suffix
    check(model, cache, ids, position_ids=torch.arange(24).view(1, -1), processed_length=n)
    with pytest.raises(ResumeInputError, match="position_ids start at"):
        check(model, cache, ids, position_ids=torch.arange(1, 25).view(1, -1), processed_length=n)
    check(model, cache, ids[:, :23])  # as long as the cache, no mask: generate() feeds all 23 as a suffix (a blind spot)
    with pytest.raises(ResumeInputError, match="no attention_mask"):
        check(model, cache, ids[:, :5])  # shorter than the cache, no mask: generate() feeds nothing
    for k in (12, 22):  # shorter than the cache, no mask: this release may feed some of them (5.17.0: 1 and 21)
        try:
            check(model, cache, ids[:, :k])
        except ResumeInputError as exc:
            assert exc.check in ("nothing_fed", "fed_neither"), exc
        else:
            raise AssertionError(f"{k} tokens beside a cache of 23, no mask, passed")
    long = ids[:, 8:20]  # a suffix longer than a cache of 8 with a mask of its own width: a whole sequence's inputs
    pairs, _, _ = export_tensors(cache)
    short = kv_cache_from_tensors([(k[:, :, :8], v[:, :, :8]) for k, v in pairs], model.config)
    check(model, short, long, attention_mask=torch.ones(1, 12, dtype=torch.long), processed_length=8)  # blind spot


def test_a_per_layer_compressed_cache_needs_positions(runs):
    model, cache, suffix, _, n = _dense(runs)
    pairs, _, _ = export_tensors(cache)
    uneven = kv_cache_from_tensors([(k[:, :, -(20 - 4 * i):], v[:, :, -(20 - 4 * i):]) for i, (k, v) in enumerate(pairs)],
                                   model.config, processed_length=n)
    mask = torch.ones(1, 21, dtype=torch.long)
    with pytest.raises(ResumeInputError, match=r"hold \[8, 12, 16, 20\] tokens .* pass position_ids") as info:
        check(model, uneven, suffix, attention_mask=mask)
    assert info.value.check == "uneven_layers"
    check(model, uneven, suffix, attention_mask=mask, position_ids=torch.tensor([[n]]))
    even = kv_cache_from_tensors([(k[:, :, -8:], v[:, :, -8:]) for k, v in pairs], model.config, processed_length=n)
    check(model, even, suffix, attention_mask=torch.ones(1, 9, dtype=torch.long))  # uniform eviction: a blind spot
    with pytest.raises(ResumeInputError, match="accounts for 8 cached columns but 23 tokens were processed, so generate"
                                               r"\(\) places the suffix at position 8; pass position_ids starting at 23"):
        check(model, even, suffix, attention_mask=torch.ones(1, 9, dtype=torch.long), processed_length=n)


def test_a_sliding_update_rebuild_with_the_full_mask_passes(runs):
    """07: the control's rebuild of a slid window (layers of 15 and 39) with the full mask works: no false alarm."""
    run = runs["sliding"]
    fam = run.family
    ctrl = rebuilds.control_rebuild(run.cache)
    assert sorted(set(layers.lengths(ctrl))) == [15, 39]
    check(fam.model, ctrl, fam.suffix, attention_mask=fam.full_mask)


def test_padded_rows_are_checked_per_row_given_their_lengths(runs):
    run = runs["padded_batch"]
    fam = run.family
    rows = [int(r.numel()) - 1 for r in fam.rows]
    check(fam.model, run.cache, fam.suffix, attention_mask=fam.full_mask, position_ids=fam.current_positions(),
          processed_length=fam.processed_length)
    check(fam.model, run.cache, fam.suffix, attention_mask=fam.full_mask, processed_length=rows)
    with pytest.raises(ResumeInputError, match=r"marks \[19, 19\] cached tokens per row but the rows processed \[11, 19\]"):
        check(fam.model, run.cache, fam.suffix, attention_mask=torch.ones_like(fam.full_mask), processed_length=rows)
    check(fam.model, run.cache, fam.suffix, attention_mask=torch.ones_like(fam.full_mask))  # no lengths: a blind spot


def test_multimodal_positions_less_rope_deltas_and_four_rows(runs):
    run = runs["multimodal"]
    fam, model = run.family, run.family.model
    run._restore(model)
    three, n = fam.current_positions(), fam.processed_length
    four = torch.cat([torch.full((1, 1, 1), n), three])
    for positions in (three, four):
        check(model, run.cache, fam.suffix, attention_mask=fam.full_mask, position_ids=positions, processed_length=n)
    for bad in (three + torch.tensor([0, 1, 0]).view(3, 1, 1), torch.cat([torch.full((1, 1, 1), n + 1), three])):
        with pytest.raises(ResumeInputError, match="position_ids start at"):
            check(model, run.cache, fam.suffix, attention_mask=fam.full_mask, position_ids=bad, processed_length=n)


def test_missing_rope_deltas_is_refused_unless_positions_are_given(runs):
    from kvresume import compat

    run = runs["multimodal"]
    fam, model = run.family, run.family.model
    run._restore(model)
    saved = compat.get_rope_state(model)
    compat.set_rope_state(model, None)
    try:
        with pytest.raises(ResumeInputError, match="rope_deltas but it is None") as info:
            check(model, run.cache, fam.suffix, attention_mask=fam.full_mask)
        assert info.value.check == "rope_state" and compat.get_rope_state(model) is None  # the dry run put it back
        check(model, run.cache, fam.suffix, attention_mask=fam.full_mask, position_ids=fam.current_positions())
    finally:
        compat.set_rope_state(model, saved)


def test_a_hybrid_cache_without_linear_state_raises_and_with_it_passes(runs):
    run = runs["hybrid"]
    fam = run.family
    bare = rebuilds.attention_only_rebuild(run.cache, fam.model.config)
    with pytest.raises(ResumeInputError, match=r"^layer 0 \(linear attention\) holds no conv/recurrent state while the "
                                               r"attention layers hold 23 tokens"):
        check(fam.model, bare, fam.suffix, attention_mask=fam.full_mask)
    check(fam.model, run.cache, fam.suffix, attention_mask=fam.full_mask)


def test_an_encoder_decoder_continuation_reads_the_decoder_side():
    model = testing.build("bart")
    cells = {s.shape: s for s in shapes.bart_shapes()}
    good = cells["encoder-decoder: decoder_input_ids = sequences + decoder mask"]
    check_resume_inputs(model, good.inputs, past_key_values=good.cache, **good.kwargs)  # the encoder's 4-column mask is not read
    bad = cells["encoder-decoder: decoder_input_ids = sequences, no decoder mask"]
    with pytest.raises(ResumeInputError, match=r"feeds all 8 decoder_input_ids, the decoder start token first, beside a "
                                               r"decoder cache of 7 tokens: pass decoder_attention_mask"):
        check_resume_inputs(model, bad.inputs, past_key_values=bad.cache, **bad.kwargs)


def test_guarded_generate_keeps_generates_signature_and_patches_nothing(runs):
    from transformers import GenerationMixin

    model, cache, suffix, mask, n = _dense(runs)
    before = type(model).generate
    config = greedy_config(model)
    plain = model.generate(suffix, generation_config=config, attention_mask=mask, past_key_values=copy.deepcopy(cache))
    guarded = guarded_generate(model, suffix, config, attention_mask=mask, past_key_values=copy.deepcopy(cache))
    assert torch.equal(plain.logits[0], guarded.logits[0])
    assert type(model).generate is before and GenerationMixin.generate is before and not model._forward_pre_hooks
    with pytest.raises(ResumeInputError, match="Pass attention_mask with 24 columns"):
        guarded_generate(model, suffix, past_key_values=copy.deepcopy(cache), generation_config=config)
    with pytest.raises(ResumeInputError, match="already holds"):
        guarded_generate(model, suffix, config, attention_mask=mask, past_key_values=copy.deepcopy(cache),
                         processed_length=n - 1)
    assert not model._forward_pre_hooks


def test_internal_calls_of_assisted_decoding_pass():
    model, assistant = models.build_tiny_qwen3(0), models.build_tiny_qwen3(1)
    rows = shapes.masked_assisted_calls(model, assistant)
    assert rows and not [r for r in rows if r["refused"]]
    assert any(r["mask"] and r["mask"][:8] == [1, 0, 0, 0, 0, 0, 0, 1] for r in rows)


def test_every_blind_spot_names_a_reason():
    from helpers.proposal.cells import Cell

    assert all(why for _, _, why in blind.BLIND_SPOTS)
    assert blind.reason(Cell("06", "streaming · mask_only", "silently_wrong", "passed"))
    assert blind.reason(Cell("06", "per_layer · mask_only", "silently_wrong", "passed")) == ""


# --- the upstream file ---------------------------------------------------------------------------

def test_the_upstream_file_is_standalone_and_states_the_contract(tmp_path):
    """Its imports (the file's own and every embedded module's) are torch, transformers, pytest and the standard
    library; every kvresume module is embedded; run alone it builds the package and states the contract."""
    import ast
    import json
    import subprocess
    import sys
    from pathlib import Path

    from helpers.proposal import upstream

    text = upstream.render()
    tree = ast.parse(text)
    embedded = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                     and getattr(n.targets[0], "id", "") == "_KVRESUME"))
    package = sorted(p.stem for p in (upstream.PACKAGE / "kvresume").glob("*.py"))
    assert sorted(embedded) == package and list(embedded)[-1] == "__init__"
    tops = set()
    for source in [text, *embedded.values()]:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops.add(node.module.split(".")[0])
    assert tops - set(sys.stdlib_module_names) == {"torch", "transformers", "safetensors", "pytest", "kvresume"}, tops
    assert "helpers" not in tops and "/work" not in text and "MEASURED" not in text
    path = tmp_path / upstream.FILE_NAME
    path.write_text(text)
    probe = ("import json, sys; ns = {'__name__': 'contract'}; exec(open(sys.argv[1]).read(), ns); import kvresume; "
             "mark = next(m for m in ns['test_misuse_raises_in_generate'].pytestmark if m.name == 'xfail'); "
             "print(json.dumps({'file': kvresume.__file__, 'tests': sorted(k for k in ns if k.startswith('test_')), "
             "'reason': mark.kwargs['reason'], 'checks': [c.name for c in kvresume.CHECKS]}))")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["file"] == "<kvresume/__init__.py>"  # the embedded package, not the installed one
    assert {"test_misuse_raises_in_generate", "test_encoder_decoder_continuation",
            "test_an_exact_prefix_crop_is_valid_and_passes"} <= set(got["tests"])
    assert got["reason"] == "generate() should raise here"
    assert got["checks"] == [c.name for c in CHECKS]


def test_group_09_counts_the_new_image_turn(bundle):
    """09's cells in 08's population: every silently wrong shape refused by new_vision_tokens, the text-only turn and
    the repair worked and passed, the model's rope_deltas put back."""
    from kvresume import compat
    from helpers.proposal import cells as api_cells, groups

    before = compat.get_rope_state(bundle.model)
    made, floor = groups.group_09(bundle)
    n = api_cells.counts(made)
    assert n["silently_wrong"] >= 2 and n["misses"] == 0 and n["false_alarms"] == 0 and floor["noise_threshold"] < 1e-5
    assert {c.guard_check for c in made if c.plain == "silently_wrong"} == {"new_vision_tokens"}
    worked = {c.cell for c in made if c.plain == "worked" and c.guard == "passed" and c.with_length == "passed"}
    assert {"control: text-only turn 2", "repair: generate() at the full-sequence positions"} <= worked
    assert next(c for c in made if c.cell.startswith("(a) turn-2 ids + image B") and "types" not in c.cell).guard == "raised"
    after = compat.get_rope_state(bundle.model)
    assert (before is None and after is None) or torch.equal(before, after)
    assert groups.group_09(models.load(models.TINY_DENSE)) == ([], {})  # a text-only model: no new-image turn
