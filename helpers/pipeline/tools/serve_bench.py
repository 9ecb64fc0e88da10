"""Time to first token per turn of a few chats (each turn: the chats' median) through two real servers, plain
`transformers serve` and `kvresume serve`, on a local ~24M-parameter random Llama (kvresume.serving.folders,
byte-level BPE, a chat template), with the `openai` client, streamed: prompt tokens, tokens the pool reused (the
usage's cached_tokens), each first token's latency, and whether the replies are equal. Turns alternate between the
servers so that load drifts alike on both. A miss is also timed in-process, where the servers' latency noise does
not reach it: thread CPU time of generate() to its first token, pooled against untracked, in interleaved pairs on
new chats.

    python -m helpers.pipeline.tools.serve_bench [--turns 8] [--size 24M] [--words 150] [--chats 3] [--write]

`--write` puts the table, headed by the run's date, machine, kit commit and releases, into docs/performance.md
("Serving", between its markers); `make bench` runs it after the tracking cost.
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from helpers.pipeline.run.record import git_state
from helpers.pipeline.tools import bench

MARKERS = ("<!-- serve-bench:begin -->", "<!-- serve-bench:end -->")


def _turn(client: Any, model: str, messages: list[dict], new: int) -> tuple[str, float, int, int]:
    """(reply, seconds to the first content chunk, prompt tokens, cached tokens) of one streamed completion."""
    start, first, text, usage = time.perf_counter(), None, "", None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=new, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        piece = "".join(c.delta.content or "" for c in chunk.choices)
        if piece and first is None:
            first = time.perf_counter() - start
        text, usage = text + piece, chunk.usage or usage
    details = getattr(usage, "prompt_tokens_details", None)
    return text, first or float("nan"), usage.prompt_tokens if usage else 0, (details and details.cached_tokens) or 0


def words_of_text() -> list[str]:
    from kvresume.serving.folders import corpus

    return " ".join(corpus()).split()


def alone(text: list[str], j: int, words: int, turns: int) -> list[dict[str, str]]:
    """The j-th new chat: one user message as long as a chat's user turns, from the end of `text`."""
    return [{"role": "user", "content": " ".join(text[-words * turns * (j + 1):][:words * turns])}]


def run(folder: Path, turns: int, words: int, new: int, misses: int = 5, chats: int = 3) -> list[dict[str, Any]]:
    """One row per turn of each of `chats` chats (prompt tokens, reused, plain and pooled first-token seconds, replies
    equal), each chat other text, then `misses` new chats as long as a chat, which the pool misses (the first server
    asked alternates)."""
    from kvresume.serving.folders import PLAIN, POOLED, start

    servers = [start(PLAIN, folder, folder.parent / "plain.log"), start(POOLED, folder, folder.parent / "pooled.log")]
    text = words_of_text()
    assert len(text) >= (chats + misses) * turns * words, "the corpus is shorter than the chats"
    rows = []
    try:
        for _, client in servers:  # one request each first: the first request of a process is slower
            _turn(client, str(folder), [{"role": "user", "content": "warm up"}], 2)
        for c in range(chats):
            chat = ([], [])
            for i in range(turns):
                start_word = (c * turns + i) * words
                got = []
                for (_, client), messages in zip(servers, chat):
                    messages.append({"role": "user", "content": " ".join(text[start_word:start_word + words])})
                    got.append(_turn(client, str(folder), messages, new))
                    messages.append({"role": "assistant", "content": got[-1][0]})
                rows.append(_row(str(i + 1), got, c + 1))
        for j in range(misses):
            order = servers if j % 2 == 0 else servers[::-1]
            got = [_turn(client, str(folder), alone(text, j, words, turns), new) for _, client in order]
            rows.append(_row(f"new chat {j + 1}", got if j % 2 == 0 else got[::-1]))
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    return rows


def _row(turn: str, got: list[tuple[str, float, int, int]], chat: int = 0) -> dict[str, Any]:
    (a, ta, n, _), (b, tb, _, hit) = got
    return dict(turn=turn, chat=chat, prompt=n, reused=hit, plain_s=ta, pooled_s=tb, equal=a == b)


