"""`kvresume serve`'s deciding parts without a server: its options (parsed, checked, handed on as the environment the
model's process reads), what the pool is given, the request tag carried to generate() and taken off there, and the
cached tokens the usage reports from the pool's record (kvresume.serving.serve)."""
from __future__ import annotations

import logging
import re
import queue
import sys
import time
from types import SimpleNamespace

import pytest

serve = pytest.importorskip("kvresume.serving.serve")
from kvresume.pool import PoolRecord  # noqa: E402

ENV = (serve.TOKENS_ENV, serve.BYTES_ENV, serve.OFF_ENV)
REC = PoolRecord(prompt=9, reused=6, fed=3, reason="extends", detail="all cached")


@pytest.fixture
def launched(monkeypatch):
    """main() with transformers' CLI and the patches replaced: what install() and the CLI were called with."""
    import transformers.cli.transformers as cli

    seen: dict = {"install": 0}
    monkeypatch.setattr(serve, "install", lambda: seen.__setitem__("install", seen["install"] + 1))
    monkeypatch.setattr(cli, "app", lambda args, prog_name: seen.update(args=args, prog=prog_name))
    for name in ENV:
        monkeypatch.setenv(name, "unset")
    return seen


def env() -> tuple[str, str, str]:
    import os

    return tuple(os.environ[name] for name in ENV)


def test_serve_hands_its_defaults_to_the_model_process_and_every_other_option_to_transformers(launched):
    assert serve.main(["serve", "folder", "--port", "1", "-h"]) == 0
    assert launched == {"install": 1, "args": ["serve", "folder", "--port", "1", "-h"], "prog": "kvresume"}
    assert env() == ("65536", "", "0")


def test_its_own_options_at_their_lowest(launched):
    assert serve.main(["serve", "--pool-tokens", "1", "--pool-bytes", "1", "--no-pool", "m"]) == 0
    assert env() == ("1", "1", "1") and launched["args"] == ["serve", "m"]


