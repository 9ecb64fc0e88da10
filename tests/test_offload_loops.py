"""The three loops of notebook 05: one entry point, same greedy tokens, generate()'s host wait recorded."""
from __future__ import annotations

import pytest
import torch

from kvresume import compat
from helpers.offload import loops, standins


def test_run_loop_rejects_an_unknown_loop(tiny, ids) -> None:
    with pytest.raises(ValueError):
        loops.run_loop("nope", tiny.model, ids, 2)


@pytest.mark.parametrize("loop", loops.LOOPS)
def test_every_loop_gives_the_cpu_loops_tokens(tiny, ids, loop: str) -> None:
    reference = loops.run_loop("cpu", tiny.model, ids, 3)
    run = loops.run_loop(loop, tiny.model, ids, 3)
    assert run.loop == loop and len(run.logits) == 3
    assert all(torch.equal(a, b) for a, b in zip(reference.tokens, run.tokens))


def test_report_loop_has_no_host_wait_and_cpu_loop_one_per_decode(tiny, ids) -> None:
    assert loops.run_loop("report", tiny.model, ids, 3).host_waits == []
    assert loops.run_loop("cpu", tiny.model, ids, 3).host_waits == ["decode 1", "decode 2"]


def test_generate_host_wait_is_recorded_from_the_stop_check(tiny, ids) -> None:
    with standins.recording_streams() as log:
        cache = compat.dynamic_cache(tiny.model.config, offloading=True)
        seen: list[str] = []
        run = loops.run_loop("generate", tiny.model, ids, 3, cache=cache, on_host_wait=seen.append)
    assert seen == run.host_waits
    assert {"decode 1", "decode 2"} <= set(run.host_waits)


def test_stop_check_is_restored() -> None:
    from transformers.generation import utils

    before = getattr(utils, "StopCheck", utils.GenerationMixin)
    attr = "__call__" if hasattr(utils, "StopCheck") else "_has_unfinished_sequences"
    original = getattr(before, attr)
    with loops.record_host_waits(lambda: 0):
        assert getattr(before, attr) is not original
    assert getattr(before, attr) is original
