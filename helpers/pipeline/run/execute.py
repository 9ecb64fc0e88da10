"""One notebook: finding notebooks, papermill into outputs/notebooks/, its failure line and phase timings,
and the child entry (`runner _exec`) a recorded run starts each notebook in."""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..paths import output_dir, repo_root
from ..report.records import load_json
from .procs import _connection_files, descendants, stop_processes


@dataclass
class RunResult:
    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str = ""
    status: str = ""  # ok | failed | interrupted | not_started
    phases: dict[str, float] = field(default_factory=dict)
    retried: str = ""  # why the notebook was started a second time ('' when it was not)


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


# --------------------------------------------------------------------------- one notebook

def failure_line(exc: BaseException) -> str:
    """'Type: first line of the message' of the exception raised in the notebook (papermill's ename/evalue)."""
    name = getattr(exc, "ename", None) or type(exc).__name__
    text = str(getattr(exc, "evalue", None) if getattr(exc, "ename", None) else exc)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"{name}: {first}"[:300] if first else name


def phases(executed: Path, began: float, session: dict[str, float] | None) -> dict[str, float]:
    """Where one notebook's time went, from papermill's cell timings and session.start's report:
    kernel_start_s (until the first cell), imports_s (setup cell until session.start), model_build_s,
    experiments_s (every other cell)."""
    try:
        cells = [c for c in json.loads(executed.read_text())["cells"] if c.get("cell_type") == "code"]
    except (OSError, ValueError, KeyError):
        return {}
    times = [((c.get("metadata") or {}).get("papermill") or {}) for c in cells]
    starts = [datetime.fromisoformat(t["start_time"]).timestamp() if t.get("start_time") else None  # None: never ran
              for t in times]
    durations = [float(t.get("duration") or 0.0) for t in times]
    first = next((s for s in starts if s), None)
    out = {"kernel_start_s": round(first - began, 2)} if first else {}
    setup = next((i for i, c in enumerate(cells) if "session.start(" in "".join(c.get("source") or "")), None)
    if setup is None or not session or not starts[setup]:
        out["cells_s"] = round(sum(durations), 2)
        return out
    imports = max(0.0, session["entered"] - starts[setup])
    model = session.get("model_build_s", 0.0) + session.get("results_s", 0.0)
    out.update(imports_s=round(imports, 2), model_build_s=round(model, 2),
               experiments_s=round(sum(durations) - imports - model, 2))
    return out


# jupyter_client's words when a kernel exits before it answers: no cell ran, so starting it again is safe.
KERNEL_DIED = "Kernel died before replying to kernel_info"


def _execute(path: Path, parameters: dict[str, Any], out: Path) -> tuple[str, str]:
    """papermill into `out`, quietly: ('' or the one-line failure, why it ran twice or ''). A kernel that died
    before replying to kernel_info is started once more."""
    error = _papermill(path, parameters, out)
    if KERNEL_DIED not in error:
        return error, ""
    return _papermill(path, parameters, out), f"run again once: the first kernel failed ({error})"


def _papermill(path: Path, parameters: dict[str, Any], out: Path) -> str:
    """papermill into `out`, quietly; '' or the one-line failure."""
    import papermill as pm

    from .stub import WarmKernelManager  # jupyter_client, which papermill imports too

    extra = {"kernel_manager_class": WarmKernelManager} if os.environ.get("KVKIT_ZYGOTE") else {}
    try:
        pm.execute_notebook(str(path), str(out), parameters=parameters or {}, cwd=str(repo_root()),
                            kernel_name="python3", progress_bar=False, log_output=False,
                            request_save_on_cell_execute=True, **extra)
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported and the others still run
        return failure_line(exc)
    return ""


def _exec_main(argv: list[str]) -> int:
    """Child entry (`runner _exec NB --out-json F --params JSON`): run one notebook (its HTML is rendered by the
    runner, schedule.HtmlRenderer), write {status, error, phases} to F. SIGTERM/SIGINT shut its kernel down and exit at once."""
    parser = argparse.ArgumentParser(prog="kvkit _exec")
    parser.add_argument("notebook")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--began", type=float, default=None)
    args = parser.parse_args(argv)

    def stop(signum: int, _frame: Any) -> None:
        kids = descendants(os.getpid())
        files = [f for pid in kids for f in _connection_files(pid)]
        stop_processes(kids, grace=1.0)
        for conn in files:  # a kernel killed hard leaves its connection file behind
            Path(conn).unlink(missing_ok=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    began = args.began or time.time()
    path = Path(args.notebook)
    timing_file = Path(args.out_json).with_suffix(".session.json")
    os.environ["KVKIT_TIMINGS_FILE"] = str(timing_file)
    executed = output_dir("notebooks") / path.name
    error, retried = _execute(path, json.loads(args.params), executed)
    result = {"status": "failed" if error else "ok", "error": error, "phases": phases(executed, began, load_json(timing_file)),
              **({"retried": retried} if retried else {})}
    Path(args.out_json).write_text(json.dumps(result))
    return 0
