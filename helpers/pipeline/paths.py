"""Where the kit writes: one outputs/ folder, found the same way by notebooks, runner and tests."""
from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The kit checkout (the folder holding pyproject.toml), else the working directory."""
    here = Path(__file__).resolve().parents[2]
    if (here / "pyproject.toml").exists() and (here / "notebooks").is_dir():
        return here
    return Path.cwd()


def output_dir(*parts: str) -> Path:
    """outputs/ (or $KVKIT_OUTPUT_DIR) joined with parts, created on demand."""
    base = Path(os.environ.get("KVKIT_OUTPUT_DIR") or repo_root() / "outputs")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
