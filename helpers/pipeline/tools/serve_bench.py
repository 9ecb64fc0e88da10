"""Time to first token per turn of one chat through two real servers, plain `transformers serve` and `kvresume serve`,
on a local ~24M-parameter random Llama (kvresume.serving.folders, byte-level BPE, a chat template), with the `openai`
client, streamed: prompt tokens, tokens the pool reused (the usage's cached_tokens), each first token's latency,
and whether the replies are equal. Turns alternate between the servers so that load drifts alike on both.

    python -m helpers.pipeline.tools.serve_bench [--turns 8] [--size 24M] [--words 150] [--write]

`--write` puts the table, headed by the run's date, machine, kit commit and releases, into docs/performance.md
("Serving", between its markers); `make bench` runs it after the tracking cost.
"""
from __future__ import annotations

import argparse
import math
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


def run(turns: int, size: str, words: int, new: int, misses: int = 5) -> list[dict[str, Any]]:
    """One row per turn (prompt tokens, reused, plain and pooled first-token seconds, replies equal), then `misses`
    new chats as long as the chat, each other text, which the pool misses (the first server asked alternates)."""
    from kvresume.serving.folders import PLAIN, POOLED, chat_folder, corpus, start

    root = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    folder = chat_folder(root / f"chat-{size}", size=size)
    servers = [start(PLAIN, folder, root / "plain.log"), start(POOLED, folder, root / "pooled.log")]
    text = (" ".join(corpus()) * (4 + misses)).split()
    rows, chats = [], ([], [])
    say = lambda i: {"role": "user", "content": " ".join(text[i * words:(i + 1) * words])}  # noqa: E731
    try:
        for _, client in servers:  # one request each first: the first request of a process is slower
            _turn(client, str(folder), [{"role": "user", "content": "warm up"}], 2)
        for i in range(turns):
            got = []
            for (proc, client), messages in zip(servers, chats):
                messages.append(say(i))
                got.append(_turn(client, str(folder), messages, new))
                messages.append({"role": "assistant", "content": got[-1][0]})
            rows.append(_row(str(i + 1), got))
        for j in range(misses):
            alone = [{"role": "user", "content": " ".join(text[-words * turns * (j + 1):][:words * turns])}]
            order = servers if j % 2 == 0 else servers[::-1]
            got = [_turn(client, str(folder), alone, new) for _, client in order]
            rows.append(_row(f"new chat {j + 1}", got if j % 2 == 0 else got[::-1]))
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(30)
    return rows


def _row(turn: str, got: list[tuple[str, float, int, int]]) -> dict[str, Any]:
    (a, ta, n, _), (b, tb, _, hit) = got
    return dict(turn=turn, prompt=n, reused=hit, plain_s=ta, pooled_s=tb, equal=a == b)


def miss_cost(rows: list[dict[str, Any]]) -> str:
    """The pool's cost on a miss: the median of the new chats' pooled/plain first-token ratios, with their range."""
    import statistics

    misses = [r for r in rows if r["turn"].startswith("new chat")]
    ratios = sorted(r["pooled_s"] / r["plain_s"] for r in misses if math.isfinite(r["pooled_s"] / r["plain_s"]))
    if not ratios:
        return f"A miss: not timed ({len(misses)} new chats, none with a first content token on both servers)."
    return (f"A miss (the new chats, first server asked alternating): pooled/plain first-token time, median of "
            f"{len(ratios)} {100 * (statistics.median(ratios) - 1):+.1f}% (from {100 * (ratios[0] - 1):+.1f}% to "
            f"{100 * (ratios[-1] - 1):+.1f}%)" + (f"; {len(misses) - len(ratios)} replied no content, not timed." if
                                               len(ratios) < len(misses) else "."))


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
            f"warm-up request each, one sample per cell), then {args.misses} new chats as long as the chat, which the "
            "pool misses (`python -m helpers.pipeline.tools.serve_bench`).")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| turn | prompt tokens | reused by the pool | first token, plain | first token, pooled | speed-up | replies equal |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['turn']} | {r['prompt']} | {r['reused']} | {r['plain_s'] * 1e3:.0f} ms | {r['pooled_s'] * 1e3:.0f} ms "
              f"| {r['plain_s'] / r['pooled_s']:.1f}x | {'yes' if r['equal'] else 'NO'} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--size", default="24M")
    parser.add_argument("--words", type=int, default=150, help="words of each user message")
    parser.add_argument("--new", type=int, default=16, help="max_tokens of each reply")
    parser.add_argument("--misses", type=int, default=5, help="new chats after the chat (the pool's misses)")
    parser.add_argument("--write", action="store_true", help="put the table into docs/performance.md")
    args = parser.parse_args(argv)
    rows = run(args.turns, args.size, args.words, args.new, args.misses)
    lines = [header(args), "", table(rows), "", miss_cost(rows)]
    print("\n".join(lines))
    if args.write:
        bench.write(lines, markers=MARKERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
