"""`make upstream-tests`: write outputs/upstream/test_resume_equivalence.py and run it with pytest.

The file is upstream_cases.py + upstream_suite.py (torch and transformers only) + a pytest footer. Each case asserts
the equivalence the control asks for (`matches`); a case measured otherwise on a release is marked `xfail` with what
was measured (strict on that release). `--releases 5.14.1 5.24.0` measures those too, each in its .venv-tf/<release>
(helpers.pipeline.matrix.envs), and runs the file with each release's python as well as this one.

    python -m helpers.api.upstream [--releases R ...] [--out PATH] [--no-run]
    python -m helpers.api.upstream --measure-json      # this release's measurements as JSON (used per release)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..pipeline.paths import output_dir

HERE = Path(__file__).resolve().parent
FILE_NAME = "test_resume_equivalence.py"
FOOTER = '''

# --- expectations: measured by `make upstream-tests` (python -m helpers.api.upstream) ------------------------------
import pytest  # noqa: E402

# release -> {case: [status, detail]} for every case that did not match on that release
MEASURED = MEASURED_JSON


def expected_failure(case: str, release: str) -> tuple[bool, str] | None:
    """(strict, reason) where `case` was measured not to match: on this release (strict), else on any measured one."""
    if release in MEASURED:
        hit = MEASURED[release].get(case)
        return (True, f"measured on transformers {release}: {hit[0]} ({hit[1]})") if hit else None
    seen = [f"{r}: {m[case][0]}" for r, m in sorted(MEASURED.items()) if case in m]
    return (False, "not measured on this release; measured on " + "; ".join(seen)) if seen else None


@pytest.mark.parametrize("case", list(CASES))
def test_generation_equivalence(case, request):
    failure = expected_failure(case, transformers.__version__)
    if failure is not None:
        request.applymarker(pytest.mark.xfail(strict=failure[0], reason=failure[1]))
    status, detail = CASES[case]()
    assert status == "matches", detail
'''


def _source(name: str) -> str:
    """A module's text without the lines marked `# upstream: drop` (its relative imports)."""
    return "\n".join(line for line in (HERE / name).read_text().splitlines() if not line.endswith("# upstream: drop"))


def measure() -> dict[str, list[str]]:
    """{case: [status, detail]} of every case that did not match on the installed release."""
    from .upstream_suite import measure_all

    return {case: [status, detail] for case, (status, detail) in measure_all().items() if status != "matches"}


def render(measured: dict[str, dict[str, list[str]]]) -> str:
    """The standalone test file with these per-release measurements."""
    head = ('"""Generation-equivalence tests for resuming generate() from a KV cache (the resume-contract control\'s '
            'list),\nwritten by kv-resume-kit (`make upstream-tests`). Needs torch, transformers and pytest only.\n"""\n')
    body = _source("upstream_cases.py").split('"""', 2)[2].lstrip("\n") + "\n\n" + \
        _source("upstream_suite.py").split('"""', 2)[2].lstrip("\n")
    return head + body.rstrip("\n") + "\n" + FOOTER.replace("MEASURED_JSON", json.dumps(measured, indent=4, sort_keys=True))


def _release_python(release: str) -> str:
    from ..pipeline.matrix import envs

    env = envs.ensure_env(release)
    if not env.ok or not env.python:
        raise SystemExit(f"transformers {release}: no environment ({env.reason})")
    return str(env.python)


def _measure_with(python: str) -> tuple[str, dict[str, list[str]]]:
    out = subprocess.run([python, "-m", "helpers.api.upstream", "--measure-json"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return doc["release"], doc["measured"]


def main(argv: list[str] | None = None) -> int:
    """Measure, write the file, run it with pytest on every release measured."""
    ap = argparse.ArgumentParser(prog="python -m helpers.api.upstream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", nargs="*", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--measure-json", action="store_true")
    args = ap.parse_args(argv)
    import transformers

    if args.measure_json:
        print(json.dumps({"release": transformers.__version__, "measured": measure()}))
        return 0
    pythons = {transformers.__version__: sys.executable}
    for release in args.releases:
        if release not in pythons:
            pythons[release] = _release_python(release)
    measured: dict[str, Any] = {}
    for release, python in pythons.items():
        got, measured[release] = _measure_with(python)
        if got != release:
            raise SystemExit(f"{python} runs transformers {got}, not {release}")
        print(f"measured on {release}: {len(measured[release])} case(s) not matching: {sorted(measured[release])}")
    path = Path(args.out) if args.out else output_dir("upstream") / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(measured))
    print(f"wrote {path.name} ({len(measured)} release(s))")
    failed = 0
    for release, python in ([] if args.no_run else pythons.items()):
        print(f"pytest on transformers {release}:", flush=True)
        failed += subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                                  "--rootdir", str(path.parent), str(path)], cwd=path.parent).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