def test_argv_defaults_to_the_command_line(launched, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kvresume", "serve", "--pool-bytes", "7", "m"])
    assert serve.main() == 0
    assert env() == ("65536", "7", "0") and launched["args"] == ["serve", "m"]


@pytest.mark.parametrize("option", ["--pool-tokens", "--pool-bytes"])
def test_a_budget_under_one_is_refused(launched, option, capsys):
    with pytest.raises(SystemExit) as info:
        serve.main(["serve", option, "0"])
    assert info.value.code == 2 and launched["install"] == 0
    assert capsys.readouterr().err.endswith("error: --pool-tokens and --pool-bytes must be at least 1\n")


def test_a_command_other_than_serve_is_refused(launched):
    with pytest.raises(SystemExit) as info:
        serve.main(["other"])
    assert info.value.code == 2 and launched["install"] == 0


def test_without_the_serve_command_it_prints_its_help(launched, capsys):
    assert serve.main([]) == 2
    out = capsys.readouterr().out
    assert launched["install"] == 0 and env() == ("unset",) * 3
    words = " ".join(out.split())
    assert out.startswith("usage: kvresume") and " ".join(serve.__doc__.split("\n\n")[0].split()) in words
    assert "Nothing of the server" not in words
    for text in ("tokens the pooled caches may hold", "bytes the pooled caches' tensors may hold",
                 "plain generate\\(\\): nothing reused"):
        assert re.search(rf"(^| ){text}( |$)", words), text


class FakePool:
    def __init__(self, record):
        self.last, self.calls = record, []

    def generate(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "out"


@pytest.fixture
def pooled(monkeypatch):
    """serve.pooled on a stand-in model with attach() replaced: (model, the options attach got, the pool, published,
    the log lines)."""
    got: dict = {}
    pool = FakePool(REC)
    monkeypatch.setattr(serve, "attach", lambda model, **options: got.update(options, model=model) or pool)
    published: list = []
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    serve._logger()  # its stderr line first, as in the server (then this test's handler beside it)
    serve.log.addHandler(handler)
    yield (lambda: serve.pooled(SimpleNamespace(), lambda *a: published.append(a))), got, pool, published, lines
    serve.log.removeHandler(handler)


def test_the_pool_gets_its_defaults_where_no_option_was_set(pooled, monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    make, got, *_ = pooled
    model = make()
    assert got == {"max_tokens": 65536, "enabled": True, "max_bytes": None, "model": model}


@pytest.mark.parametrize("values, want", [(("5", "7", "1"), (5, 7, False)), (("5", "", "0"), (5, None, True))])
def test_the_pool_gets_the_options_main_set(pooled, monkeypatch, values, want):
    for name, value in zip(ENV, values):
        monkeypatch.setenv(name, value)
    make, got, *_ = pooled
    make()
    assert (got["max_tokens"], got["max_bytes"], got["enabled"]) == want


def test_a_tagged_call_is_logged_and_published_without_its_tag(pooled):
    make, _, pool, published, lines = pooled
    model = make()
    assert model.generate(1, x=2, **{serve.TAG: "r1"}) == "out"
    assert pool.calls == [((1,), {"x": 2})]
    assert published == [("r1", REC)] and lines == [f"request r1: {REC.line()}"]
    assert serve.log.level == logging.INFO and not serve.log.propagate


def test_an_untagged_call_is_logged_not_published_and_a_call_without_a_record_neither(pooled):
    make, _, pool, published, lines = pooled
    model = make()
    model.generate(x=1)
    assert pool.calls == [((), {"x": 1})] and published == [] and lines == [f"request None: {REC.line()}"]
    pool.last = None
    model.generate(**{serve.TAG: "r2"})
    assert published == [] and len(lines) == 1


@pytest.fixture
def records(monkeypatch):
    monkeypatch.setattr(serve, "RECORDS", {})
    monkeypatch.setattr(serve, "LOADERS", [])
    return serve.RECORDS


def test_a_record_published_in_process_is_taken_once(records):
    serve._local("a", REC)
    assert records == {"a": REC}
    assert serve.record_for("a") is REC and records == {}


def test_records_come_back_from_each_loaders_queue(records):
    q1, q2 = queue.Queue(), queue.Queue()
    q1.put(("other", REC))
    q1.put(("b", REC))
    q2.put(("c", REC))
    serve.LOADERS.extend([SimpleNamespace(records=q1), SimpleNamespace(records=q2)])
    assert serve.record_for("c", wait=5) is REC
    assert records == {"other": REC, "b": REC}


def test_a_missing_record_is_none_after_the_wait(records):
    start = time.monotonic()
    assert serve.record_for("gone", wait=0.05) is None
    assert 0.04 < time.monotonic() - start < 0.8


def test_the_usage_reports_the_pools_reused_tokens(records):
    records["r"] = REC
    usage = SimpleNamespace(prompt_tokens=9, prompt_tokens_details=None)
    assert serve._with_cached("r", usage) is usage and usage.prompt_tokens_details.cached_tokens == 6


def test_no_usage_takes_no_record_and_no_record_changes_no_usage(records, monkeypatch):
    records["r"] = REC
    assert serve._with_cached("r", None) is None and records == {"r": REC}
    monkeypatch.setattr(serve, "record_for", lambda tag: None)
    usage = SimpleNamespace(prompt_tokens_details="as given")
    assert serve._with_cached("r", usage).prompt_tokens_details == "as given"


@pytest.mark.parametrize("at", [1, 3])
def test_a_request_tags_the_inputs_argument_only(at):
    calls = []
    method = serve._tagged(lambda *a, **k: calls.append((a, k)) or "done", at)
    args = [f"arg{i}" for i in range(at)] + [{"input_ids": 1}, "after"]
    assert method(*args, k=1) == "done"
    assert calls[-1] == (tuple(args), {"k": 1})  # no request: as given
    token = serve.CURRENT.set("req")
    try:
        method(*args, k=1)
    finally:
        serve.CURRENT.reset(token)
    want = (*args[:at], {"input_ids": 1, serve.TAG: "req"}, "after")
    assert calls[-1] == (want, {"k": 1}) and args[at] == {"input_ids": 1}
