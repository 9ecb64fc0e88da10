"""Upstream code: the source of the transformers functions a notebook names as relevant, read with `inspect` from a
release's installed package (never from a network), and the unified diff between two releases."""
from __future__ import annotations

import difflib
import json
import re
import subprocess
from typing import Any, Sequence

from ...findings import QWEN3_VL

# The lines a thread should quote from a function's diff, where its first changed lines are not those.
QUOTE = {"transformers.generation.utils.GenerationMixin.generate": r'attention_mask"\]( == 1\)|\s*= None)',
         "transformers.cache_utils.Cache.update": r"wait_stream",
         f"{QWEN3_VL}.Qwen3VLForConditionalGeneration._prepare_position_ids_for_generation": r"has_new_vision_tokens"}


# Run under a release's python: {name: source text or {"error": why}}.
_READ = r"""
import inspect, json, pkgutil, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = inspect.getsource(pkgutil.resolve_name(name))
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
print(json.dumps(out))
"""


def relevant(notebook: str) -> tuple[str, ...]:
    """The functions named by a notebook's finding ('05_hybrid...' -> helpers.offload.finding), focus words left on."""
    from ...findings import of

    return of(notebook).functions


def split_focus(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """('name|word', ...) -> ([name, ...], {name: word})."""
    plain = [n.split("|", 1)[0] for n in names]
    return plain, {n.split("|", 1)[0]: n.split("|", 1)[1] for n in names if "|" in n}


def focus_hunks(diff: str, word: str) -> str:
    """The unified diff with only the hunks whose added or removed lines mention `word` (headers kept)."""
    head, *hunks = re.split(r"(?m)^(?=@@)", diff)
    kept = [h for h in hunks if any(ln[:1] in "+-" and word in ln for ln in h.splitlines()[1:])]
    return head + "".join(kept) if kept else ""


def read_sources(python: str, names: Sequence[str], env: dict[str, str] | None = None,
                 cwd: str | None = None) -> dict[str, Any]:
    """{name: source} of each function as the release at `python` has it ({"error": ...} where it has none)."""
    if not names:
        return {}
    res = subprocess.run([python, "-c", _READ, *names], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    if res.returncode != 0:
        return {n: {"error": f"could not read: {res.stderr.strip().splitlines()[-1:] or res.returncode}"} for n in names}
    return json.loads(res.stdout.strip().splitlines()[-1])


def diff_sources(old: dict[str, Any], new: dict[str, Any], old_release: str, new_release: str,
                 context: int = 3, focus: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """{name: {"status": same | changed | added | removed | unreadable, "diff": unified diff text}}."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys([*old, *new]):
        a, b = old.get(name), new.get(name)
        status = {(True, True): "same" if a == b else "changed", (False, True): "added", (True, False): "removed",
                  (False, False): "unreadable"}[isinstance(a, str), isinstance(b, str)]
        lines = [x.splitlines(keepends=True) if isinstance(x, str) else [] for x in (a, b)]
        text = "" if status in ("same", "unreadable") else "".join(difflib.unified_diff(
            *lines, f"{old_release}/{name}", f"{new_release}/{name}", n=context))
        if name in (focus or {}) and text:
            text = focus_hunks(text, focus[name])
            if not text:  # changed, but nowhere near what the notebook measures
                out[name] = {"status": "same", "diff": "", "note": f"changed, but no hunk mentions {focus[name]!r}"}
                continue
        out[name] = {"status": status, "diff": text, "quote": changed_lines(text, prefer=QUOTE.get(name))}
        if status == "unreadable":
            out[name]["why"] = f"{old_release}: {(a or {}).get('error')}; {new_release}: {(b or {}).get('error')}"
    return out


def changed_lines(diff: str, limit: int = 2, prefer: str | None = None) -> list[str]:
    """The first `limit` added or removed lines of a unified diff (headers left out), lines matching the
    regex `prefer` first, then code before comments: what a thread quotes."""
    picked = [ln.rstrip("\n") for ln in diff.splitlines()
              if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()]
    first = [ln for ln in picked if prefer and re.search(prefer, ln)]
    code = [ln for ln in picked if not ln[1:].strip().startswith("#") and ln not in first]
    return (first + code + [ln for ln in picked if ln not in code and ln not in first])[:limit]
