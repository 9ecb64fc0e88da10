"""Reading what a run left on disk: run.json, timings.json and results/*.json, split into this run's and others';
the order environment keys are shown in (SUMMARY.md and the HTML pages)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# How a run record's status reads in SUMMARY.md and matrix.md.
RUN_STATUS = {"complete": "✅ complete", "running": "⏳ still running (or stopped without saying so)",
              "interrupted": "⚠️ **INTERRUPTED**", "failed": "❌ **FAILED**"}
ENV_KEYS = ("python", "torch", "transformers", "platform", "cuda_available", "device", "device_name", "dtype",
            "attn_implementation", "model_id", "model_revision", "processor", "seed")


def env_keys(envs: list[dict[str, Any]]) -> list[str]:
    """The environment keys any of `envs` has: ENV_KEYS' order first, then the others sorted."""
    present = {k for env in envs for k in env}
    return [k for k in ENV_KEYS if k in present] + sorted(present - set(ENV_KEYS))


def load_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


RELEASES_FILE = "releases.json"  # `make share`'s pinned and newest release (matrix.share); a run-all removes it


def load_results(out: Path) -> list[dict[str, Any]]:
    """Every results/*.json under `out`, sorted by notebook (an unreadable one without claims)."""
    return [{"notebook": path.stem, **load_json(path)} for path in sorted((out / "results").glob("*.json"))]


def run_id_of(data: dict[str, Any]) -> str | None:
    """The run id a results or timings file belongs to (top-level "run": {"run_id"} or "run_id")."""
    run = data.get("run")
    rid = run.get("run_id") if isinstance(run, dict) else None
    return rid or data.get("run_id") or None


def split_by_run(results: list[dict[str, Any]], run_id: str | None) -> tuple[list[dict[str, Any]], dict[str | None, list[dict[str, Any]]]]:
    """(results of run `run_id`, {other run id or None: their results}); no run id -> nothing is current."""
    current = [r for r in results if run_id and run_id_of(r) == run_id]
    others: dict[str | None, list[dict[str, Any]]] = {}
    for r in (r for r in results if r not in current):
        others.setdefault(run_id_of(r), []).append(r)
    return current, others
