"""pytest plugin: run transformers' own tests with every model tracked by kvresume and the resume guard on generate().

Use: `pytest -p helpers.pipeline.tools.hftests --hf-json OUT.json [--hf-track] TESTS`; `python -m
helpers.pipeline.tools.hftests BASE.json TRACKED.json SUMMARY.json` compares a plain and a tracked run;
`python -m helpers.pipeline.tools.hftests --files ROOT` prints the measured set (docs/hf-tests.md) for
`make hf-tests HF_TESTS="$(...)"`, ROOT a transformers checkout's tests (kept outside this repository)."""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

STATE: dict[str, Any] = {"outcomes": {}, "errors": {}, "files": {}, "refusals": [], "false_alarms": [], "guard_errors": [],
                         "resume_calls": Counter(), "test": ""}
RANK = {"skipped": 0, "passed": 1, "failed": 2}  # a test's outcome is its worst report; a skip does not hide a pass
CACHE_KWARGS = ("past_key_values", "cache")
MODELS = ("llama", "qwen3", "gemma2", "qwen3_next", "qwen3_5", "qwen3_vl")
MEASURED = ["tests/generation", "tests/utils/test_cache_utils.py", *(f"tests/models/{m}/test_modeling_{m}.py" for m in MODELS)]


class _XdistSpecs:
    """xdist's node hook, declared when xdist is off (-p no:xdist): transformers' conftest implements it."""

    @pytest.hookspec(historic=False)
    def pytest_configure_node(self, node: Any) -> None:
        """Declared only; never called without xdist."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare pytest_configure_node when xdist is blocked or not installed, so a plugin implementing it validates."""
    if pluginmanager.is_blocked("xdist") or importlib.util.find_spec("xdist") is None:
        pluginmanager.add_hookspecs(_XdistSpecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """--hf-track (track models, guard generate) and --hf-json (where the run's record goes)."""
    parser.addoption("--hf-track", action="store_true", help="track every model with kvresume; guard generate()")
    parser.addoption("--hf-json", default="hftests.json", help="JSON record of this run")


def _cache_of(kwargs: dict[str, Any]) -> Any:
    """The non-empty cache a generate() call resumes, or None."""
    for key in CACHE_KWARGS:
        cache = kwargs.get(key)
        try:
            if cache is not None and cache.get_seq_length() > 0:
                return cache
        except Exception:  # noqa: BLE001 - legacy tuples and odd caches are not resumes we judge
            return None
    return None


def _guarded(generate: Any) -> Any:
    """generate() that runs check_resume_inputs first on a resume, counting refusals and false alarms."""
    import kvresume
    from kvresume.checks import ResumeInputError

    @functools.wraps(generate)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = None if STATE.get("inside") else _cache_of(kwargs)
        if cache is None:  # no resume, or a generate() the guard itself runs
            return generate(self, *args, **kwargs)
        tracked = kvresume.ledger_of(cache) is not None
        STATE["resume_calls"]["tracked" if tracked else "untracked"] += 1
        try:
            STATE["inside"] = True
            kvresume.check_resume_inputs(self, *args, **kwargs)
        except ResumeInputError as err:
            STATE["inside"] = False
            record = {"test": STATE["test"], "check": getattr(err, "check", "?"), "message": str(err)[:300]}
            STATE["refusals"].append(record)
            out = generate(self, *args, **kwargs)  # raises: a true refusal; returns: a false alarm
            STATE["false_alarms"].append(record)
            return out
        except Exception as err:  # noqa: BLE001 - the guard crashed: recorded; generate() below decides the test
            STATE["guard_errors"].append({"test": STATE["test"], "error": f"{type(err).__name__}: {err}"[:300]})
        finally:
            STATE["inside"] = False
        return generate(self, *args, **kwargs)
    return wrapper


def _tracking(post_init: Any) -> Any:
    """post_init() that then tracks the model."""
    import kvresume

    @functools.wraps(post_init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = post_init(self, *args, **kwargs)
        kvresume.track(self)
        return out
    return wrapper


def pytest_configure(config: pytest.Config) -> None:
    """Install the tracking and the guard (this test session only) when --hf-track is given."""
    if not config.getoption("--hf-track"):
        return
    from transformers import PreTrainedModel
    from transformers.generation.utils import GenerationMixin
    PreTrainedModel.post_init = _tracking(PreTrainedModel.post_init)
    GenerationMixin.generate = _guarded(GenerationMixin.generate)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remember which test is running (refusals name it)."""
    STATE["test"] = item.nodeid


def _key(report: Any) -> str:
    """The test's node id, its file put back where pytest left it out (a file outside the rootdir: '::Cls::test')."""
    nodeid = str(report.nodeid)
    return f"{STATE['files'].get(nodeid, report.location[0])}{nodeid}" if nodeid.startswith("::") else nodeid


def pytest_itemcollected(item: pytest.Item) -> None:
    """Remember the file of a test whose node id lacks it (see _key)."""
    if item.nodeid.startswith("::"):
        STATE["files"][item.nodeid] = str(item.path)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's outcome: failed if a phase or subtest failed, else passed if its call passed, else skipped."""
    if report.when != "call" and report.outcome == "passed":
        return
    key = _key(report)
    prev = STATE["outcomes"].get(key)
    if prev is None or RANK[report.outcome] > RANK[prev]:
        STATE["outcomes"][key] = report.outcome
    if report.outcome == "failed" and key not in STATE["errors"]:
        crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
        STATE["errors"][key] = str(getattr(crash, "message", getattr(report, "longrepr", "")))[:300]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write this run's record."""
    record = {**{k: v for k, v in STATE.items() if k not in ("test", "files", "inside")},
              "tracked": session.config.getoption("--hf-track"), "resume_calls": dict(STATE["resume_calls"])}
    Path(session.config.getoption("--hf-json")).write_text(json.dumps(record, indent=1))


def summary(base: dict[str, Any], tracked: dict[str, Any]) -> dict[str, Any]:
    """Counts of both runs, tests tracking breaks (fail tracked, pass plain) and false alarms by check."""
    broken = sorted(t for t, o in tracked["outcomes"].items() if o == "failed" and base["outcomes"].get(t) == "passed")
    errors = tracked.get("errors", {})
    return {"tests_run": len(tracked["outcomes"]), "without_tracking": dict(Counter(base["outcomes"].values())),
            "with_tracking": dict(Counter(tracked["outcomes"].values())),
            "broken_by_tracking": broken, "broken_errors": {t: errors.get(t, "?") for t in broken},
            "refusals": len(tracked["refusals"]),
            "false_alarms": len(tracked["false_alarms"]),
            "false_alarms_by_check": dict(Counter(str(r["check"]) for r in tracked["false_alarms"])),
            "guard_errors": len(tracked.get("guard_errors", [])),
            "guard_error_records": tracked.get("guard_errors", []),
            "false_alarm_records": tracked["false_alarms"], "resume_calls": tracked["resume_calls"]}


def measured_set(root: str) -> str:
    """The HF_TESTS value of the measured run: the suites under `root` (a transformers checkout), whole."""
    return " ".join(str(Path(root) / f) for f in MEASURED)


def main(argv: list[str]) -> None:
    """BASE.json TRACKED.json SUMMARY.json: write the comparison; --files ROOT: print the measured HF_TESTS."""
    if argv[:1] == ["--files"]:
        print(measured_set(argv[1]))
        return
    base, tracked = (json.loads(Path(p).read_text()) for p in argv[:2])
    Path(argv[2]).write_text(json.dumps(summary(base, tracked), indent=1))
    print(json.dumps({k: v for k, v in summary(base, tracked).items() if not k.endswith("_records")}))


if __name__ == "__main__":
    main(sys.argv[1:])
