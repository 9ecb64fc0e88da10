"""Release environments: Each release gets its own small virtual environment, .venv-tf/<release>, that shares everything
else with the environment running this code (torch above all: it is never downloaded again). It
holds only transformers==<release> and whichever of its dependencies (tokenizers,
huggingface-hub, ...) the shared ones do not satisfy. A `.pth` file in it adds the shared
site-packages (and through them this kit's editable install) after its own. The pinned release
reuses the running environment itself. Environments are kept and reused on the next run. Where wheels/
(`make gpu-wheels`) holds the release's transformers wheel, pip installs from it alone (--no-index), for
machines without network.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from ..paths import repo_root

STAMP = ".kvkit-ready"
# pip's resolver installs transformers==<release> and those of its dependencies the shared site-packages do not meet
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input", "install", "--no-compile", "-q"]

# Run inside a release environment: the versions it imports, after importing the modules named in argv.
_PROBE = r"""
import importlib, json, sys, importlib.metadata as m
for name in sys.argv[1:]:
    importlib.import_module(name)
import torch, transformers, helpers
out = {"python_executable": sys.executable, "transformers": transformers.__version__,
       "torch": torch.__version__, "helpers": helpers.__file__, "transformers_file": transformers.__file__}
for name in ("tokenizers", "huggingface-hub", "safetensors"):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""
# What a release environment must import: to run notebooks (the matrix, bisect), or only gpu-check's GPU arms
# (python -m helpers.offload.gpu: no jupyter).
NOTEBOOK_MODULES = ("papermill", "nbconvert")
GPU_MODULES = ("pandas", "matplotlib")


@dataclass
class ReleaseEnv:
    release: str
    ok: bool
    python: str | None = None
    reason: str = ""
    versions: dict[str, Any] = field(default_factory=dict)
    installed: list[str] = field(default_factory=list)
    reused: bool = False
    seconds: float = 0.0


def pinned_release() -> str | None:
    """The transformers version requirements-runtime.txt pins (requirements.txt includes it)."""
    path = repo_root() / "requirements-runtime.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    pins = [ln.split("==", 1)[1].split("#")[0].strip() for ln in lines if ln.strip().startswith("transformers==")]
    return pins[0] if pins else None


def venvs_dir() -> Path:
    return Path(os.environ.get("KVKIT_RELEASE_VENVS") or repo_root() / ".venv-tf")


def wheels_dir() -> Path:
    """wheels/ of the checkout (KVKIT_WHEELS moves it): the wheels `make gpu-wheels` downloaded, for machines without network."""
    return Path(os.environ.get("KVKIT_WHEELS") or repo_root() / "wheels")


def wheel_args(release: str) -> list[str]:
    """pip's options to install `release` offline from wheels/ when it holds that transformers wheel, else none."""
    folder = wheels_dir()
    return ["--no-index", "--find-links", str(folder)] if any(folder.glob(f"transformers-{release}-*.whl")) else []


