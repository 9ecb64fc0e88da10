"""Notebook 05: the tiny hybrid, the offload/prefetch recorder, the installed source, and the notebook on CPU (with its
CUDA sections under the recording stand-ins). The GPU arms: tests/test_offload_gpu.py; gpu-check: tests/test_gpu_check.py."""
from __future__ import annotations

import json
import os

import pytest
import torch

from helpers import hybrid, models
from helpers.offload import gpu, loops, schedule, source, standins
from helpers.pipeline.paths import repo_root
from inprocess import run_one  # tests/ is on sys.path

NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def record(tiny, ids) -> schedule.ScheduleRecord:
    return schedule.record_schedule(tiny.model, ids, n_steps=3)


def test_tiny_hybrid_interleaves_linear_and_full_attention_3_to_1(tiny):
    types = hybrid.layer_types(tiny.model.config)
    assert len(types) == 8
    assert types.count("linear_attention") == 3 * types.count("full_attention") == 6
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [3, 7]
    assert type(tiny.model).__name__ == "Qwen3_5ForCausalLM"


def test_tiny_hybrid_is_seeded(tiny):
    same, other = models.build_tiny_hybrid(seed=0), models.build_tiny_hybrid(seed=1)
    for (name, a), (_, b) in zip(tiny.model.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name
    assert not all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), other.state_dict().values()))


def test_random_ids_are_seeded_and_in_the_vocabulary(tiny):
    a, b = loops.random_ids(tiny.model, 2, 16, seed=3), loops.random_ids(tiny.model, 2, 16, seed=3)
    assert a.shape == (2, 16) and torch.equal(a, b)
    assert int(a.max()) < tiny.model.config.vocab_size
    assert not torch.equal(a, loops.random_ids(tiny.model, 2, 16, seed=4))


def test_recorder_sees_offload_and_prefetch_on_attention_layers_only(record):
    assert record.calls == ["prefill", "decode 1", "decode 2"]
    offloads, prefetches = record.counts("offload"), record.counts("prefetch")
    attention = [row for row in offloads.index if row.endswith("full_attention")]
    linear = [row for row in offloads.index if row.endswith("linear_attention")]
    assert (offloads.loc[attention] == 1).all().all() and (prefetches.loc[attention] == 1).all().all()
    assert int(offloads.loc[linear].values.sum()) == 0 and int(prefetches.loc[linear].values.sum()) == 0
    counts = record.verdict_inputs()
    assert counts["attention_offloads"] == 6 and counts["linear_offloads"] == 0
    assert counts["every_attention_layer_offloaded_every_call"]
    # Linear layers go through the conv/recurrent updates, attention layers through update().
    assert counts["linear_state_updates"] > 0 and counts["linear_kv_updates"] == 0
    # What an attention layer holds when it is offloaded is its K/V.
    held = {e["held_states"] for e in record.events if e["level"] == "layer" and e["method"] == "offload"}
    assert held == {"keys+values"}


def test_verdict_inputs_notice_a_moved_linear_layer():
    rec = schedule.ScheduleRecord(["linear_attention", "full_attention"], ["LinearAttentionLayer", "DynamicLayer"])
    rec.begin("prefill")
    rec.log("layer", "offload", 1)
    rec.log("layer", "prefetch", 1)
    assert rec.verdict_inputs()["linear_offloads"] == 0
    rec.log("layer", "offload", 0)
    counts = rec.verdict_inputs()
    assert counts["linear_offloads"] == 1 and counts["attention_offloads"] == 1


def test_stand_ins_are_used_and_removed(record):
    assert record.stream_calls.get("torch.cuda.default_stream", 0) > 0  # the path does call CUDA streams
    assert record.stream_calls.get("torch.Stream", 0) + record.stream_calls.get("torch.cuda.Stream", 0) == 1
    assert standins.stand_ins_active() == []
    assert len(record.streams.unordered_reads()) > 0


