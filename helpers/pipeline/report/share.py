"""outputs/share.zip: the one file to attach to a thread (GitHub refuses .html): SUMMARY.md, the HTML
pages, the figures and the results files of the run the summary describes, run.json and timings.json, and under
repro/ the plain-transformers repro of each source the run answers (examples/repro/, read from this checkout).
Written with fixed timestamps and in sorted order, so the same run gives the same archive."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterable

from ...findings import found
from ..paths import repo_root
from .records import load_json, load_results, run_id_of, split_by_run
from .scrub import scrub_file

ARCHIVE = "share.zip"
_FIXED_TIME = (2000, 1, 1, 0, 0, 0)


def share_members(out: Path, stems: Iterable[str] | None = None) -> list[str]:
    """The paths (relative to `out`) the archive holds, for the notebooks in `stems` (all when None)."""
    wanted = set(stems) if stems is not None else None
    run_id = load_json(out / "run.json").get("run_id")
    names = [n for n in ("SUMMARY.md", "run.json") if (out / n).is_file()]
    if (out / "timings.json").is_file() and (run_id is None or run_id_of(load_json(out / "timings.json")) == run_id):
        names.append("timings.json")  # never another run's timings
    for folder, pattern in (("html", "*.html"), ("figures", "*.png"), ("results", "*.json")):
        names += [f"{folder}/{p.name}" for p in sorted((out / folder).glob(pattern))  # a figure: <stem>-<name>.png
                  if wanted is None or p.stem.split("-", 1)[0] in wanted]
    return names + repro_members(stems)


def repro_members(stems: Iterable[str] | None = None) -> list[str]:
    """repro/<file> of each repro the notebooks in `stems` declare (all when None) that this checkout holds."""
    numbers = None if stems is None else {s.split("_", 1)[0] for s in stems}
    paths = {f.repro for f in found() if f.repro and (numbers is None or f.number in numbers)}
    return [f"repro/{Path(p).name}" for p in sorted(paths, key=lambda p: Path(p).name) if (repo_root() / p).is_file()]


def _member(out: Path, name: str) -> bytes:
    """A member's bytes: a repro from examples/repro/, anything else from `out`."""
    return (repo_root() / "examples" / name if name.startswith("repro/") else out / name).read_bytes()


def write_share(out: Path, stems: Iterable[str] | None = None) -> Path:
    """Write outputs/share.zip (deflated, fixed timestamps) and return its path."""
    path = out / ARCHIVE
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in share_members(out, stems):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, _member(out, name))
    tmp.replace(path)
    return path


def current_stems(out: Path) -> set[str] | None:
    """The notebooks whose results belong to the run in run.json (None when there is no run record: all)."""
    run = load_json(out / "run.json")
    return {r["notebook"] for r in split_by_run(load_results(out), run.get("run_id"))[0]} if run else None


def finish_timings(out: Path) -> Path | None:
    """After the runner writes timings.json (after SUMMARY.md): scrub it and refresh share.zip to include it."""
    scrub_file(out / "timings.json", out)
    return write_share(out, current_stems(out)) if (out / ARCHIVE).exists() else None
