"""make bench's estimator (helpers.pipeline.tools.bench): the median of paired ratios and its interval."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvresume.testing import build

from helpers.pipeline.tools import bench


def test_a_drift_between_pairs_cancels_in_the_paired_ratio():
    plain = [1.0 * 1.1 ** i for i in range(11)]  # the machine slows down run after run
    mid, low, high = bench.overhead({False: plain, True: [t * 1.01 for t in plain]})
    assert (mid, low, high) == pytest.approx((1.0, 1.0, 1.0))


def test_one_slow_pair_moves_neither_the_median_nor_the_interval_past_it():
    plain = [1.0] * 31
    tracked = [1.02] * 30 + [2.0]
    mid, low, high = bench.overhead({False: plain, True: tracked})
    assert (mid, low, high) == pytest.approx((2.0, 2.0, 2.0))


def test_a_slower_arm_is_measured_as_slower_and_its_interval_is_the_binomial_one():
    ratios = [1.0 + i / 100 for i in range(31)]  # 0% .. +30%
    mid, low, high = bench.overhead({False: [1.0] * 31, True: ratios})
    assert (mid, low, high) == pytest.approx((15.0, 9.0, 21.0))  # the 10th and 22nd of 31 ratios


def test_write_replaces_only_the_text_between_the_markers(tmp_path: Path):
    doc = tmp_path / "performance.md"
    doc.write_text(f"head\n{bench.BEGIN}\nold\n{bench.END}\ntail\n")
    bench.write(["new"], doc)
    assert doc.read_text() == f"head\n{bench.BEGIN}\nnew\n{bench.END}\ntail\n"


def test_the_instruction_count_is_read_per_process_from_cachegrinds_summary():
    report = "==7== \n==7== I   refs:      20,057,150,352\n==9== I   refs:      1,024\n"
    assert bench.refs(report) == {7: 20_057_150_352, 9: 1024}


def test_instructions_per_token_is_the_long_runs_extra_count_over_the_new_tokens(monkeypatch):
    fake = {(False, 1): 100, (False, 11): 1100, (True, 1): 150, (True, 11): 1170}
    monkeypatch.setattr(bench.shutil, "which", lambda _: "/usr/bin/valgrind")
    monkeypatch.setattr(bench, "counted", lambda folder, new: fake)
    assert bench.instructions(build("dense"), 10) == {False: 100.0, True: 102.0}


def test_each_run_is_read_from_its_forked_process(monkeypatch):
    stderr = "==5== I   refs:      900\n==6== I   refs:      1,900\n==7== I   refs:      950\n==8== I   refs:      2,000\n" \
             "==4== I   refs:      800\n"
    stdout = 'loading\n{"5": [false, 1], "6": [false, 11], "7": [true, 1], "8": [true, 11]}\n'
    done = bench.subprocess.CompletedProcess([], 0, stdout, stderr)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: done)
    assert bench.counted("folder", 10) == {(False, 1): 900, (False, 11): 1900, (True, 1): 950, (True, 11): 2000}


def test_without_valgrind_the_count_says_why(monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda _: None)
    assert bench.instructions(build("dense"), 10).startswith("not counted: no valgrind")


def test_the_counted_child_forks_one_process_per_arm_and_length(tmp_path: Path, monkeypatch, capfd):
    import json

    monkeypatch.setattr(bench.gc, "freeze", lambda: None)  # not this test process's heap
    build("dense").save_pretrained(tmp_path)
    bench.child(f"2,{tmp_path}")  # what valgrind counts: the saved model warmed up, then each run in its own fork
    runs = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert sorted(map(tuple, runs.values())) == [(False, 1), (False, 3), (True, 1), (True, 3)]
    assert len(runs) == 4 and str(os.getpid()) not in runs


def test_the_table_names_the_kits_commit_it_ran_at(monkeypatch):
    import re

    import torch
    from helpers.pipeline.run.record import git_state

    monkeypatch.setattr(bench, "models", lambda: {"tiny": (lambda: build("dense"), 1, True)})
    monkeypatch.setattr(bench.gc, "freeze", lambda: None)
    head, *_, row = bench.table(torch.device("cpu"), 2, None, count_them=False)
    commit = git_state()[0]
    assert re.search(rf", kit {commit[:12] if commit else 'unknown'}( \(dirty\))?, torch ", head) and "| tiny | " in row


def test_the_serving_table_goes_between_its_own_markers(tmp_path):
    from helpers.pipeline.tools import serve_bench

    rows = [dict(turn="1", prompt=10, reused=0, plain_s=0.2, pooled_s=0.1, equal=True),
            dict(turn="1", prompt=12, reused=0, plain_s=0.3, pooled_s=0.1, equal=True),
            dict(turn="1", prompt=14, reused=0, plain_s=0.4, pooled_s=0.4, equal=True),
            dict(turn="new chat", prompt=9, reused=0, plain_s=0.1, pooled_s=0.1, equal=False)]
    text = serve_bench.table(rows)  # each turn: the chats' medians, the median of their own speed-ups
    assert "| 1 | 12 | 0 | 300 ms | 100 ms | 2.0x | yes |" in text and text.endswith("| 1.0x | NO |"), text
    doc = tmp_path / "performance.md"
    begin, end = serve_bench.MARKERS
    doc.write_text(f"a\n{bench.BEGIN}\nkept\n{bench.END}\n{begin}\nold\n{end}\nz\n")
    bench.write([text], doc, markers=serve_bench.MARKERS)
    assert doc.read_text() == f"a\n{bench.BEGIN}\nkept\n{bench.END}\n{begin}\n{text}\n{end}\nz\n"


def test_the_miss_cost_is_the_median_of_the_new_chats_and_an_untimed_one_is_said():
    from helpers.pipeline.tools import serve_bench

    rows = [dict(turn="1", plain_s=0.1, pooled_s=0.1), *(dict(turn=f"new chat {i}", plain_s=1.0, pooled_s=p)
                                                           for i, p in enumerate((1.5, 1.0, 1.25, float("nan"))))]
    text = serve_bench.miss_cost(rows)
    assert ("median of 3 +25.0% (from +0.0% to +50.0%; goal within 3%: not resolved: the samples lie either side of "
            "it); 1 replied no content, not timed.") in text, text
    assert "not timed" in serve_bench.miss_cost(rows[:1])
    exact = [dict(turn=f"new chat {i}", plain_s=1.0, pooled_s=p) for i, p in enumerate((1.03, 0.9))]
    assert "met by every sample" in serve_bench.miss_cost(exact)  # exactly at the goal is within it
    over = [dict(turn=f"new chat {i}", plain_s=1.0, pooled_s=p) for i, p in enumerate((1.031, 1.2))]
    assert "missed by every sample" in serve_bench.miss_cost(over)


def test_the_last_turns_speedup_is_judged_against_its_goal_from_the_chats_median():
    from helpers.pipeline.tools import serve_bench

    turn = lambda t, a, b: dict(turn=t, prompt=1, reused=0, plain_s=a, pooled_s=b, equal=True)  # noqa: E731
    rows = [turn("1", 1, 1), turn("8", 5, 1), turn("8", 6, 1), turn("8", 1, 1), turn("new chat 1", 1, 1)]
    assert serve_bench.goals(rows) == ("Turn 8: first token 5.0x sooner pooled than plain (median of 3 chats; goal "
                                       "5x: met).")
    rows[1] = turn("8", 4, 1)
    assert "4.0x" in serve_bench.goals(rows) and "missed by 1.25x" in serve_bench.goals(rows)
    assert "not timed" in serve_bench.goals(rows[-1:])


def test_the_in_process_miss_is_decided_by_its_interval_against_the_goal():
    from helpers.pipeline.tools import serve_bench

    def line(ratios):
        return serve_bench.miss_cpu({True: ratios, False: [1.0] * len(ratios)}, 1235)
    assert "+1.0% [" in line([1.01] * 11) and "goal within 3%: met by its 95% interval" in line([1.01] * 11)
    assert "missed by its 95% interval" in line([1.10] * 11)  # a contradicting measurement: 10% over on every pair
    assert "not resolved: its 95% interval lies either side of it" in line([0.9, 1.1] * 5 + [1.0])
    assert "11 interleaved pairs on new 1235-token prompts" in line([1.0] * 11)
