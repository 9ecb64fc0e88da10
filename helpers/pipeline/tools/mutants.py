"""`make mutants`: mutation testing (mutmut) of the functions that decide verdicts, with a kill ratio per module.

SCOPE (mutant_scope.py) lists (module, function patterns, fast test files). The driver copies the kit into outputs/mutants/work
(the kvresume package's modules also at its root, work/kvresume/: mutmut imports the mutated copy from mutants/ and
names a mutant after its path, which must read as the module name the tests import, `kvresume.checks`),
writes mutmut's config there (setup.cfg [mutmut], generated from SCOPE), runs mutmut on the mutants of the
scoped functions only (mutmut's per-function test selection then runs only the listed tests that call the
function), prints killed/total per module and every survivor with its file:line and diff, and exits 1 when a
module has fewer than THRESHOLD of its mutants killed. A mutant that cannot change behaviour is marked in the
source with `# pragma: no mutate` and a one-line reason. Not part of `make test`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..paths import repo_root
from .mutant_scope import CLASS_SEP, OUT_OF_MUTANTS, PACKAGE_DIR, SCOPE, Scope, decision_scopes  # noqa: F401 - the tests' names

THRESHOLD = 0.90
KILLED = {1, 3, 36, 37, -24, 24, 152, 255}  # mutmut's exit codes for killed, timeout, caught by type check
STATUS = {0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 35: "suspicious", -11: "segfault",
          -9: "segfault", None: "not checked"}
COPY = ("helpers", "tests", "examples", "notebooks", "packages", "pyproject.toml")
# besides tests/ and the config files, what the tests read from the working directory, and the package's own tests
ALSO_COPY = ("examples", "notebooks", "packages/kvresume/tests")


def mutmut_config(scope: list[Scope]) -> str:
    """setup.cfg [mutmut] for these modules and their tests (fast tests only: -m "not e2e")."""
    tests = sorted({t for s in scope for t in s.tests})
    lines = ["[mutmut]", "source_paths =", "    helpers", "    kvresume", "only_mutate =", *(f"    {s.work_path}" for s in scope),
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args =", "    -m", "    not e2e", "    -p", "    no:cacheprovider",
             *(f"    --deselect={t}" for t in OUT_OF_MUTANTS),
             "also_copy =", *(f"    {a}" for a in ALSO_COPY), "use_setproctitle = false", "timeout_multiplier = 10.0", ""]
    return "\n".join(lines)


def prepare(root: Path, work: Path, scope: list[Scope]) -> None:
    """A fresh copy of the kit in `work` with the generated mutmut config."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPY:
        src = root / name
        (shutil.copytree(src, work / name, ignore=ignore) if src.is_dir() else shutil.copy2(src, work / name))
    shutil.copytree(root / PACKAGE_DIR / "kvresume", work / "kvresume", ignore=ignore)
    (work / "setup.cfg").write_text(mutmut_config(scope))


def run_mutmut(work: Path, scope: list[Scope]) -> int:
    """`mutmut run` on the scoped functions' mutants in `work`; mutmut's own exit status."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", KVKIT_OUTPUT_DIR=str(work / "kit-outputs"))
    mutmut = Path(sys.executable).with_name("mutmut")
    cmd = [str(mutmut), "run", "--max-children", "1", *[p for s in scope for p in s.patterns()]]
    return subprocess.run(cmd, cwd=work, env=env).returncode


def results(work: Path, s: Scope) -> dict[str, int | None]:
    """{mutant name: exit code} of the scoped functions of one module."""
    meta = work / "mutants" / (s.work_path + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {k: v for k, v in codes.items() if s.covers(k)}


def diff_of(work: Path, s: Scope, mutant: str) -> tuple[int | None, str]:
    """The line (in the original module) a mutant changes, and its diff's changed lines."""
    old = os.getcwd()
    try:
        os.chdir(work)
        from mutmut.mutation.diff_apply import get_diff_for_mutant

        diff = get_diff_for_mutant(mutant, path=Path(s.work_path))
    except Exception as exc:  # noqa: BLE001 - a survivor is still listed without its diff
        return None, f"(no diff: {type(exc).__name__}: {exc})"
    finally:
        os.chdir(old)
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    removed = [ln[1:].strip() for ln in changed if ln.startswith("-")]
    return _line_of(work / s.work_path, mutant, removed[0] if removed else ""), "\n".join(changed)


def _line_of(path: Path, mutant: str, text: str) -> int | None:
    """First line at or after the mutated function's def that reads `text`."""
    func = mutant.rpartition(".")[2].partition("__mutmut_")[0].split(CLASS_SEP)[-1].removeprefix("x_")
    lines = path.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"def {func}(")), 0)
    return next((i + 1 for i in range(start, len(lines)) if text and lines[i].strip() == text), None)


def report(work: Path, scope: list[Scope]) -> tuple[bool, list[dict[str, Any]]]:
    """Print the kill ratio per module and every survivor; whether every module reaches THRESHOLD."""
    ok, rows = True, []
    for s in scope:
        codes = results(work, s)
        killed = sum(1 for c in codes.values() if c in KILLED)
        total = len(codes)
        ratio = killed / total if total else 0.0
        passed = total > 0 and ratio >= THRESHOLD
        ok &= passed
        rows.append({"module": s.module, "killed": killed, "total": total, "ratio": round(ratio, 4)})
        print(f"{'ok  ' if passed else 'FAIL'} {s.module}: {killed}/{total} killed ({100 * ratio:.1f}%)")
        left = [(name, code, *diff_of(work, s, name)) for name, code in codes.items() if code not in KILLED]
        for name, code, line, diff in sorted(left, key=lambda x: (x[2] or 0, x[0])):
            print(f"    {STATUS.get(code, 'suspicious')}: {s.module}:{line or '?'} {name.rpartition('.')[2]}")
            print("\n".join(f"        {d}" for d in diff.splitlines()))
    return ok, rows


def select(names: list[str] | None) -> list[Scope]:
    """The SCOPE entries whose module path contains one of `names` (all when none given)."""
    if not names:
        return SCOPE
    chosen = [s for s in SCOPE if any(n in s.module for n in names)]
    if not chosen:
        raise SystemExit(f"no scoped module matches {names}; scoped: {[s.module for s in SCOPE]}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="restrict to scoped modules whose path contains these")
    args = parser.parse_args(argv)
    scope, root = select(args.modules), repo_root()
    work = root / "outputs" / "mutants" / "work"
    start = time.monotonic()
    prepare(root, work, scope)
    rc = run_mutmut(work, scope)
    if rc != 0:
        print(f"mutmut run exited {rc}", file=sys.stderr)
        return rc
    ok, rows = report(work, scope)
    elapsed = time.monotonic() - start
    (work.parent / "kill_ratios.json").write_text(json.dumps({"modules": rows, "seconds": round(elapsed)}, indent=2) + "\n")
    print(f"{'all modules' if ok else 'NOT all modules'} at >= {THRESHOLD:.0%} killed ({elapsed:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
