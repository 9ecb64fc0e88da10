"""Every notebook on several transformers releases: outputs/matrix/<release>/ and outputs/matrix.md.

Each release gets its own small virtual environment, .venv-tf/<release>, that shares everything
else with the environment running this code (torch above all: it is never downloaded again). It
holds only transformers==<release> and whichever of its dependencies (tokenizers,
huggingface-hub, ...) the shared ones do not satisfy. A `.pth` file in it adds the shared
site-packages (and through them this kit's editable install) after its own. The pinned release
reuses the running environment itself. Environments are kept and reused on the next run.

The notebooks then run under that environment's python (`python -m helpers.pipeline.runner run-all`, so
papermill's kernel is that python too) with KVKIT_OUTPUT_DIR=outputs/matrix/<release>.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Sequence

from .paths import output_dir, repo_root
from .report import RUN_STATUS, VERDICT_MARK, cell, commit_text, fmt_value, load_run, scrub, truncate

DEFAULT_RELEASES = ("5.14.1", "5.17.0", "5.19.0", "5.20.0", "5.24.0")
STAMP = ".kvkit-ready"
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input", "install", "--no-deps", "--no-compile", "-q"]

# Run inside a release environment: requirements of the named distributions that are not met.
_UNMET = r"""
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
unmet = []
for name in sys.argv[1:]:
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or (req.specifier and not req.specifier.contains(have, prereleases=True)):
            unmet.append({"name": req.name, "requirement": f"{req.name}{req.specifier}", "have": have, "by": name})
print(json.dumps(unmet))
"""

_PROBE = r"""
import json, importlib.metadata as m
import torch, transformers, helpers, papermill, nbconvert
out = {"python_executable": __import__("sys").executable, "transformers": transformers.__version__,
       "torch": torch.__version__, "helpers": helpers.__file__, "transformers_file": transformers.__file__}
for name in ("tokenizers", "huggingface-hub", "safetensors"):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


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
    for name in ("requirements-runtime.txt", "requirements.txt"):
        try:
            for line in (repo_root() / name).read_text().splitlines():
                if line.strip().startswith("transformers=="):
                    return line.split("==", 1)[1].split("#")[0].strip()
        except OSError:
            pass
    return None


def venvs_dir() -> Path:
    return Path(os.environ.get("KVKIT_RELEASE_VENVS") or repo_root() / ".venv-tf")


def shared_site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def _tail(text: str, n: int = 300) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "ERROR" in ln or "Error" in ln]
    return " ".join((errors or lines)[-2:])[-n:]


