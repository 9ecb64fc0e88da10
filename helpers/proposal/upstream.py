"""`make upstream-tests`: write outputs/upstream/test_resume_contract.py and run it with pytest on each release.

The file states the resume contract, not a measurement: documented usage asserts equality with the full computation
(and that the guard passes it, changing nothing); misuse asserts a clear ValueError under the guard, and for plain
generate() is an xfail whose reason is "generate() should raise here". No expectation comes from the release it runs
on. It is rendered from the package itself: every module of packages/kvresume/kvresume embedded as text and built
into a `kvresume` package in sys.modules at the top of the file (types.ModuleType + exec, in import order, each
module in its own namespace), then the bodies of the package's contract tests (packages/kvresume/tests), imports
unchanged: torch, transformers and pytest only. `--releases 5.14.1 5.24.0` runs it with each release's python as
well (.venv-tf/<release>, helpers.pipeline.releases.envs).

    python -m helpers.proposal.upstream [--releases R ...]
"""
from __future__ import annotations

import argparse
import ast
import graphlib
import os
import subprocess
import sys
from pathlib import Path

from ..pipeline.paths import output_dir

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "kvresume"
FILE_NAME = "test_resume_contract.py"
TESTS = ("test_contract.py", "test_ledger_contract.py")
HEAD = ('"""The KV-cache resume contract of generate(), as tests (written by kv-resume-kit, `make upstream-tests`).\n\n'
        'Documented usage equals the full computation and passes the proposed resume guard unchanged; misuse raises a '
        'clear\nValueError under the guard, and plain generate() is expected to raise too (xfail: "generate() should '
        'raise here").\nNeeds torch, transformers and pytest only: the guard (the `kvresume` package) is embedded below '
        'and built\ninto sys.modules before the tests import it.\n"""\nfrom __future__ import annotations\n\n'
        'import sys\nimport types\n')
BUILD = '''

def _build_kvresume() -> None:
    """The embedded `kvresume` package in sys.modules: each module exec'd in its own namespace, in import order."""
    package = types.ModuleType("kvresume")
    package.__path__, package.__package__ = [], "kvresume"
    sys.modules["kvresume"] = package
    for name, source in _KVRESUME.items():
        module = package if name == "__init__" else types.ModuleType(f"kvresume.{name}")
        module.__package__, module.__file__ = "kvresume", f"<kvresume/{name}.py>"
        sys.modules[module.__name__] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        if module is not package:
            setattr(package, name, module)


_build_kvresume()
'''


def _local_imports(source: str) -> set[str]:
    """The package modules a module imports (`from . import x`, `from .x import ...`)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return out


def import_order() -> list[str]:
    """The package's module names, each after the modules it imports (`__init__` last; a cycle: graphlib.CycleError)."""
    sources = {p.stem: p.read_text() for p in sorted((PACKAGE / "kvresume").glob("*.py"))}
    needs = {name: _local_imports(text) - {name} for name, text in sources.items()}
    needs["__init__"] = set(sources) - {"__init__"}
    return list(graphlib.TopologicalSorter(needs).static_order())


def _literal(text: str) -> str:
    """`text` as a raw triple-quoted literal that reads back exactly (checked)."""
    literal = "r'''" + text + "'''"
    if "'''" in text or text.endswith("\\") or ast.literal_eval(literal) != text:
        raise ValueError("a module's source cannot be embedded as a raw ''' literal")
    return literal


def _embedded() -> str:
    """`_KVRESUME = {module name: source}` in import order."""
    items = "".join(f"    {name!r}: {_literal((PACKAGE / 'kvresume' / f'{name}.py').read_text())},\n"
                    for name in import_order())
    return "\n\n# --- the kvresume package (packages/kvresume/kvresume), embedded " + "-" * 52 + "\n_KVRESUME = {\n" \
        + items + "}\n" + BUILD


def _test_body(name: str) -> str:
    """A package test file after its docstring, without its `from __future__` line (the file has one at the top)."""
    text = (PACKAGE / "tests" / name).read_text()
    tree = ast.parse(text)
    start = tree.body[0].end_lineno if isinstance(tree.body[0], ast.Expr) else 0
    lines = [ln for ln in text.splitlines()[start:] if ln != "from __future__ import annotations"]
    label = f"tests/{name}"
    return f"\n\n# --- {label} " + "-" * (100 - len(label)) + "\n" + "\n".join(lines).strip("\n") + "\n"


def render() -> str:
    """The standalone test file."""
    return HEAD + _embedded() + "".join(_test_body(name) for name in TESTS)


def _release_python(release: str) -> str:
    from ..pipeline.releases import envs

    env = envs.ensure_env(release)
    if not env.ok or not env.python:
        raise SystemExit(f"transformers {release}: no environment ({env.reason})")
    return str(env.python)


def pytest_command(python: str, path: Path) -> list[str]:
    """pytest on the file alone: no ini file, no cache, no plugins' config from the kit."""
    return [python, "-m", "pytest", "-q", "-rxX", "-p", "no:cacheprovider", "-p", "no:xdist", "-c", os.devnull,
            "--rootdir", str(path.parent), str(path)]


def main(argv: list[str] | None = None) -> int:
    """Write the file, run it with pytest on this release and every one asked for."""
    ap = argparse.ArgumentParser(prog="python -m helpers.proposal.upstream", description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", nargs="*", default=[])
    args = ap.parse_args(argv)
    import transformers

    path = output_dir("upstream") / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path.name}")
    pythons = {transformers.__version__: sys.executable}
    pythons |= {release: _release_python(release) for release in args.releases if release not in pythons}
    failed = []
    for release, python in pythons.items():
        print(f"pytest on transformers {release}:", flush=True)
        if subprocess.run(pytest_command(python, path), cwd=path.parent).returncode != 0:
            failed.append(release)
    if failed:
        print(f"failed on: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
