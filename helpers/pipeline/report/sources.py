"""Each source's setup and what it says cannot be tested on this kit's machines; which source a notebook answers
is its finding's (helpers.findings)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...findings import of


@dataclass(frozen=True)
class Source:
    """One source the kit answers: its public name, its setup and what this kit cannot test of it."""

    key: str
    title: str
    setup: dict[str, str] = field(default_factory=dict)  # release, dtype, device, model (the source's own words)
    not_tested: str = ""
    # The first screen's plain-transformers repro: a file under examples/repro/ (torch and transformers only) and what
    # it prints beside the source's number. A new source is one entry here + its file.
    repro: str = ""
    repro_prints: str = ""
    short: str = ""  # the name on the first screen
    untested: str = ""  # the first screen's words for what is not tested here and why, where no count says it


SOURCES: dict[str, Source] = {s.key: s for s in (
    Source("control", "The Qwen3-VL resume-contract control (transformers 5.14.1)",
           {"release": "5.14.1", "dtype": "float16", "device": "cuda (Tesla T4)",
            "model": "Qwen/Qwen3-VL-2B-Instruct @ 89644892"},
           "the real 2B checkpoint in fp16 on a T4 (no hub access and no GPU here: the tiny random-weight default "
           "stands in; pass `-p model_id ...` online), the 8B MMBench-Video result and video prompts (outside the "
           "control's own scope too).",
           "examples/repro/resume_contract_qwen3_vl.py",
           "expected vs got first model call without and with the full mask (the source: [1, 0] and a failure, [1, 1] and it works)",
           "Qwen3-VL control"),
    Source("48947", "transformers issue #48947: hybrid offloading drift",
           {"release": "5.17.0", "dtype": "bfloat16", "device": "cuda (RTX PRO 6000 Blackwell)",
            "model": "Qwen/Qwen3.8-27B"},
           "the 27B checkpoint and the CUDA copy streams themselves where no GPU is present: those claims are "
           "skipped with the reason, and the race is replayed as a simulation.",
           "examples/repro/offloading_48947.py",
           "on CPU the prefetch reads left unordered after their offload copy; with CUDA max |logit diff| per step, offloading on vs off (the report: 0.0, 2.1171875, 7.625, 17.4375)",
           "#48947"),
    Source("new-image", "A new image after a cached turn (Qwen3-VL multi-turn resume: `QwenLM/Qwen3-VL#1685`, `QwenLM/Qwen3-VL#1412`)",
           {}, "the threads' own checkpoints, images and code (their text could not be read from this machine, so every "
           "claim is the kit's own, kind beyond; the tiny random-weight default stands in; pass `-p model_id ...` online).",
           "examples/repro/qwen3_vl_new_image_turn.py",
           "expected vs got max |logit diff| of the natural turn-2 call against one forward over both turns, turn 2's positions and the repair's",
           "Qwen3-VL new image",
           "the threads' statements (text not readable here)"),
    Source("rollback", "Rolling a hybrid's cache back and continuing it (transformers `#49036`, PR `#45513`, 5.25.0's "
           "linear-attention cache rewrite)",
           {}, "the threads' checkpoints and code (their text could not be read from this machine, so every claim is the "
           "kit's own, kind beyond; the tiny random-weight hybrid stands in), the 64-layer 48/16 layout and the "
           "quantized cache.",
           "examples/repro/hybrid_rollback_rebuild.py",
           "expected vs got next logits after crop(-k) against a cache that never saw the k tokens, and a hand-rebuilt "
           "hybrid's length and re-fed tokens",
           "Hybrid rollback",
           "the threads' statements (text not readable here)"),
    Source("serve", "`transformers serve` re-prefills every turn (5.17.0's serving code: `TODO: add prefix caching for "
           "the non-CB path`)", {},
           "a real checkpoint's chat template and GPU timings (the 24.7M random-weight folder stands in; pass "
           "`-p model_id ...` online) and continuous batching (`--continuous-batching` does not call generate()).",
           "examples/repro/serve_prefix_reuse.py",
           "the tokens the first model call of turn 2 gets when generate() re-prefills it as the server does, and "
           "when it resumes turn 1's cache",
           "transformers serve",
           "the TODO's own text (no claim quotes it)"),
    Source("triage", "Triage of a user's rebuild (the control's decision tree applied)", {},
           "a user's own compression method unless passed with `-p rebuild ...`: the kit's stand-in rebuilds take its "
           "place (no source setup to compare: the tree is the control's, the rebuilds are this kit's)."),
)}


def source_of(notebook: str) -> Source:
    """The source a notebook's finding answers (01_identity... -> the control); KeyError for an undeclared one."""
    return SOURCES[of(notebook).source]


def kind_of(claim: dict[str, Any]) -> str:
    """A claim's kind ('reproduces' where none is recorded)."""
    return claim.get("kind") or "reproduces"


def run_setup(envs: list[dict[str, Any]]) -> dict[str, str]:
    """This run's release, dtype, device and model over the notebooks of one source (values joined when they differ)."""
    def values(key: str) -> str:
        return ", ".join(dict.fromkeys("?" if env.get(key) in (None, "") else str(env[key]) for env in envs)) or "?"

    model = values("model_id")
    if any(str(env.get("model_id") or "").startswith("tiny-") for env in envs):
        model += " (tiny, random weights)"
    device = values("device")
    if not any(env.get("cuda_available") for env in envs):
        device += " (no CUDA)"
    return {"release": values("transformers"), "dtype": values("dtype"), "device": device, "model": model}


def setup_rows(source: Source, envs: list[dict[str, Any]]) -> tuple[list[tuple[str, str, str, str]], str]:
    """(rows of what, source, this run, same?) and one sentence stating the gap."""
    pairs = [(key, source.setup.get(key, "?"), ours) for key, ours in run_setup(envs).items()]
    rows = [(key, theirs, ours, "same" if theirs.split(" ")[0] == ours.split(" ")[0] else "differs")
            for key, theirs, ours in pairs]
    gaps = [f"{key} {ours} instead of {theirs}" for key, theirs, ours, same in rows if same == "differs"]
    gap = ("Gap: " + "; ".join(gaps) + ". Raw max |diff| is not comparable across it; top-1, top-5 "
           "overlap, cosine, ratios and the pass/fail pattern are.") if gaps else \
        "No gap in release, dtype, device or model."
    return rows, gap
