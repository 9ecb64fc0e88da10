"""`make upstream-tests`: write outputs/upstream/test_resume_contract.py and run it with pytest on each release.

The file states the resume contract, not a measurement: documented usage asserts equality with the full computation
(and that the guard passes it, changing nothing); misuse asserts a clear ValueError under the guard, and for plain
generate() is an xfail whose reason is "generate() should raise here". No expectation comes from the release it runs
on. It is the guard (upstream_shim, call, newimage/guardcheck, new_vision_tokens, checks, guard) + upstream_cases +
upstream_contract, relative imports dropped: torch, transformers and pytest only. `--releases 5.14.1 5.24.0` runs it with each release's python as well
(.venv-tf/<release>, helpers.pipeline.matrix.envs).

    python -m helpers.api.upstream [--releases R ...] [--out PATH] [--no-run]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from ..pipeline.paths import output_dir

HERE = Path(__file__).resolve().parent
FILE_NAME = "test_resume_contract.py"
MODULES = ("upstream_shim.py", "ledger.py", "linear_checks.py", "tracking.py", "call.py", "../newimage/guardcheck.py", "new_vision_tokens.py",
           "ledger_checks.py", "checks.py", "guard.py",
           "../../packages/kvresume/kvresume/testing.py", "upstream_contract.py", "upstream_ledger.py")
HEAD = ('"""The KV-cache resume contract of generate(), as tests (written by kv-resume-kit, `make upstream-tests`).\n\n'
        'Documented usage equals the full computation and passes the proposed resume guard unchanged; misuse raises a '
        'clear\nValueError under the guard, and plain generate() is expected to raise too (xfail: "generate() should '
        'raise here").\nNeeds torch, transformers and pytest only.\n"""\nfrom __future__ import annotations\n')


def _body(name: str) -> str:
    """A module's text after its docstring, without the lines marked `# upstream: drop` (its relative imports)."""
    text = (HERE / name).read_text().split('"""', 2)[2]
    lines = [line for line in text.splitlines() if not line.endswith("# upstream: drop")]
    label = name.removeprefix("../")
    return f"\n# --- {label} " + "-" * (100 - len(label)) + "\n" + "\n".join(lines).strip("\n") + "\n"


def render() -> str:
    """The standalone test file."""
    return HEAD + "\n".join(_body(name) for name in MODULES)


def _release_python(release: str) -> str:
    from ..pipeline.matrix import envs

    env = envs.ensure_env(release)
    if not env.ok or not env.python:
        raise SystemExit(f"transformers {release}: no environment ({env.reason})")
    return str(env.python)


def main(argv: list[str] | None = None) -> int:
    """Write the file, run it with pytest on this release and every one asked for."""
    ap = argparse.ArgumentParser(prog="python -m helpers.api.upstream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", nargs="*", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-run", action="store_true")
    args = ap.parse_args(argv)
    import transformers

    path = Path(args.out) if args.out else output_dir("upstream") / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path.name}")
    pythons = {transformers.__version__: sys.executable}
    for release in args.releases:
        if release not in pythons:
            pythons[release] = _release_python(release)
    failed = []
    for release, python in ([] if args.no_run else pythons.items()):
        print(f"pytest on transformers {release}:", flush=True)
        code = subprocess.run([python, "-m", "pytest", "-q", "-rxX", "-p", "no:cacheprovider", "-c", os.devnull,
                               "--rootdir", str(path.parent), str(path)], cwd=path.parent).returncode
        if code != 0:
            failed.append(release)
    if failed:
        print(f"failed on: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
