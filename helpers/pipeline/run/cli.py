"""The command line of the headless notebook runs: `run-all` (parallel, timed, never stops at a failure), `run` (one notebook),
`report` (outputs/html/, SUMMARY.md, share.zip) and `matrix` (every notebook on several
transformers releases: outputs/matrix/<release>/ and outputs/matrix.md).

Every run-all / run / matrix is one recorded run (outputs/run.json, see record.py). A run-all first
removes the outputs of earlier runs; a run removes its notebook's. Parameters (`-p NAME VALUE`) are
checked against each notebook's `parameters` cell before any kernel starts (params.py). Each notebook
runs in a worker process of its own (`_exec`, its own session; forked from the warm process below, else
started fresh), so Ctrl-C or SIGTERM stops the
run within seconds: no further notebook starts, kernels are shut down, unfinished notebooks are
recorded as interrupted, and the summary says so. `--notebooks 01 02` (or NOTEBOOKS="01 02")
restricts a run-all. Kernels are forked from one warm process that imported torch, transformers and
the helpers once (see "warm kernels" below; KVKIT_WARM_KERNELS=0 starts plain ipykernels instead).
timings.json says where the time went: per notebook kernel_start_s (until the first cell ran: the
warm process's imports for the first notebooks), imports_s, model_build_s, experiments_s, html_s.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from . import params as params_mod
from . import record as rec
from .execute import _exec_main, find_notebook, notebooks, parse_parameters, select
from ..paths import output_dir
from ..report.records import load_json
from .procs import Stop
from .batch import Run
from .warm import _zygote_main


def _recorded(command: str, paths: list[Path], pairs: list[list[str]] | None, jobs: int | None,
              report: bool) -> int:
    """run-all / run: check parameters (one line, exit 2), run, summarise; 130/143 when interrupted."""
    given = parse_parameters(pairs)
    try:
        per_notebook = params_mod.check(paths, given)
    except params_mod.ParameterError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    run = Run(command, paths, per_notebook, given, jobs)
    signum = run.execute(report=report)
    if signum is not None:
        counts = Counter(n["status"] for n in run.record.data["notebooks"].values())
        print(f"interrupted: {counts['ok'] + counts['failed']} finished, {counts['interrupted']} interrupted, "
              f"{counts['not_started']} not started; run.json and SUMMARY.md say so", file=sys.stderr)
        return 128 + signum
    failed = [r.notebook for r in run.results.values() if not r.ok]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _fold_release(record: rec.RunRecord, release: str, info: dict[str, Any], sub: dict[str, Any]) -> None:
    """One release's run-all into the matrix's record: a notebook keeps its first status that is not ok."""
    record.data["releases"][release] = {"run_id": sub.get("run_id"), "rc": info.get("rc"), "status": sub.get("status")
                                        or ("not_installed" if not info.get("ok") else "failed")}
    for stem, nb in (sub.get("notebooks") or {}).items():
        mine = record.data["notebooks"].setdefault(stem, {"status": "ok", "seconds": 0.0, "error": None,
                                                          "parameters": {}})
        if mine["status"] in ("ok", "not_started") and nb.get("status") != "ok":
            mine.update(status=nb.get("status"), error=f"{release}: {nb.get('error')}")
        elif mine["status"] == "not_started":
            mine["status"] = "ok"
        mine["seconds"] = round((mine.get("seconds") or 0.0) + (nb.get("seconds") or 0.0), 2)
    record.write()


def _matrix(releases: list[str], stems: list[str] | None, jobs: int | None) -> int:
    """Every release in turn, as one recorded run (outputs/matrix/run.json); each release's run-all
    records itself in outputs/matrix/<release>/run.json with this matrix's id as KVKIT_MATRIX_RUN_ID."""
    from tqdm import tqdm

    from ..releases import report as matrix_report
    from ..releases import run as matrix_run

    out_base = output_dir()
    record = rec.RunRecord(output_dir("matrix"), "matrix", {"releases": releases},
                           {s: {} for s in stems or [nb.stem for nb in notebooks()]})
    record.data["environment"]["transformers"], record.data["releases"] = list(releases), {}
    os.environ["KVKIT_MATRIX_RUN_ID"] = record.run_id
    bad = []
    with Stop(forward=True) as stop:
        for release in tqdm(releases, desc="releases", unit="release", disable=None, file=sys.stderr):
            if stop.signum is not None:
                break
            info = matrix_run.run_release(release, out_base, stems, jobs, log=lambda *a, **k: tqdm.write(" ".join(map(str, a))))
            bad += [release] if not info.get("ok") or info.get("rc") != 0 else []
            _fold_release(record, release, info, load_json(out_base / "matrix" / release / "run.json"))
        record.finish("interrupted" if stop.signum is not None else "failed" if bad else "complete")
        path = matrix_report.write_matrix(out_base, releases)  # after finish: matrix.md shows the final status
    print(f"matrix: {path.name}")
    if bad and stop.signum is None:
        print(f"releases not installed or with failed notebooks: {', '.join(bad)}", file=sys.stderr)
    return 128 + stop.signum if stop.signum is not None else 1 if bad else 0


