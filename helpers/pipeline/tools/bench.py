"""`make bench`: what tracking costs. Per-token decode time of greedy generate() with the model tracked vs untracked
(kvresume.track), on the tiny seeded model and a ~64M-parameter random Qwen3 (hidden 512, 10 layers), NEW new
tokens, interleaved pairs of runs in this one process (101 on the tiny model, 11 on the other; on one CPU thread: this
thread's CPU time, else wall time), the overhead being the median of the pairs' ratios with its 95% interval (garbage
collected before each run, the heap before the runs frozen: gc.freeze); on a shared CPU that interval is often wider
than the effect, so the same generate() is also counted in instructions per token under valgrind's cachegrind
(`instructions`: not slowed by the machine's load); and the peak extra memory of one resume() call (CUDA: measured by
the allocator, tracked resume() minus untracked generate() on the same cache; CPU: the ledger's bytes and its read's
largest temporary, computed from shapes). `--write` puts the table into docs/performance.md between its markers."""
from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from kvresume.writes import FOLD

from helpers.pipeline.run.record import git_state

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "performance.md"
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # no pool thread spinning while counted
START = 1  # the short counted run's new tokens: (I(START + new) - I(START)) / new is what the `new` decode steps cost
# the decode steps counted: one fold of the ledger's writes (kvresume.writes.FOLD), each step's and each fold's cost
# in it; a count does not vary by run, so the timing's 256 steps would only cost valgrind's time (x4, ~50x slower)
COUNTED = FOLD
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def mid_model() -> torch.nn.Module:
    """A seeded random Qwen3 on kvresume.testing's config: hidden 512, 10 layers, 8 heads (4 K/V), vocab 32k (~64M)."""
    import transformers
    from kvresume.testing import text_config

    cfg = text_config("dense", vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=10,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).eval()


def models() -> dict[str, tuple[Callable[[], torch.nn.Module], int, bool]]:
    """Each bench model's builder, its pairs of runs (the tiny model's overhead is the larger share of a token's
    time, and a run of it is ~14 times shorter) and whether its instructions are counted: the tiny model's are, where
    tracking's share of a token is largest (its hooks cost per layer and per token what they cost on a wider model,
    whose forward costs more); the 64M model's are not (its matmuls under valgrind take ~9 of make bench's minutes)."""
    from kvresume.testing import build

    return {"tiny (kvresume.testing dense)": (lambda: build("dense"), 101, True),
            "Qwen3 random 512x10": (mid_model, 11, False)}


def overhead(times: dict[bool, list[float]]) -> tuple[float, float, float]:
    """(median, low, high) of the pairs' tracked/untracked ratios minus 1, in %: the median's 95% interval from the
    binomial order statistics (the k-th smallest and largest ratios)."""
    ratios = sorted(t / u for t, u in zip(times[True], times[False]))
    n, k, tail = len(ratios), 0, 0.0
    while k < n // 2 and tail + math.comb(n, k) / 2 ** n <= 0.025:
        tail, k = tail + math.comb(n, k) / 2 ** n, k + 1
    low, high = ratios[max(k - 1, 0)], ratios[min(n - k, n - 1)]
    return tuple(100 * (r - 1) for r in (statistics.median(ratios), low, high))


def instructions(m: torch.nn.Module, new: int) -> dict[bool, float] | str:
    """Instructions per decoded token of greedy generate() on `m`, untracked (False) and tracked (True):
    (I(START + new tokens) - I(START)) / new of each arm, counted by valgrind's cachegrind (one thread per pool,
    PYTHONHASHSEED=0: a count does not depend on the machine's load); a string: why not counted."""
    if shutil.which("valgrind") is None:
        return "not counted: no valgrind (apt-get install valgrind)"
    with tempfile.TemporaryDirectory() as folder:
        m.save_pretrained(folder)
        counts = counted(folder, new)
    return {t: (counts[t, START + new] - counts[t, START]) / new for t in (False, True)}


