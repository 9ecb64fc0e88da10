"""Headless notebook runs with papermill: `run-all` (parallel, timed, never stops at a failure) and `run`.

Used by the Makefile and the end-to-end tests. Executed notebooks go to outputs/notebooks/; a
failing notebook's partially executed copy is still written there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .paths import output_dir, repo_root


@dataclass
class RunResult:
    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str = ""


def notebooks(root: Path | None = None) -> list[Path]:
    """Every source notebook in notebooks/, in order."""
    return sorted((root or repo_root()).joinpath("notebooks").glob("[0-9]*.ipynb"))


def find_notebook(key: str) -> Path:
    """'02', '02_mask_position_matrix' or a path -> the notebook file."""
    path = Path(key)
    if path.suffix == ".ipynb" and path.exists():
        return path
    matches = [nb for nb in notebooks() if nb.stem == key or nb.stem.split("_")[0] == key.zfill(2) or nb.stem.startswith(key)]
    if len(matches) != 1:
        raise SystemExit(f"no single notebook matches {key!r}; have: {[nb.stem for nb in notebooks()]}")
    return matches[0]


def parse_parameters(pairs: list[list[str]] | None) -> dict[str, Any]:
    """papermill-style `-p name value` pairs; values parsed as JSON where they parse, else kept as text."""
    params: dict[str, Any] = {}
    for name, value in pairs or []:
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def run_one(path: Path, parameters: dict[str, Any] | None = None, quiet: bool = True) -> RunResult:
    """Execute one notebook with papermill into outputs/notebooks/; failures are returned, not raised."""
    import papermill as pm

    out = output_dir("notebooks") / path.name
    start = time.perf_counter()
    error = ""
    try:
        pm.execute_notebook(str(path), str(out), parameters=parameters or {}, cwd=str(repo_root()),
                            kernel_name="python3", progress_bar=False, log_output=not quiet,
                            request_save_on_cell_execute=True)
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported and the others still run
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:400]
    return RunResult(path.stem, not error, round(time.perf_counter() - start, 2), str(out), error)


def run_all(parameters: dict[str, Any] | None = None, jobs: int | None = None) -> list[RunResult]:
    """Run every notebook, `jobs` at a time, printing progress; writes outputs/timings.json."""
    paths = notebooks()
    jobs = jobs or max(1, min(len(paths), os.cpu_count() or 1))
    results: list[RunResult] = []
    started = time.perf_counter()
    print(f"running {len(paths)} notebooks, {jobs} at a time", flush=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, nb, parameters): nb for nb in paths}
        for done, future in enumerate(as_completed(futures), 1):
            res = future.result()
            results.append(res)
            status = "ok" if res.ok else f"FAILED ({res.error})"
            print(f"[{done}/{len(paths)}] {res.notebook}: {status} in {res.seconds:.1f}s", flush=True)
    results.sort(key=lambda r: r.notebook)
    timings = {"total_seconds": round(time.perf_counter() - started, 2), "jobs": jobs,
               "notebooks": [asdict(r) for r in results]}
    (output_dir() / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("run-all", help="execute every notebook")
    p_all.add_argument("-j", "--jobs", type=int, default=None)
    p_one = sub.add_parser("run", help="execute one notebook")
    p_one.add_argument("notebook")
    for p in (p_all, p_one):
        p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    args = parser.parse_args(argv)
    params = parse_parameters(args.parameter)
    if args.command == "run":
        res = run_one(find_notebook(args.notebook), params, quiet=False)
        print(f"{res.notebook}: {'ok' if res.ok else 'FAILED ' + res.error} in {res.seconds:.1f}s -> {res.output}")
        return 0 if res.ok else 1
    results = run_all(params, args.jobs)
    failed = [r.notebook for r in results if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