def _share(jobs: int | None) -> int:
    """`make share`: the run-all on the pinned release, the newest release through the matrix runner, the report."""
    from ..releases import share

    info = share.resolve()
    print(f"share: pinned {info['pinned']}, newest {info['newest']} ({info['resolved']})", flush=True)
    rc = _recorded("share", select([]), None, jobs, False)
    share.write_releases(output_dir(), info)  # after the run-all, which removes the previous one's
    if info["newest"] != info["pinned"]:
        rc = _matrix([info["newest"]], None, jobs) or rc
        share.bisect_changed(output_dir(), info)  # the first release where a key claim changed, with the source diff
    return _report() or rc  # the pages again, now that every notebook's results are there (each ask reads them all)


def _report() -> int:
    """outputs/html/, then SUMMARY.md and share.zip, from what is on disk; 1 where a page could not be rendered."""
    from ..report import html, summary

    written, errors = html.write_html()
    print("".join(f"html/{path.name}\n" for path in written), end="")
    print("".join(f"{err}\n" for err in errors), end="", file=sys.stderr)
    text = summary.write_summary().read_text()
    print(f"SUMMARY.md ({len(text):,} chars; first screen {len(summary.first_screen_of(text)):,})")
    return 1 if errors else 0


def _parser() -> argparse.ArgumentParser:
    """The subcommands and their options (-j, --notebooks, --no-report and -p shared where they apply)."""
    parser = argparse.ArgumentParser(prog="kvkit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    jobs, some, report, param = (argparse.ArgumentParser(add_help=False) for _ in range(4))
    jobs.add_argument("-j", "--jobs", type=int, default=None)
    some.add_argument("--notebooks", nargs="*", default=os.environ.get("NOTEBOOKS", "").split(),
                      help="only these (default: $NOTEBOOKS, else all)")
    report.add_argument("--no-report", action="store_true", help="skip SUMMARY.md")
    param.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    sub.add_parser("run-all", parents=[jobs, some, report, param],
                   help="execute every notebook, then write SUMMARY.md and html/")
    one = sub.add_parser("run", parents=[report, param],
                         help="execute one notebook (its outputs replace its earlier ones), then SUMMARY.md")
    one.add_argument("notebook")
    sub.add_parser("report", help="render outputs/html/, then write SUMMARY.md and share.zip, from what is on disk")
    sub.add_parser("share", parents=[jobs],
                   help="run-all on the pinned release, the newest release via the matrix, SUMMARY.md")
    p_mx = sub.add_parser("matrix", parents=[jobs, some], help="run the notebooks on several transformers releases")
    p_mx.add_argument("--releases", nargs="+", default=os.environ.get("RELEASES", "").split(),
                      help="default: $RELEASES, else matrix.report.DEFAULT_RELEASES")
    p_mx.add_argument("--no-run", action="store_true", help="only rebuild matrix.md from outputs/matrix/")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; `_exec` and `_zygote` are the runner's own child processes."""
    argv = sys.argv[1:] if argv is None else argv
    children = {"_exec": _exec_main, "_zygote": _zygote_main}
    if argv[:1] and argv[0] in children:
        return children[argv[0]](argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "report":
        return _report()
    if args.command == "matrix":
        from ..releases import report as matrix_report

        releases = args.releases or list(matrix_report.DEFAULT_RELEASES)
        if args.no_run:
            print(matrix_report.write_matrix(releases=releases))
            return 0
        return _matrix(releases, [nb.stem for nb in select(args.notebooks)] if args.notebooks else None, args.jobs)
    if args.command == "share":
        return _share(args.jobs)
    if args.command == "run":
        return _recorded("run", [find_notebook(args.notebook)], args.parameter, 1, not args.no_report)
    return _recorded("run-all", select(args.notebooks), args.parameter, args.jobs, not args.no_report)