def counted(folder: str, new: int) -> dict[tuple[bool, int], int]:
    """Instructions of each (tracked, tokens) run of `child` in one valgrind process: a forked process's count starts
    from its parent's at the fork, so importing, loading and warming up, done once before the forks, cancel in the
    differences."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable, "-m",
           "helpers.pipeline.tools.bench", "--child", f"{new},{folder}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**os.environ, "PYTHONHASHSEED": "0", **dict.fromkeys(THREADS, "1")})
    totals = refs(done.stderr)
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    return {(bool(tracked), n): totals[int(pid)] for pid, (tracked, n) in runs.items()}


def refs(report: str) -> dict[int, int]:
    """cachegrind's instruction count (`I refs`) of each process in its summary, by pid."""
    return {int(pid): int(n.replace(",", "")) for pid, n in re.findall(r"==(\d+)== I\s+refs:\s+([\d,]+)", report)}


def child(spec: str) -> None:
    """`--child NEW,FOLDER`: what `counted` counts: the saved model loaded on one thread, then one forked process per
    arm and length, all at once, each one generate() of START or START + NEW tokens (a first call's one-time costs are
    in both lengths' counts and cancel: no warm-up); prints {pid: [tracked, tokens]}."""
    import transformers

    new, folder = spec.split(",", 1)
    torch.set_num_threads(1)
    m = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt = torch.randint(10, 2000, (1, 32), generator=torch.Generator().manual_seed(0))
    gc.freeze()  # a full collection's walk over torch's and transformers' objects is not what is counted
    runs: dict[int, list[Any]] = {}
    for tracked in (False, True):
        for n in (START, START + int(new)):
            pid = os.fork()
            if pid == 0:
                decode_seconds(m, prompt, n, tracked)
                os._exit(0)
            runs[pid] = [tracked, n]
    failed = {pid: status for pid in runs if (status := os.waitpid(pid, 0)[1])}
    if failed:
        raise RuntimeError(f"counted runs failed (pid: wait status): {failed}")
    print(json.dumps(runs), flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def clock(device: torch.device) -> Callable[[], float]:
    """The CPU time of this thread on a one-thread CPU run (time the scheduler gives other processes on a shared CPU
    is not counted), else wall time."""
    return time.thread_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter


def decode_seconds(m: torch.nn.Module, prompt: torch.Tensor, new: int, tracked: bool) -> float:
    """Seconds (`clock`) of one greedy generate() of exactly `new` tokens, tracked or not."""
    from kvresume import track

    tracker = track(m) if tracked else None
    now = clock(prompt.device)
    gc.collect()
    try:
        sync(prompt.device)
        start = now()
        with torch.no_grad():
            m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0)
        sync(prompt.device)
        return now() - start
    finally:
        if tracker is not None:
            tracker.remove()


def per_token(m: torch.nn.Module, prompt: torch.Tensor, new: int, runs: int) -> dict[bool, list[float]]:
    """ms per token, untracked (False) and tracked (True), of `runs` interleaved pairs (the order alternates), after a
    warm-up."""
    decode_seconds(m, prompt, 8, False)
    decode_seconds(m, prompt, 8, True)
    gc.freeze()  # the heap before the runs: a full collection's walk over it is not what is measured
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(runs):
        for tracked in ((False, True) if i % 2 == 0 else (True, False)):
            times[tracked].append(decode_seconds(m, prompt, new, tracked) * 1000 / new)
    return times