def per_turn(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chats' rows of each turn as one: median prompt, reused and first-token times, the median of the chats'
    speed-ups (pooled over plain, each chat's own), replies equal in every chat; the new chats' rows as they are."""
    turns: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        turns.setdefault(r["turn"], []).append(r)
    return [dict(turn=t, chats=len(rs), equal=all(r["equal"] for r in rs),
                 speedup=statistics.median(r["plain_s"] / r["pooled_s"] for r in rs),
                 **{k: statistics.median(r[k] for r in rs) for k in ("prompt", "reused", "plain_s", "pooled_s")})
            for t, rs in turns.items()]


def goals(rows: list[dict[str, Any]], speedup: float = 5.0) -> str:
    """The last turn's speed-up against its goal, from the chats' median."""
    chats = [r for r in per_turn(rows) if not r["turn"].startswith("new chat")]
    if not chats:
        return "The last turn: not timed (no chat turns)."
    last = chats[-1]
    met = "met" if last["speedup"] >= speedup else f"missed by {speedup / last['speedup']:.2f}x"
    return (f"Turn {last['turn']}: first token {last['speedup']:.1f}x sooner pooled than plain (median of "
            f"{last['chats']} chats; goal {speedup:g}x: {met}).")


def miss_cost(rows: list[dict[str, Any]], within: float = 0.03) -> str:
    """The pool's cost on a miss: the median of the new chats' pooled/plain first-token ratios, with their range."""
    misses = [r for r in rows if r["turn"].startswith("new chat")]
    ratios = sorted(r["pooled_s"] / r["plain_s"] for r in misses if math.isfinite(r["pooled_s"] / r["plain_s"]))
    if not ratios:
        return f"A miss: not timed ({len(misses)} new chats, none with a first content token on both servers)."
    return (f"A miss (the new chats, first server asked alternating): pooled/plain first-token time, median of "
            f"{len(ratios)} {100 * (statistics.median(ratios) - 1):+.1f}% (from {100 * (ratios[0] - 1):+.1f}% to "
            f"{100 * (ratios[-1] - 1):+.1f}%; goal within {100 * within:g}%: "
            f"{_against(ratios[0], ratios[-1], within)})" +
            (f"; {len(misses) - len(ratios)} replied no content, not timed." if len(ratios) < len(misses) else "."))


def _against(low: float, high: float, within: float, by: str = "every sample",
             spread: str = "the samples lie") -> str:
    """Met where all of [low, high] (ratios) is within the goal, missed where none is; else it decides nothing."""
    if high <= 1 + within + 1e-12:  # exactly at the goal is within it (floats' rounding aside)
        return f"met by {by}"
    if low > 1 + within + 1e-12:
        return f"missed by {by}"
    return f"not resolved: {spread} either side of it"


def miss_pairs(folder: Path, prompts: list[Any]) -> dict[bool, list[float]]:
    """Thread CPU seconds of generate() to its first token on each new prompt, in interleaved pairs: {True: the
    pooled model (kvresume.pool.attach, each prompt a miss), False: the same weights untracked}."""
    import torch
    import transformers

    from kvresume import pool

    plain, pooled = (transformers.AutoModelForCausalLM.from_pretrained(folder).eval() for _ in range(2))
    attached = pool.attach(pooled)
    times: dict[bool, list[float]] = {True: [], False: []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thread CPU time counts this thread only: no work on others
    try:
        with torch.no_grad():
            for ids in prompts:
                for tracked, model in ((False, plain), (True, pooled)):
                    start = time.thread_time()
                    model.generate(ids, max_new_tokens=1, do_sample=False)
                    times[tracked].append(time.thread_time() - start)
                assert attached.last.reused == 0, attached.last.line()  # a miss
    finally:
        torch.set_num_threads(threads)
    return times


def miss_cpu(times: dict[bool, list[float]], n: int, within: float = 0.03) -> str:
    """The in-process miss line: the pairs' median pooled/plain CPU-time ratio, its 95% interval against the goal."""
    median, low, high = bench.overhead(times)
    verdict = _against(1 + low / 100, 1 + high / 100, within, "its 95% interval", "its 95% interval lies")
    return (f"A miss in-process (thread CPU time of generate() to its first token, {len(times[True])} interleaved "
            f"pairs on new {n}-token prompts, one thread): {median:+.1f}% [{low:+.1f}, {high:+.1f}] (goal within "
            f"{100 * within:g}%: {verdict}).")


def header(args: argparse.Namespace) -> str:
    """What the run was: when, where, at which commit, on which releases, with what chat."""
    import os

    import torch
    import transformers

    from kvresume.serving.folders import parameters

    commit, dirty = git_state()
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on CPU (load average "
            f"{os.getloadavg()[0]:.2f} at the start), kit {(commit or 'unknown')[:12]}{' (dirty)' if dirty else ''}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}: a {parameters(args.size) / 1e6:.1f}M "
            f"random Llama chat folder, {args.turns} turns of {args.words} words and {args.new} new tokens each, "
            "streamed through plain `transformers serve` and `kvresume serve` (turns alternating between them, one "
            f"warm-up request each), {args.chats} chats of other text (each cell their median), then {args.misses} new "
            "chats as long as a chat, which the pool misses (`python -m helpers.pipeline.tools.serve_bench`).")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| turn | prompt tokens | reused by the pool | first token, plain | first token, pooled | speed-up | replies equal |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['turn']} | {r['prompt']:.0f} | {r['reused']:.0f} | {r['plain_s'] * 1e3:.0f} ms | "
              f"{r['pooled_s'] * 1e3:.0f} ms | {r['speedup']:.1f}x | {'yes' if r['equal'] else 'NO'} |"
              for r in per_turn(rows)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--size", default="24M")
    parser.add_argument("--words", type=int, default=150, help="words of each user message")
    parser.add_argument("--new", type=int, default=16, help="max_tokens of each reply")
    parser.add_argument("--chats", type=int, default=3, help="chats of other text (each turn's cells: their median)")
    parser.add_argument("--misses", type=int, default=5, help="new chats after the chat (the pool's misses)")
    parser.add_argument("--write", action="store_true", help="put the table into docs/performance.md")
    parser.add_argument("--pairs", type=int, default=11, help="in-process miss pairs (the new chats' text)")
    args = parser.parse_args(argv)
    import transformers

    from kvresume.serving.folders import chat_folder

    folder = chat_folder(Path(tempfile.mkdtemp(prefix="serve-bench-")) / f"chat-{args.size}", size=args.size)
    rows = run(folder, args.turns, args.words, args.new, args.misses, args.chats)
    tok, text = transformers.AutoTokenizer.from_pretrained(folder), words_of_text()
    assert len(text) >= (args.chats + args.pairs) * args.turns * args.words, "the corpus is too short"
    prompts = [tok.apply_chat_template(alone(text, j, args.words, args.turns), add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"] for j in range(args.pairs)]
    times = miss_pairs(folder, prompts)
    lines = [header(args), "", table(rows), "", goals(rows), miss_cost(rows),
             miss_cpu(times, int(statistics.median(p.shape[1] for p in prompts)))]
    print("\n".join(lines))
    if args.write:
        bench.write(lines, markers=MARKERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
