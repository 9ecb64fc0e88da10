"""A regular (non-editable) install, as Colab's `pip install --no-deps`, holds every package under helpers/.
Locally the kit is installed editable, so a package missing from the wheel would only show in Colab."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.pipeline.paths import repo_root

ROOT = repo_root()


def source_packages(root: Path) -> set[str]:
    """Dotted names of every folder under root/helpers holding an __init__.py."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / "helpers").rglob("__init__.py")
            if "__pycache__" not in p.parts}


def wheel_packages(names: list[str]) -> set[str]:
    """Dotted names of the packages in a wheel's member list (folders holding an __init__.py)."""
    return {".".join(Path(n).parent.parts) for n in names if Path(n).name == "__init__.py"}


def missing_packages(expected: set[str], present: set[str]) -> list[str]:
    """The expected packages a distribution lacks."""
    return sorted(expected - present)


def build_flags() -> list[str]:
    """--no-build-isolation where this environment's setuptools builds wheels by itself (70.1+), else none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = tuple(int(part) for part in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if release >= (70, 1) else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The kit's wheel, built from a copy of the tree (no build/ or egg-info left in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "helpers", src / "helpers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *build_flags(), "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, text=True)
    (built,) = (tmp / "dist").glob("kv_resume_kit-*.whl")
    return built


def test_missing_packages_names_a_dropped_subpackage():
    expected = source_packages(ROOT)
    assert {"helpers", "helpers.pipeline"} <= expected
    assert missing_packages(expected, expected - {"helpers.pipeline"}) == ["helpers.pipeline"]
    assert missing_packages(expected, expected | {"extra"}) == []


def test_wheel_holds_every_package_and_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert missing_packages(source_packages(ROOT), wheel_packages(names)) == []
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "helpers").rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(modules - set(names)) == []
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "outputs/"))]


def test_non_editable_install_imports_every_package(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    packages = sorted(source_packages(ROOT))
    code = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
            "mods = [importlib.import_module(n) for n in sys.argv[2:]]; "
            "print(all(m.__file__.startswith(sys.argv[1]) for m in mods))")
    out = subprocess.run([sys.executable, "-c", code, str(target), *packages], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def requirement_names(path: Path) -> list[str]:
    """Package names a requirements file lists (`-r` includes and comments left out)."""
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return [re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower() for line in lines if line and not line.startswith("-")]


def test_runtime_requirements_leave_torch_and_jupyter_alone():
    runtime = requirement_names(ROOT / "requirements-runtime.txt")
    assert "transformers" in runtime and [l for l in (ROOT / "requirements-runtime.txt").read_text().splitlines()
                                          if l.startswith("transformers==")]
    tools = {"torch", "torchvision", "papermill", "pytest", "pytest-xdist", "nbconvert", "nbclient", "ipykernel", "ipython",
             "jupyter", "notebook"}
    assert not [n for n in runtime if n in tools or n.startswith("jupyter")]
    full = (ROOT / "requirements.txt").read_text().splitlines()
    assert "-r requirements-runtime.txt" in full
    assert {"papermill", "pytest", "nbconvert", "ipykernel"} <= set(requirement_names(ROOT / "requirements.txt"))
    assert not set(runtime) & set(requirement_names(ROOT / "requirements.txt")), "each package is listed once"


# --------------------------------------------------------------------------- the layout of helpers/pipeline

def _module_imports(path: Path, package: str) -> set[str]:
    """The helpers.* modules a file imports (absolute names), inside functions too: an import deferred into a
    function still ties the two modules together, so it cannot hide a cycle."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            if mod.startswith("helpers"):
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("helpers"))
    return out


def _helpers_modules() -> dict[str, Path]:
    """Every module under helpers/ by dotted name (packages by their __init__)."""
    root = repo_root()
    mods = {}
    for path in sorted((root / "helpers").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def test_pipeline_is_grouped_in_packages_that_say_what_they_hold():
    pipeline = repo_root() / "helpers" / "pipeline"
    entries = sorted(p.name for p in pipeline.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 8, entries
    for pkg in (p for p in pipeline.iterdir() if p.is_dir() and p.name != "__pycache__"):
        doc = (pkg / "__init__.py").read_text()
        assert doc.startswith('"""') and "import" not in doc.split('"""')[2], f"{pkg.name}/__init__.py: a docstring, no re-exports"
    for name in ("runner.py", "report.py", "release_matrix.py"):
        assert not (pipeline / name).exists(), f"{name}: no re-export shims"


def test_helpers_modules_stay_short_and_import_no_cycle():
    mods = _helpers_modules()
    long = {n: len(p.read_text().splitlines()) for n, p in mods.items() if n.startswith("helpers.pipeline")}
    assert all(v <= 300 for v in long.values()), {n: v for n, v in long.items() if v > 300}
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in _module_imports(path, package) if m in mods and m != name}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, graph) if c]
    assert not cycles, " -> ".join(cycles[0])
