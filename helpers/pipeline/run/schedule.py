"""How a recorded run is laid out on the cores: the workers' environment (OpenMP threads wait passively),
the start order (longest first, from the last run's timings.json), the floor timings.json states, and the
HTML pages rendered in the runner by one warm exporter while the kernels run."""
from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from pathlib import Path

from .execute import failure_line
from ..report.records import load_json

# The kernels' OpenMP threads sleep rather than spin while they wait (the thread count, and so every number,
# is unchanged): with two kernels (and anything else) on two cores, spinning threads steal the core the other
# kernel's threads need, which made notebook 05 up to 10x slower. An OMP_WAIT_POLICY already set is kept.
CHILD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def child_env(**extra: str) -> dict[str, str]:
    """os.environ for a notebook's worker or the warm process: CHILD_ENV where not already set, then `extra`."""
    return {**CHILD_ENV, **os.environ, **extra}


def expected_seconds(paths: list[Path], timings: Path | None) -> dict[str, float]:
    """Each notebook's expected time: its `seconds` in the last run's timings.json where that names it
    (and it finished ok), else its finding's estimate_s, else (a notebook no finding declares: tests') 5 s."""
    from ...findings import found

    rows = (load_json(timings) if timings else {}).get("notebooks") or []
    last = {row["notebook"]: float(row["seconds"]) for row in rows
            if row.get("ok") and isinstance(row.get("seconds"), (int, float))}
    static = {f.number: f.estimate_s for f in found()}
    return {nb.stem: last.get(nb.stem, static.get(nb.stem.split("_")[0], 5.0)) for nb in paths}


def longest_first(paths: list[Path], expected: dict[str, float]) -> list[Path]:
    """The start order: longest expected first, ties in notebook order (so both cores end busy)."""
    return sorted(paths, key=lambda nb: -expected.get(nb.stem, 0.0))


def floor_seconds(warm_imports_s: float | None, phases_summed: dict[str, float], cores: int) -> float:
    """The run's floor: warm imports + (experiments + HTML summed over notebooks) / cores."""
    work = phases_summed.get("experiments_s", 0.0) + phases_summed.get("html_s", 0.0)
    return round((warm_imports_s or 0.0) + work / max(1, cores), 2)


class HtmlRenderer:
    """outputs/html/ rendered in this process, one notebook at a time in a thread, by one warm nbconvert
    exporter (report.html.render_html reuses it): each page costs its rendering only, not nbconvert's
    start-up, and is rendered while the other core still runs notebooks. `html_s` joins the notebook's phases."""

    def __init__(self, out: Path) -> None:
        self.out, self.errors = out, []
        self.jobs: "queue.Queue[tuple[str, dict[str, float]] | None]" = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="kvkit-html", daemon=True)
        self.thread.start()

    def submit(self, stem: str, phases: dict[str, float]) -> None:
        self.jobs.put((stem, phases))

    def _work(self) -> None:
        with contextlib.suppress(Exception):  # the exporter's templates, loaded as the kernels start (or by page 1)
            import nbformat

            from ..report import html, summary  # noqa: F401 - environment_markdown's import (torch, via results)

            html._exporter().from_notebook_node(nbformat.v4.new_notebook(cells=[
                nbformat.v4.new_markdown_cell("# warm"), nbformat.v4.new_code_cell("1")]))
        while (job := self.jobs.get()) is not None:
            stem, phases = job
            start = time.perf_counter()
            try:
                from ..report import html

                _, errors = html.write_html(self.out, stems=[stem])
                self.errors += errors
            except Exception as exc:  # noqa: BLE001 - the summary still lists the notebook
                self.errors.append(f"{stem}: {failure_line(exc)}")
            phases["html_s"] = round(time.perf_counter() - start, 2)

    def close(self) -> None:
        """Wait for the pages already submitted."""
        self.jobs.put(None)
        self.thread.join()
        for err in self.errors:
            print(f"html: {err}", file=sys.stderr)