def resume_memory(m: torch.nn.Module, prompt: torch.Tensor, new: int) -> str:
    """The peak extra memory of one resume() on a tracked cache of prompt + `new` tokens (see the module doc)."""
    from kvresume import ledger_of, resume, track
    from kvresume.compat import generate_cache_kwarg
    from kvresume.ledger import stored_ledger, without_ledger

    with track(m), torch.no_grad():
        out = m.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    cache, whole = out.past_key_values, torch.cat([out.sequences, prompt[:, :8]], 1)
    led = stored_ledger(cache)
    ledger_bytes = sum(t.numel() * t.element_size() for t in (led.token_ids, led.positions, led.mask, led.prints))
    if prompt.device.type != "cuda":  # no allocator statistics on the CPU: the read's tensors, from their shapes
        temp = led.batch * led.batch * led.length * led.prints.shape[-1] + 2 * ledger_bytes  # equality, gathered, host
        return f"ledger {ledger_bytes / 1024:.1f} KiB; read temporaries about {temp / 1024:.1f} KiB (computed, CPU)"
    kw = generate_cache_kwarg(m)

    def peak(fn: Callable[[], Any]) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    plain = without_ledger(cache)
    untracked = peak(lambda: m.generate(whole, attention_mask=torch.ones_like(whole), max_new_tokens=1,
                                        pad_token_id=0, **{kw: copy.deepcopy(plain)}))
    copied = copy.deepcopy(cache)
    tracked = peak(lambda: resume(m, whole, copied, max_new_tokens=1, pad_token_id=0))
    assert ledger_of(cache) is not None
    return (f"resume() {tracked / 2**20:.2f} MiB vs untracked generate() {untracked / 2**20:.2f} MiB: "
            f"{(tracked - untracked) / 2**20:+.2f} MiB; ledger {ledger_bytes / 1024:.1f} KiB")


def table(device: torch.device, new: int, runs: int | None, count_them: bool = True) -> list[str]:
    """The bench as markdown lines."""
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f} at the start)"
    commit, dirty = git_state()
    kit = f"kit {(commit or 'unknown')[:12]}{' (dirty)' if dirty else ''}"
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {name}, {kit}, "
             f"torch {torch.__version__}, transformers {transformers.__version__}: greedy generate() of {new} new "
             f"tokens after a 32-token prompt, interleaved pairs of runs in one process (overhead: the median of the "
             f"pairs' ratios, [its 95% interval]), "
             f"{'thread CPU time' if clock(device) is time.thread_time else 'wall time'} (`make bench`).", "",
             "| model | parameters | pairs | untracked ms/token (median) | tracked ms/token (median) | "
             "overhead [95%] | "
             "instructions/token: untracked, tracked | overhead (instructions) | one resume(): extra memory |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, (make, pairs, counts_it) in models().items():
        m = make().to(device)
        if device.type == "cuda":
            m = m.to(torch.bfloat16)
        prompt = torch.randint(10, 2000, (1, 32), generator=torch.Generator().manual_seed(0)).to(device)
        times = per_token(m, prompt, new, runs or pairs)
        plain, tracked = statistics.median(times[False]), statistics.median(times[True])
        mid, low, high = overhead(times)
        params = sum(p.numel() for p in m.parameters()) / 1e6
        count = (instructions(m, COUNTED) if count_them and counts_it and device.type == "cpu" else
                 "not counted (--no-count, or CUDA)" if counts_it else "not counted (the tiny model's share bounds it)")
        counts = count if isinstance(count, str) else f"{count[False] / 1e6:.3f}M, {count[True] / 1e6:.3f}M"
        extra = "" if isinstance(count, str) else f"{100 * (count[True] / count[False] - 1):+.2f}%"
        lines.append(f"| {label} | {params:.1f}M | {runs or pairs} | {plain:.3f} | {tracked:.3f} | {mid:+.1f}% "
                     f"[{low:+.1f}, {high:+.1f}] | {counts} | {extra} | {resume_memory(m, prompt, new)} |")
        print(lines[-1], flush=True)
    return lines


def write(lines: list[str], doc: Path = DOC, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace the text between a pair of markers of docs/performance.md (the bench's by default)."""
    begin, end = markers
    head, rest = doc.read_text().split(begin, 1)
    doc.write_text(head + "\n".join([begin, *lines, end]) + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--runs", type=int, default=None, help="pairs of runs per model (default: 101 tiny, 11 64M)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: no OpenMP spinning on a shared CPU)")
    parser.add_argument("--write", action="store_true", help="put the table into docs/performance.md")
    parser.add_argument("--count", action=argparse.BooleanOptionalAction, default=True,
                        help="instructions per token under valgrind (CPU; one process a model)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    lines = table(torch.device(args.device), args.new, args.runs, args.count)
    print("\n".join(lines))
    if args.write:
        write(lines)


if __name__ == "__main__":
    main()
