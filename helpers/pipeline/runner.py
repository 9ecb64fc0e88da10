"""Headless notebook runs with papermill: `run-all` (parallel, timed, never stops at a failure),
`run`, `report` (outputs/SUMMARY.md), `html` (outputs/html/) and `matrix` (every notebook on
several transformers releases: outputs/matrix/<release>/ and outputs/matrix.md).

Used by the Makefile and the end-to-end tests. Executed notebooks go to outputs/notebooks/; a
failing notebook's partially executed copy is still written there. `run-all` ends by writing
SUMMARY.md and the HTML renderings. `--notebooks 01 02` (or NOTEBOOKS="01 02") restricts it.
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


def select(keys: list[str] | None) -> list[Path]:
    """The notebooks named by keys ('01', stems, paths; commas or spaces), else all of them."""
    names = [k for key in keys or [] for k in key.replace(",", " ").split()]
    return [find_notebook(k) for k in names] if names else notebooks()


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
    if quiet:
        print(f"  started {path.stem}", flush=True)
    start = time.perf_counter()
    error = ""
    try:
        pm.execute_notebook(str(path), str(out), parameters=parameters or {}, cwd=str(repo_root()),
                            kernel_name="python3", progress_bar=False, log_output=not quiet,
                            request_save_on_cell_execute=True)
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported and the others still run
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:400]
    return RunResult(path.stem, not error, round(time.perf_counter() - start, 2), str(out), error)


def run_all(parameters: dict[str, Any] | None = None, jobs: int | None = None,
            paths: list[Path] | None = None) -> list[RunResult]:
    """Run every notebook (or `paths`), `jobs` at a time, printing progress; writes outputs/timings.json."""
    paths = list(paths or notebooks())
    jobs = jobs or max(1, min(len(paths), os.cpu_count() or 1))
    results: list[RunResult] = []
    started = time.perf_counter()
    print(f"running {len(paths)} notebooks, {jobs} at a time", flush=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, nb, parameters): nb for nb in paths}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                res = future.result()
            except Exception as exc:  # noqa: BLE001 - a crashed worker fails only its notebook
                nb = futures[future]
                res = RunResult(nb.stem, False, round(time.perf_counter() - started, 2),
                                str(output_dir("notebooks") / nb.name), f"{type(exc).__name__}: {exc}"[:400])
            results.append(res)
            status = "ok" if res.ok else f"FAILED ({res.error})"
            print(f"[{done}/{len(paths)}] {res.notebook}: {status} in {res.seconds:.1f}s "
                  f"({time.perf_counter() - started:.1f}s elapsed)", flush=True)
    results.sort(key=lambda r: r.notebook)
    timings = {"total_seconds": round(time.perf_counter() - started, 2), "jobs": jobs,
               "cpu_count": os.cpu_count(), "notebooks": [asdict(r) for r in results]}
    (output_dir() / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(f"{len(paths)} notebooks in {timings['total_seconds']:.1f}s", flush=True)
    return results


def write_outputs(stems: list[str] | None = None) -> bool:
    """outputs/html/ for the executed notebooks, then outputs/SUMMARY.md; False if any part failed."""
    from . import report

    ok = True
    try:
        written, errors = report.write_html(stems=stems)
        for err in errors:
            print(f"html: {err}", file=sys.stderr)
        ok = not errors
        print(f"html: {len(written)} file(s) in {output_dir('html')}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the summary is still written
        print(f"html failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        ok = False
    try:
        path = report.write_summary()
        print(f"summary: {path} ({len(path.read_text()):,} chars)", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"summary failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        ok = False
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("run-all", help="execute every notebook, then write SUMMARY.md and html/")
    p_all.add_argument("-j", "--jobs", type=int, default=None)
    p_all.add_argument("--notebooks", nargs="*", default=None, help="only these (default: $NOTEBOOKS, else all)")
    p_all.add_argument("--no-report", action="store_true", help="skip SUMMARY.md and html/")
    p_one = sub.add_parser("run", help="execute one notebook")
    p_one.add_argument("notebook")
    for p in (p_all, p_one):
        p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    sub.add_parser("report", help="write outputs/SUMMARY.md from the results on disk")
    sub.add_parser("html", help="render outputs/notebooks/*.ipynb to self-contained outputs/html/*.html")
    p_mx = sub.add_parser("matrix", help="run the notebooks on several transformers releases")
    p_mx.add_argument("--releases", nargs="+", default=None, help="default: $RELEASES, else 5.14.1 5.17.0 5.24.0")
    p_mx.add_argument("--notebooks", nargs="*", default=None, help="only these (default: $NOTEBOOKS, else all)")
    p_mx.add_argument("-j", "--jobs", type=int, default=None)
    p_mx.add_argument("--no-run", action="store_true", help="only rebuild matrix.md from outputs/matrix/")
    args = parser.parse_args(argv)

    if args.command == "report":
        from . import report

        path = report.write_summary()
        print(f"{path} ({len(path.read_text()):,} chars)")
        return 0
    if args.command == "html":
        from . import report

        written, errors = report.write_html()
        for path in written:
            print(path)
        for err in errors:
            print(err, file=sys.stderr)
        return 1 if errors else 0
    if args.command == "matrix":
        from . import release_matrix as rm

        releases = args.releases or os.environ.get("RELEASES", "").split() or list(rm.DEFAULT_RELEASES)
        keys = args.notebooks if args.notebooks is not None else os.environ.get("NOTEBOOKS", "").split()
        stems = [nb.stem for nb in select(keys)]
        if args.no_run:
            print(rm.write_matrix(releases=releases))
            return 0
        path, infos = rm.run_matrix(releases, stems if keys else None, args.jobs)
        print(f"matrix: {path}")
        bad = [i["release"] for i in infos if not i.get("ok") or i.get("rc") != 0]
        if bad:
            print(f"releases not installed or with failed notebooks: {', '.join(bad)}", file=sys.stderr)
        return 1 if bad else 0

    params = parse_parameters(args.parameter)
    if args.command == "run":
        res = run_one(find_notebook(args.notebook), params, quiet=False)
        print(f"{res.notebook}: {'ok' if res.ok else 'FAILED ' + res.error} in {res.seconds:.1f}s -> {res.output}")
        return 0 if res.ok else 1
    keys = args.notebooks if args.notebooks is not None else os.environ.get("NOTEBOOKS", "").split()
    results = run_all(params, args.jobs, select(keys))
    failed = [r.notebook for r in results if not r.ok]
    reported = True if args.no_report else write_outputs()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or not reported else 0


if __name__ == "__main__":
    sys.exit(main())