def shared_site_packages() -> list[str]:
    """This environment's site-packages folders: its own, then the system's and the user's it also imports from."""
    paths, user = sysconfig.get_paths(), [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    extra = [p for p in [*site.getsitepackages(), *user] if p in sys.path and os.path.isdir(p)]
    return list(dict.fromkeys([paths["purelib"], paths["platlib"], *extra]))


def _tail(text: str, n: int = 300) -> str:
    """What a failed command said, in one short line: pip's last `ERROR:` line, else its last error lines."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    if pip_errors := [ln.strip() for ln in lines if ln.lstrip().startswith("ERROR:")]:
        return pip_errors[-1][:n]
    errors = [ln for ln in lines if "ERROR" in ln or "Error" in ln]
    return " ".join((errors or lines)[-2:])[-n:]


def child_env(out: Path | None = None) -> dict[str, str]:
    """This process's environment for another release's python: without this venv's path variables, with
    PYTHONPATH=the checkout (helpers imports from it where the kit is not installed), and with
    KVKIT_OUTPUT_DIR=`out` where given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(repo_root())
    if out is not None:
        env["KVKIT_OUTPUT_DIR"] = str(out)
    return env


def _run(cmd: Sequence[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=str(repo_root()))


def _probe(python: str, modules: Sequence[str] = NOTEBOOK_MODULES) -> dict[str, Any]:
    res = _run([python, "-c", _PROBE, *modules], timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"import failed: {_tail(res.stderr)}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check_probe(release: str, versions: dict[str, Any]) -> str:
    if versions.get("transformers") != release:
        return f"imports transformers {versions.get('transformers')} instead of {release}"
    if not str(versions.get("helpers", "")).startswith(str(repo_root())):
        return f"imports helpers from {versions.get('helpers')}, not this checkout"
    return ""


def ensure_env(release: str, log=print, modules: Sequence[str] = NOTEBOOK_MODULES) -> ReleaseEnv:
    """The python to run `release` under, creating .venv-tf/<release> if needed, that imports `modules` besides
    torch, transformers and helpers (never raises). pip installs from wheels/ alone when it holds the release."""
    from packaging.version import InvalidVersion, Version

    from ..run.record import _version

    start = time.perf_counter()
    env = ReleaseEnv(release, ok=False)
    try:
        Version(release)
        if _version("transformers") == release:  # the pinned release: the running environment itself
            env.python, env.reused = sys.executable, True
        else:
            venvs_dir().mkdir(parents=True, exist_ok=True)
            with open(venvs_dir() / f"{release}.lock", "w") as lock:  # one build per release at a time
                fcntl.flock(lock, fcntl.LOCK_EX)
                _build_env(release, env, log, modules)
        env.versions = env.versions or _probe(env.python, modules)
        env.reason = _check_probe(release, env.versions)
    except InvalidVersion:
        env.reason = f"{release!r} is not a version number"
    except Exception as exc:  # noqa: BLE001 - reported in the release's column
        env.reason = env.reason or f"{type(exc).__name__}: {exc}"[:400]
    env.ok = not env.reason
    env.seconds = round(time.perf_counter() - start, 1)
    return env


def _link_jupyter_data(path: Path) -> None:
    """share/jupyter (nbconvert templates, kernelspecs) of the shared environment, linked in:
    jupyter looks for it under sys.prefix, which is the release environment's own."""
    shared = Path(sys.prefix) / "share" / "jupyter"
    link = path / "share" / "jupyter"
    if shared.is_dir() and not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)  # a dangling link
        link.symlink_to(shared, target_is_directory=True)


def _build_env(release: str, env: ReleaseEnv, log, modules: Sequence[str] = NOTEBOOK_MODULES) -> None:
    """.venv-tf/<release>: reused where its stamp names the same shared site-packages and it imports, else built."""
    path = venvs_dir() / release
    python = path / "bin" / "python"
    shared = shared_site_packages()
    stamp = path / STAMP
    if stamp.exists() and python.exists():
        with contextlib.suppress(Exception):  # a broken environment is rebuilt
            recorded = json.loads(stamp.read_text())
            versions = _probe(str(python), modules) if recorded.get("shared") == shared else {}
            if versions and not _check_probe(release, versions):
                _link_jupyter_data(path)
                env.python, env.reused, env.installed, env.versions = str(python), True, recorded["installed"], versions
                return
    log(f"[matrix] creating {path} for transformers {release}", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    res = _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    if res.returncode != 0:
        raise RuntimeError(f"venv creation failed: {_tail(res.stderr)}")
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    site.joinpath("_kvkit_shared.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in shared))
    _link_jupyter_data(path)
    offline = wheel_args(release)
    if offline:
        log(f"[matrix] {release}: installing from {wheels_dir().name}/ only (no index)", flush=True)
    res = _run([str(python), *PIP, *offline, f"transformers=={release}"])
    if res.returncode != 0:
        hint = f" (offline from {wheels_dir().name}/: add it with `make gpu-wheels`)" if offline else ""
        env.reason = f"pip could not install transformers=={release}{hint}: {_tail(res.stderr or res.stdout)}"
        raise RuntimeError(env.reason)
    env.installed = sorted((f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions(path=[str(site)])),
                           key=lambda name: (not name.startswith("transformers=="), name))
    stamp.write_text(json.dumps({"release": release, "shared": shared, "installed": env.installed}) + "\n")
    env.python = str(python)
