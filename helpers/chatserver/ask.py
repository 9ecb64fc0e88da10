"""`transformers serve`'s re-prefill (notebook 11 answers it): its SOURCE and Ask writer, for the report only."""
from __future__ import annotations

from pathlib import Path

from ..findings import Source
from ..pipeline.report.asks import Claims, Lines, claim_of, first_change, joined, num

SOURCE = Source("serve", "`transformers serve` re-prefills every turn (5.17.0's serving code: `TODO: add prefix caching for "
                "the non-CB path`)", {},
                "a real checkpoint's chat template and GPU timings (the 24.7M random-weight folder stands in; pass "
                "`-p model_id ...` online) and continuous batching (`--continuous-batching` does not call generate()).",
                "examples/repro/serve_prefix_reuse.py",
                "the tokens the first model call of turn 2 gets when generate() re-prefills it as the server does, and "
                "when it resumes turn 1's cache",
                "transformers serve",
                "the TODO's own text (no claim quotes it)")


def ask(by_release: dict[str, Claims], out: Path) -> Lines:
    """`transformers serve` re-prefilling each turn per release; `kvresume serve`'s measured reuse as the repair."""
    symptom, repair = {}, {}
    for rel, claims in by_release.items():
        plain, sooner = claim_of(claims, "serve.plain_recomputes_every_turn"), claim_of(claims, "serve.first_token_sooner")
        last = (plain.get("evidence") or {}).get("last") or {}
        if plain.get("verdict") == "holds" and last:
            symptom[rel] = f"turn {last.get('turn')} prefills all {last.get('prompt')} prompt tokens again"
        speed = (sooner.get("deciding") or {}).get("speedup")
        same = claim_of(claims, "serve.replies_equal").get("verdict") == "holds"
        if sooner.get("verdict") == "holds" and same and last:
            repair[rel] = (f"reused {last.get('reused')} of {last.get('prompt')}, first token {num(speed)}x sooner, "
                           "every reply equal")
    text = ("plain `transformers serve` on a multi-turn chat: " + joined(symptom)) if symptom else ""
    ask = ("serve through `kvresume serve` (the kit ran it: " + joined(repair) + "); upstream: the TODO's prefix "
           "cache for the non-CB path, keyed by token ids, images and weights") if repair else ""
    bisect = first_change(out, "11", "serve.pool_reuses_earlier_turns", list(by_release), False)
    return Lines(text, "; ".join(p for p in (ask, bisect) if p))