def _run(cmd: Sequence[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)


def _probe(python: str) -> dict[str, Any]:
    res = _run([python, "-c", _PROBE], timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"import failed: {_tail(res.stderr)}")
    return json.loads(res.stdout.strip().splitlines()[-1])


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_probe(release: str, versions: dict[str, Any]) -> str:
    if versions.get("transformers") != release:
        return f"imports transformers {versions.get('transformers')} instead of {release}"
    if not str(versions.get("helpers", "")).startswith(str(repo_root())):
        return f"imports helpers from {versions.get('helpers')}, not this checkout"
    return ""


def ensure_env(release: str, log=print) -> ReleaseEnv:
    """The python to run `release` under, creating .venv-tf/<release> if needed (never raises)."""
    from packaging.version import InvalidVersion, Version

    start = time.perf_counter()
    env = ReleaseEnv(release, ok=False)
    try:
        Version(release)
    except InvalidVersion:
        env.reason = f"{release!r} is not a version number"
        return env
    try:
        current = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        current = None
    if current == release:  # the pinned release: the running environment itself
        env.python, env.reused = sys.executable, True
    else:
        try:
            with _lock(venvs_dir() / f"{release}.lock"):
                _build_env(release, env, log)
        except Exception as exc:  # noqa: BLE001 - reported in the release's column
            env.reason = env.reason or f"{type(exc).__name__}: {exc}"[:400]
            env.ok = False
            env.seconds = round(time.perf_counter() - start, 1)
            return env
    try:
        env.versions = _probe(env.python)
        env.reason = _check_probe(release, env.versions)
    except Exception as exc:  # noqa: BLE001
        env.reason = f"{type(exc).__name__}: {exc}"[:400]
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


def _build_env(release: str, env: ReleaseEnv, log) -> None:
    path = venvs_dir() / release
    python = path / "bin" / "python"
    shared = shared_site_packages()
    stamp = path / STAMP
    if stamp.exists() and python.exists():
        try:
            recorded = json.loads(stamp.read_text())
            if recorded.get("shared") == shared and not _check_probe(release, _probe(str(python))):
                _link_jupyter_data(path)
                env.python, env.reused, env.installed = str(python), True, recorded.get("installed", [])
                return
        except Exception:  # noqa: BLE001 - a broken environment is rebuilt
            pass
    log(f"[matrix] creating {path} for transformers {release}", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    res = _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    if res.returncode != 0:
        raise RuntimeError(f"venv creation failed: {_tail(res.stderr)}")
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    site.joinpath("_kvkit_shared.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in shared))
    _link_jupyter_data(path)
    wanted = [f"transformers=={release}"]
    checked = ["transformers"]
    for _ in range(5):
        res = _run([str(python), *PIP, *wanted])
        if res.returncode != 0:
            env.reason = f"pip could not install {' '.join(wanted)}: {_tail(res.stderr or res.stdout)}"
            raise RuntimeError(env.reason)
        env.installed += wanted
        res = _run([str(python), "-c", _UNMET, *checked])
        if res.returncode != 0:
            raise RuntimeError(f"dependency check failed: {_tail(res.stderr)}")
        unmet = json.loads(res.stdout.strip().splitlines()[-1])
        if not unmet:
            break
        heavy = [u for u in unmet if u["name"].lower() in ("torch", "torchvision")]
        if heavy:
            env.reason = (f"needs {heavy[0]['requirement']} (shared {heavy[0]['name']} is {heavy[0]['have']}); "
                          "torch is never downloaded per release")
            raise RuntimeError(env.reason)
        wanted = sorted({u["requirement"] for u in unmet})
        checked = sorted({u["name"] for u in unmet})
        log(f"[matrix] {release}: installing {' '.join(wanted)} (shared: "
            + ", ".join(f"{u['name']} {u['have']}" for u in unmet) + ")", flush=True)
    else:
        raise RuntimeError(f"dependencies still unmet after 5 rounds: {unmet}")
    stamp.write_text(json.dumps({"release": release, "shared": shared, "installed": env.installed}) + "\n")
    env.python = str(python)


# --------------------------------------------------------------------------- running

def run_release(release: str, out_base: Path, notebooks: Sequence[str] | None = None,
                jobs: int | None = None, log=print) -> dict[str, Any]:
    """Install (or reuse) the release's environment and run the notebooks under it."""
    dest = out_base / "matrix" / release
    for sub in ("results", "notebooks", "figures", "html"):
        shutil.rmtree(dest / sub, ignore_errors=True)
    for name in ("SUMMARY.md", "timings.json", "release.json"):
        (dest / name).unlink(missing_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    log(f"[matrix] transformers {release}: preparing environment", flush=True)
    env = ensure_env(release, log)
    info: dict[str, Any] = {**asdict(env), "rc": None, "run_seconds": None}
    if not env.ok:
        log(f"[matrix] transformers {release}: cannot run: {env.reason}", flush=True)
    else:
        log(f"[matrix] transformers {release}: {'reusing' if env.reused else 'built'} {env.python} "
            f"({env.seconds:.0f}s); running notebooks", flush=True)
        cmd = [env.python, "-m", "helpers.pipeline.runner", "run-all"]
        if notebooks:
            cmd += ["--notebooks", *notebooks]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        child_env["KVKIT_OUTPUT_DIR"] = str(dest)
        start = time.perf_counter()
        rc = subprocess.call(cmd, cwd=str(repo_root()), env=child_env)
        info["rc"], info["run_seconds"] = rc, round(time.perf_counter() - start, 1)
        log(f"[matrix] transformers {release}: run-all exit {rc} in {info['run_seconds']:.0f}s", flush=True)
    (dest / "release.json").write_text(scrub(json.dumps(info, indent=2), out_base) + "\n")
    return info


def run_matrix(releases: Sequence[str] = DEFAULT_RELEASES, notebooks: Sequence[str] | None = None,
               jobs: int | None = None, out_base: Path | None = None, log=print) -> tuple[Path, list[dict[str, Any]]]:
    """Every release in turn (one that fails does not stop the others), then matrix.md."""
    out_base = Path(out_base) if out_base else output_dir()
    infos = [run_release(r, out_base, notebooks, jobs, log) for r in releases]
    path = write_matrix(out_base, releases)
    return path, infos


# --------------------------------------------------------------------------- matrix.md

def _load_release(out_base: Path, release: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    dest = out_base / "matrix" / release
    try:
        info = json.loads((dest / "release.json").read_text())
    except (OSError, json.JSONDecodeError):
        info = {"release": release, "ok": False, "reason": "not run (no release.json)"}
    results = {}
    for path in sorted((dest / "results").glob("*.json")) if (dest / "results").is_dir() else []:
        try:
            results[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    return info, results


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts (and lists of dicts) as dotted keys; other lists stay whole values."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, sub in enumerate(value):
            out.update(flatten(sub, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _notebook_facts(data: dict[str, Any]) -> dict[str, Any]:
    facts = {f"environment.{k}": v for k, v in (data.get("environment") or {}).items() if k != "transformers"}
    for claim in data.get("claims", []):
        facts[f"claims.{claim.get('id')}.verdict"] = claim.get("verdict")
        facts.update(flatten(claim.get("evidence") or {}, f"claims.{claim.get('id')}.evidence"))
    facts.update(flatten(data.get("measurements") or {}, "measurements"))
    return facts


_ABSENT = object()


def differences(per_release: dict[str, dict[str, dict[str, Any]]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """notebook -> [(key, {release: value})] for every key whose value is not the same in every
    release that ran that notebook (a key missing in one release counts as a difference)."""
    notebooks = sorted({nb for res in per_release.values() for nb in res})
    diffs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for nb in notebooks:
        facts = {rel: _notebook_facts(res[nb]) for rel, res in per_release.items() if nb in res}
        if len(facts) < 2:
            continue
        keys = list(dict.fromkeys(k for f in facts.values() for k in f))
        rows = []
        for key in keys:
            values = {rel: f.get(key, _ABSENT) for rel, f in facts.items()}
            if len({json.dumps(v, sort_keys=True, default=str) if v is not _ABSENT else "\0absent" for v in values.values()}) > 1:
                rows.append((key, values))
        if rows:
            diffs[nb] = rows
    return diffs


def group_differences(items: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Rows of a list (`m[0].x`, `m[1].x`, ...) that differ in the same way become one entry
    `m[0,1,...].x`; order of first appearance is kept."""
    import re

    groups: dict[tuple[str, str], list[tuple[list[str], dict[str, Any]]]] = {}
    for key, values in items:
        pattern = re.sub(r"\[\d+\]", "[*]", key)
        sig = json.dumps({r: ("\0absent" if v is _ABSENT else v) for r, v in values.items()}, sort_keys=True, default=str)
        groups.setdefault((pattern, sig), []).append((re.findall(r"\[(\d+)\]", key), values))
    out = []
    for (pattern, _), members in groups.items():
        if len(members) == 1:
            idx = members[0][0]
            key = pattern
            for i in idx:
                key = key.replace("[*]", f"[{i}]", 1)
        else:
            key = pattern
            for pos in range(pattern.count("[*]")):
                seen = list(dict.fromkeys(m[0][pos] for m in members))
                label = ",".join(seen) if len(seen) <= 6 else f"{seen[0]}…{seen[-1]} ({len(seen)})"
                key = key.replace("[*]", f"[{label}]", 1)
        out.append((key, members[0][1]))
    return out


def distinct_texts(values: list[Any], limit: int = 70) -> list[str]:
    """Values written compactly, with more digits where the compact forms would look equal."""
    def text(v: Any, digits: int) -> str:
        if v is _ABSENT:
            return "(absent)"
        if isinstance(v, float) and not isinstance(v, bool):
            return "0" if v == 0 else f"{v:.{digits}g}"
        return fmt_value(v, limit).replace("`", "'")

    raw = {json.dumps(v, default=str) if v is not _ABSENT else "\0" for v in values}
    for digits in (3, 6, 9, 17):
        texts = [text(v, digits) for v in values]
        if len(set(texts)) == len(raw):
            break
    return texts


# --------------------------------------------------------------------------- what changed

# Behaviour differences, in the order matrix.md lists them.
KINDS = ("shape", "None vs a value", "boolean", "error type", "source fact", "count", "text")
# Above this relative size a float difference is called out in its notebook's line (display only).
LARGE_FLOAT = 1e-3
_ERROR_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Warning)\b")
_SOURCE_LOCATION = re.compile(r"\.py:\d+")


def _numbers(value: Any) -> list[float] | None:
    """A number or a (nested) list of numbers as a flat list; None for anything else (bools included)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list):
        out: list[float] = []
        for item in value:
            sub = _numbers(item)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _has_float(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, list) and any(_has_float(v) for v in value))


def relative_size(values: list[Any]) -> float | None:
    """Largest |a - b| / max(|a|, |b|) over every pair of same-length numeric values; None if not all such."""
    flat = [_numbers(v) for v in values]
    if any(f is None for f in flat) or len({len(f) for f in flat}) != 1:
        return None
    worst = 0.0
    for i, a in enumerate(flat):
        for b in flat[i + 1:]:
            for x, y in zip(a, b):
                scale = max(abs(x), abs(y))
                worst = max(worst, abs(x - y) / scale if scale else 0.0)
    return worst


def classify(key: str, values: dict[str, Any]) -> str:
    """'float', 'source location', 'environment' or one of KINDS for one differing value."""
    present = [v for v in values.values() if v is not _ABSENT]
    low = key.lower()
    if low.startswith("environment."):
        return "environment"
    if "shape" in low:
        return "shape"
    if len(present) < len(values) or any(v is None for v in present):
        return "None vs a value"
    if low.rsplit(".", 1)[-1] in ("line", "lineno") or any(isinstance(v, str) and _SOURCE_LOCATION.search(v) for v in present):
        return "source location"
    if "source_fact" in low:
        return "source fact"
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if any(isinstance(v, str) and _ERROR_NAME.search(v) for v in present) or any(
            w in low for w in ("error", "exception", "raised", "stage")):
        return "error type"
    if any(_has_float(v) for v in present) and relative_size(present) is not None:
        return "float"
    if all(isinstance(v, list) for v in present) and len({len(v) for v in present}) > 1:
        return "shape"  # a list that grew or shrank
    if all(_numbers(v) is not None for v in present):
        return "count"
    return "text"


def _leaf(key: str) -> str:
    """The last component of a dotted key, list indices dropped: what the value is, wherever it sits."""
    parts = re.sub(r"\[[^\]]*\]", "", key).split(".")
    return parts[-1] or key


def _verdict_changes(loaded: dict[str, tuple[dict[str, Any], dict[str, Any]]], releases: Sequence[str]) -> list[str]:
    lines = []
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for rel in releases:
        for nb, data in loaded[rel][1].items():
            for claim in data.get("claims", []):
                rows.setdefault((nb, claim.get("id")), {})[rel] = claim.get("verdict", "error")
    for (nb, cid), verdicts in rows.items():
        if len(set(verdicts.values())) > 1:
            steps = " → ".join(f"{rel}: {VERDICT_MARK.get(v, '')} {v}" for rel, v in verdicts.items())
            lines.append(f"- `{cell(cid)}` ({cell(nb)}): {steps}")
    return lines


def _incomplete(ran: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """notebook -> releases on which it stopped early (some claim left `error`)."""
    out: dict[str, set[str]] = {}
    for rel, res in ran.items():
        for nb, data in res.items():
            if any(c.get("verdict") == "error" for c in data.get("claims", [])):
                out.setdefault(nb, set()).add(rel)
    return out


def _not_recorded(values: dict[str, Any], stopped: set[str]) -> bool:
    """Absent only where the notebook stopped early, and the same wherever it was recorded."""
    absent = {rel for rel, v in values.items() if v is _ABSENT}
    present = {json.dumps(v, sort_keys=True, default=str) for v in values.values() if v is not _ABSENT}
    return bool(absent) and absent <= stopped and len(present) <= 1


def sort_differences(ran: dict[str, dict[str, Any]]) -> tuple[dict, dict, dict]:
    """(behaviour {(kind, nb, leaf): rows}, floats {nb: [(relative size, key)]}, collapsed {nb: {what: [keys]}})."""
    behaviour: dict[tuple[str, str, str], list[tuple[str, dict[str, Any]]]] = {}
    floats: dict[str, list[tuple[float, str]]] = {}
    collapsed: dict[str, dict[str, list[str]]] = {}
    stopped = _incomplete(ran)
    for nb, items in differences(ran).items():
        for key, values in items:
            if all(v == rel for rel, v in values.items()) or re.fullmatch(r"claims\..*\.verdict", key):
                continue  # the release's own version number; a verdict (listed above)
            halted = stopped.get(nb, set())
            # releases where the notebook stopped early say nothing about a value they never reached
            judged = {rel: v for rel, v in values.items() if not (v is _ABSENT and rel in halted)}
            kind = "not recorded" if _not_recorded(values, halted) else classify(key, judged)
            if kind == "float":
                floats.setdefault(nb, []).append((relative_size([v for v in judged.values() if v is not _ABSENT]) or 0.0, key))
            elif kind in COLLAPSED:
                collapsed.setdefault(nb, {}).setdefault(kind, []).append(key)
            else:
                behaviour.setdefault((kind, nb, _leaf(key)), []).append((key, values))
    return behaviour, floats, collapsed


COLLAPSED = {"source location": "source line number(s) in transformers moved",
             "environment": "environment value(s) differ",
             "not recorded": "value(s) not recorded where the notebook stopped early (see Verdicts)"}


def _behaviour_line(kind: str, nb: str, leaf: str, rows: list[tuple[str, dict[str, Any]]], per: int = 4) -> str:
    per_release: dict[str, list[Any]] = {}
    for _, values in rows:
        for rel, value in values.items():
            seen = per_release.setdefault(rel, [])
            if not any(json.dumps(value, default=str) == json.dumps(v, default=str) for v in seen):
                seen.append(value)
    texts = " · ".join(f"{rel}: " + ", ".join(f"`{t}`" for t in distinct_texts(vals[:per]))
                       + (f" (+{len(vals) - per})" if len(vals) > per else "") for rel, vals in per_release.items())
    groups = group_differences(rows)
    where = ", ".join(f"`{k}`" for k, _ in groups[:2]) + (f" and {len(groups) - 2} more" if len(groups) > 2 else "")
    return f"- **{cell(nb)}** · {kind} · `{cell(leaf)}` — {texts} (in {where})"


def _kit_skew(ran: dict[str, dict[str, Any]]) -> list[str]:
    """A warning when the releases' results were written by different kit versions (or runs)."""
    kits = {}
    for rel, res in ran.items():
        runs = [d.get("run") for d in res.values() if isinstance(d.get("run"), dict)]
        kits[rel] = sorted({f"{(r.get('kit_commit') or '?')[:12]}{' (dirty)' if r.get('kit_dirty') else ''}" for r in runs})
    if len({json.dumps(k) for k in kits.values()}) <= 1:
        return []
    return ["> ⚠️ **The releases ran different versions of the kit**: "
            + "; ".join(f"{rel}: {', '.join(k) or 'unknown'}" for rel, k in kits.items())
            + ". Some differences below may come from the kit, not from transformers: rerun the matrix in one go.", ""]


def change_section(loaded: dict[str, tuple[dict[str, Any], dict[str, Any]]], releases: Sequence[str],
                   max_lines: int = 40) -> list[str]:
    """"What changed between releases": verdict changes, then behaviour differences (one line per value,
    grouped by what it is), then float and source-location differences collapsed to one line per notebook."""
    ran = {rel: res for rel, (_, res) in loaded.items() if res}
    lines = ["## What changed between releases", ""]
    if len(ran) < 2:
        return lines + ["Fewer than two releases produced results: nothing to compare.", ""]
    lines += _kit_skew(ran)
    verdicts = _verdict_changes(loaded, [r for r in releases if r in ran])
    lines += ["### Verdicts", ""] + (verdicts or ["No claim changes verdict between the releases that ran it."]) + [""]
    behaviour, floats, collapsed = sort_differences(ran)
    lines += ["### Behaviour", "",
              "Values that are not float noise: shapes, None vs a value, booleans, error types, source facts, counts, text.", ""]
    ordered = sorted(behaviour.items(), key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1]))
    lines += [_behaviour_line(*head, rows) for head, rows in ordered[:max_lines]] or ["None."]
    if len(ordered) > max_lines:
        lines.append(f"- … and {len(ordered) - max_lines} more (see Differences below)")
    lines += ["", "### Float differences (one line per notebook)", ""]
    for nb, found in floats.items():
        worst, key = max(found)
        large = sum(1 for size, _ in found if size > LARGE_FLOAT)
        note = f"; {large} of them above {LARGE_FLOAT:g} relative (see Differences)" if large else ""
        lines.append(f"- {cell(nb)}: {len(found)} float value(s) differ; largest relative difference "
                     f"{fmt_value(worst)} (`{cell(key)}`){note}")
    lines += [] if floats else ["None."]
    if collapsed:
        lines += ["", "### Also different (collapsed)", ""]
        for nb, kinds in collapsed.items():
            for kind, keys in kinds.items():
                names = ", ".join(list(dict.fromkeys(f"`{_leaf(k)}`" for k in keys))[:6])
                lines.append(f"- {cell(nb)}: {len(keys)} {COLLAPSED[kind]} ({names})")
    return lines + [""]


def _matrix_run(out_base: Path) -> list[str]:
    """The matrix's run record (outputs/matrix/run.json, written by the runner) in one line; loud unless complete."""
    run = load_run(out_base / "matrix")
    if not run:
        return []
    status = run.get("status") or "unknown"
    line = (f"**Matrix run `{cell(run.get('run_id'))}`** · {RUN_STATUS.get(status, cell(status))} · started "
            f"{cell(run.get('started') or '?')}, finished {cell(run.get('finished') or '— (not finished)')} · "
            f"kit commit {commit_text(run)}")
    out = [line, ""]
    if status != "complete":
        out += [f"> ⚠️ **This matrix run is {status}**: releases or notebooks missing below were not run to the end.", ""]
    return out


def build_matrix(out_base: Path, releases: Sequence[str], max_diff_lines: int = 80) -> str:
    pinned = pinned_release()
    loaded = {rel: _load_release(out_base, rel) for rel in releases}
    ran = {rel: res for rel, (info, res) in loaded.items() if res}
    heads = [f"{rel} (pinned)" if rel == pinned else rel for rel in releases]

    rows: dict[tuple[str, str], dict[str, str]] = {}
    for rel, (_, res) in loaded.items():
        for nb, data in res.items():
            for claim in data.get("claims", []):
                rows.setdefault((nb, claim.get("id")), {})[rel] = claim.get("verdict", "error")
    lines = ["# transformers release matrix", "",
             "Every notebook's claims on each transformers release (same torch, same machine). The first section "
             "says what changed; the tables after it hold every verdict and every differing value.", ""]
    lines += _matrix_run(out_base)
    lines += change_section(loaded, releases)

    lines += ["## Releases", "", "| release | status | transformers / tokenizers / huggingface-hub | environment | run |",
              "|---|---|---|---|---|"]
    for rel, head in zip(releases, heads):
        info, res = loaded[rel]
        v = info.get("versions") or {}
        if not info.get("ok"):
            status = f"❌ not installed: {info.get('reason', '?')}"
        elif info.get("rc") == 0:
            status = "✅ ran"
        else:
            status = f"⚠️ ran, run-all exit {info.get('rc')}"
        vers = " / ".join(str(v.get(k, "—")) for k in ("transformers", "tokenizers", "huggingface-hub")) if v else "—"
        where = "—"
        if info.get("python"):
            where = ("reused " if info.get("reused") else "built ") + f"`{cell(Path(info['python']).parent.parent.name)}`"
            extra = [i for i in info.get("installed", []) if not i.startswith("transformers==")]
            if extra:
                where += " + " + ", ".join(f"`{cell(i)}`" for i in extra)
        run = f"{fmt_value(info.get('run_seconds'))} s" if info.get("run_seconds") is not None else "—"
        lines.append(f"| {head} | {cell(status)} | {cell(vers)} | {where} | {run} |")
    lines.append("")

    lines += ["## Verdicts", "", "Rows marked **Δ** have a verdict that differs between releases.", "",
              "| Δ | notebook | claim | " + " | ".join(heads) + " |",
              "|---|---|---|" + "---|" * len(heads)]
    changed = []
    for (nb, cid), verdicts in rows.items():
        cells = []
        for rel in releases:
            info, res = loaded[rel]
            if rel in verdicts:
                cells.append(f"{VERDICT_MARK.get(verdicts[rel], '')} {verdicts[rel]}")
            elif not info.get("ok"):
                cells.append("not installed")
            else:
                cells.append("no result" if nb not in res else "claim absent")
        differs = len({c for c in cells if c != "not installed"}) > 1
        if differs:
            changed.append((nb, cid, cells))
        lines.append(f"| {'**Δ**' if differs else ''} | {cell(nb)} | `{cell(cid)}` | " + " | ".join(cells) + " |")
    if not rows:
        lines.append("| | — | no results | " + " | ".join("—" for _ in releases) + " |")
    lines.append("")

    if changed:
        lines += ["### Verdicts that change", ""]
        for nb, cid, cells in changed:
            lines.append(f"- `{cid}` ({nb}): " + " → ".join(f"{h}: {c}" for h, c in zip(heads, cells)))
        lines.append("")

    lines += ["## Differences", "",
              "Evidence, measurements and environment values (besides the transformers version) that are "
              "not the same in every release that ran the notebook.", ""]
    diffs = differences(ran)
    if len(ran) < 2:
        lines += ["Fewer than two releases produced results: nothing to compare.", ""]
    elif not diffs:
        lines += ["None: every recorded value is identical across releases.", ""]
    for nb, items in diffs.items():
        groups = group_differences(items)
        lines += [f"### {nb}", "", f"{len(items)} differing value(s).", ""]
        for key, values in groups[:max_diff_lines]:
            texts = distinct_texts(list(values.values()))
            vals = " · ".join(f"{rel}: `{text}`" for rel, text in zip(values, texts))
            lines.append(f"- `{key}` — {vals}")
        if len(groups) > max_diff_lines:
            lines.append(f"- … and {len(groups) - max_diff_lines} more (see outputs/matrix/<release>/results/{nb}.json)")
        lines.append("")
    return truncate("\n".join(lines).rstrip() + "\n", what="matrix.md")


def write_matrix(out_base: Path | None = None, releases: Sequence[str] = DEFAULT_RELEASES) -> Path:
    out_base = Path(out_base) if out_base else output_dir()
    path = out_base / "matrix.md"
    path.write_text(scrub(build_matrix(out_base, releases), out_base))
    return path
