"""Fresh virtual environments for the install tests. What a test takes as given (torch; torch and the pinned
transformers) is laid into the new venv from this interpreter's own installed copy: each distribution's files, as
its RECORD lists them, hard-linked into the new site-packages (copied where links cannot cross), the same files pip
unpacks from the same wheels, without unpacking them again. What a test is about is then installed by pip itself."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `names` and every one they require (no extras), each once."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(n) for n in names]
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        found[key] = metadata.distribution(req.name)
        todo += [Requirement(r) for r in found[key].requires or []]
    return list(found.values())


def _place(src: Path, dst: Path) -> None:
    """dst as a hard link to src, or a copy where the two lie on different file systems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _uninstall(site: Path, name: str) -> None:
    """The venv's own copy of `name` taken out (its setuptools, older than torch needs), as pip upgrading it does."""
    for old in metadata.distributions(path=[str(site)]):
        if canonicalize_name(old.metadata["Name"]) == canonicalize_name(name):
            files = [site / rel for rel in old.files or [] if rel.parts and rel.parts[0] != ".."]
            for f in files:
                f.unlink(missing_ok=True)
            for folder in sorted({f.parent for f in files}, key=lambda d: len(d.parts), reverse=True):
                shutil.rmtree(folder / "__pycache__", ignore_errors=True)  # what imports compiled since
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()


def lay_in(site: Path, dists: list[metadata.Distribution]) -> None:
    """Each distribution's site-packages files into `site` (its scripts, outside site-packages, are left out)."""
    for dist in dists:
        _uninstall(site, dist.metadata["Name"])
        for rel in dist.files or []:
            src = Path(dist.locate_file(rel))
            if not rel.parts or rel.parts[0] == ".." or not src.is_file():
                continue
            _place(src, site / rel)


def fresh_venv(path: Path, given: list[str], env: dict[str, str]) -> Path:
    """A new venv at `path` holding pip and `given` (names installed here, with what they require); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=env, capture_output=True)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          env=env, capture_output=True, text=True).stdout.strip()
    lay_in(Path(site), closure(given))
    return python
