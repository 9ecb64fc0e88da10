"""outputs/SUMMARY.md and outputs/html/: a thin facade over summary, html, scrub, share and records,
keeping the names runner.py and older callers import from here (`report.write_summary`, `report.write_html`)."""
from __future__ import annotations

import json
from typing import Any

from .claims_md import kind_counts, reproduced_count
from .html import environment_markdown, external_images, remote_references, render_html, strip_remote, write_html
from .paste import CELL_CHARS, GITHUB_LIMIT, MAX_CHARS, cell, code_refs, fmt_scalar, pairs
from .records import load_results, load_run, load_timings, run_id_of, split_by_run
from .scrub import machine_paths, scrub, scrub_file, scrub_outputs
from .share import ARCHIVE, finish_timings, share_members, write_share
from .summary import RUN_STATUS, build_summary, commit_text, truncate, write_summary

__all__ = ["RUN_STATUS", "VERDICT_MARK", "ARCHIVE", "CELL_CHARS", "GITHUB_LIMIT", "MAX_CHARS", "build_summary", "cell", "code_refs", "commit_text",
           "environment_markdown", "external_images", "finish_timings", "fmt_scalar", "fmt_value", "kind_counts", "load_results", "load_run",
           "load_timings", "machine_paths", "pairs", "remote_references", "render_html", "reproduced_count",
           "run_id_of", "scrub", "scrub_file", "scrub_outputs", "share_members", "split_by_run", "strip_remote",
           "truncate", "write_html", "write_share", "write_summary"]

# Marks by verdict, for callers that show a verdict without its kind (release_matrix.py).
VERDICT_MARK = {"reproduced": "✅", "refuted": "✅", "holds": "✅", "not_reproduced": "❌", "not_refuted": "❌",
                "fails": "❌", "skipped": "⏭️", "error": "⚠️"}


def fmt_value(value: Any, limit: int = 40) -> str:
    """A JSON value written compactly (release_matrix.py's form): scalars as fmt_scalar, others as compact JSON."""
    if isinstance(value, (bool, int, float)) or value is None:
        return fmt_scalar(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