def test_instrument_wraps_the_originals_and_removes_itself():
    class Layer:
        def __init__(self):
            self.moved = 0

        def offload(self):
            self.moved += 1

        def prefetch(self):
            self.moved += 10

    class Cache:
        def __init__(self):
            self.layers = [Layer(), Layer()]

        def offload(self, layer_idx, only_non_sliding=True):
            self.layers[layer_idx].offload()

    cache = Cache()
    with schedule.instrument(cache, ["linear_attention", "full_attention"]) as rec:
        rec.begin("prefill")
        cache.offload(1)
        cache.layers[0].prefetch()
        assert "offload" in vars(cache) and "prefetch" in vars(cache.layers[0])
    assert [layer.moved for layer in cache.layers] == [10, 1]  # the originals ran
    assert [(e["level"], e["method"], e["layer"]) for e in rec.events] == [
        ("cache", "offload", 1), ("layer", "offload", 1), ("layer", "prefetch", 0)]
    assert "offload" not in vars(cache) and not any(m in vars(layer) for layer in cache.layers for m in ("offload", "prefetch"))


def test_instrumented_run_on_cpu_equals_offloading_false(tiny, ids, record):
    if not NO_CUDA:
        pytest.skip("on CUDA the instrumented run really moves tensors")
    plain = loops.greedy_run(tiny.model, ids, n_steps=3)
    assert loops.step_table(plain, record.run).bitwise_equal.all()


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_unpatched_offloading_fails_naming_cuda_without_a_gpu(tiny, ids):
    outcome = source.try_unpatched_offloading(tiny.model, ids, n_steps=2)
    assert outcome["raised"], outcome
    assert source.mentions_cuda(outcome)
    assert outcome["transformers_frame"].startswith("transformers/cache_utils.py")
    assert standins.stand_ins_active() == []


def test_source_facts_match_the_recorded_schedule():
    facts = source.source_facts()
    assert facts["Cache.update offloads and prefetches"]
    assert not facts["Cache.update_conv_state offloads or prefetches"]
    assert not facts["Cache.update_recurrent_state offloads or prefetches"]
    assert facts["Cache.prefetch skips linear layers"]
    names = [s["name"] for s in source.offloading_source()]
    assert "Cache.update" in names and "LinearAttentionCacheLayerMixin.offload" in names




@pytest.mark.e2e
@pytest.mark.skipif(not NO_CUDA, reason="simulates the CUDA sections on a machine without CUDA")
def test_notebook_cuda_sections_execute_on_cpu_under_stand_ins(tmp_path):
    os.environ["KVKIT_OUTPUT_DIR"] = str(tmp_path)
    try:
        result = run_one(repo_root() / "notebooks" / "05_hybrid_offloading_drift.ipynb",
                                {"simulate_cuda_on_cpu": True, "n_steps": 3, "replay_lags": [0, 12]})
    finally:
        del os.environ["KVKIT_OUTPUT_DIR"]
    assert result.ok, result.error
    data = json.loads((tmp_path / "results" / "05_hybrid_offloading_drift.json").read_text())
    claims = {c["id"]: c for c in data["claims"]}
    # no race without a GPU: the simulated experiment matches everywhere, and says it was simulated
    expected = {"offload.prefill_identical": "reproduced", "offload.decode_drifts": "not_reproduced",
                "offload.first_differing_tensor_is_attention_kv": "not_refuted",
                "offload.ordering_edge_removes_drift": "fails", "offload.race_observed_on_device": "holds",
                "offload.offload_event_removes_drift": "fails", "offload.record_stream_removes_drift": "fails"}
    assert {cid: claims[cid]["verdict"] for cid in expected} == expected
    assert {cid: claims[cid]["kind"] for cid in gpu.CUDA_CLAIMS} == gpu.CLAIM_KINDS
    assert all(claims[cid]["reason"].startswith("[simulated on CPU") for cid in expected)
    assert claims["offload.decode_drifts"]["evidence"]["settings"]["simulated_on_cpu"] is True
    m = data["measurements"]
    assert m["report_experiment_per_step"] and m["gpu_per_step"] and m["gpu_race_counts"] and m["gpu_calibration"]
    report64 = {(r["dtype"], r["loop"]) for r in m["gpu_per_step"] if r["model"] == "report layout (64)"}
    assert report64 == {("bfloat16", "report")}, report64  # the report's layout: its dtype and its loop only
    unlagged = {r["model"] for r in claims["offload.unlagged_run_drifts"]["evidence"]["unlagged"]}
    assert "report layout (64)" in unlagged, unlagged  # the 64-layer layout's unlagged arm feeds the GPU-decided claim
    assert {r["explanation"][:3] for r in m["gpu_explanations"]} == {"(a)", "(b)", "(c)", "(d)"}
    assert (tmp_path / "figures" / "05_hybrid_offloading_drift-drift.png").exists()
