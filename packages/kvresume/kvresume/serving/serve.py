"""`kvresume serve MODEL [options]`: transformers' own `transformers serve`, every generate() it makes through a
`kvresume.pool.Pool`, so a multi-turn chat reuses the cache of its earlier turns instead of re-prefilling them.

Nothing of the server is re-implemented: its app, routes, request parsing, chat templates and streaming are
transformers'. Three patches, made before its CLI runs: the model it loads gets a pool (`model.generate` becomes the
pool's; 5.17.0 loads in the server's process, 5.25.0 in a spawned one, through a `ModelLoader` subclass that process
imports from here); each chat request's inputs carry its id to the model's process; the chat completion's usage reports
`prompt_tokens_details.cached_tokens` from the pool's record, which comes back in-process (5.17.0) or over a queue
(5.25.0). One log line per request: tokens reused, fed, and why reuse stopped. Options of its own: `--pool-tokens N`
(the budget, tokens held by pooled caches, least recently used evicted), `--pool-bytes N` (the bytes of their
tensors) and `--no-pool` (plain generate(), usage reporting 0 cached tokens); every other option is `transformers
serve`'s. Needs `pip install "kvresume[serve]"`.
"""
from __future__ import annotations

import argparse
import contextvars
import logging
import multiprocessing
import os
import queue
import sys
import time
from typing import Any

from transformers.cli.serving import chat_completion, model_manager, utils

from ..pool import PoolRecord, attach

TOKENS_ENV, BYTES_ENV, OFF_ENV = "KVRESUME_POOL_TOKENS", "KVRESUME_POOL_BYTES", "KVRESUME_POOL_OFF"
TAG = "kvresume_request"
CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvresume_request", default=None)
RECORDS: dict[str, PoolRecord] = {}  # request id -> the pool's record, in the server's process
LOADERS: list[Any] = []  # 5.25: the loaders of this server process, whose queues bring the records back
log = logging.getLogger("kvresume.serve")


def _logger() -> None:
    """The per-request line on stderr, in whichever process the model runs."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kvresume: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def pooled(model: Any, publish: Any) -> Any:
    """The model with a pool behind its generate(); `publish(request_id, record)` after each tagged call."""
    _logger()
    limit = os.environ.get(BYTES_ENV)
    pool = attach(model, max_tokens=int(os.environ.get(TOKENS_ENV, 1 << 16)), enabled=os.environ.get(OFF_ENV) != "1",
                  max_bytes=int(limit) if limit else None)

    def generate(*args: Any, **kwargs: Any) -> Any:
        tag = kwargs.pop(TAG, None)
        out = pool.generate(*args, **kwargs)
        if pool.last is not None:
            log.info("request %s: %s", tag, pool.last.line())
            if tag is not None:
                publish(tag, pool.last)
        return out

    model.generate = generate
    return model


def _local(tag: str, record: PoolRecord) -> None:
    RECORDS[tag] = record


if hasattr(model_manager, "ModelLoader"):  # 5.25: the model loads and runs in a process of its own

    class PooledLoader(model_manager.ModelLoader):  # type: ignore[misc, name-defined]
        """transformers' ModelLoader whose models get a pool; the records come back on a queue (pickled into the
        model's process with this loader)."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.records = multiprocessing.get_context("spawn").Queue()
            LOADERS.append(self)

        def _load_model(self, *args: Any, **kwargs: Any) -> Any:
            return pooled(super()._load_model(*args, **kwargs), lambda tag, rec: self.records.put((tag, rec)))



def record_for(tag: str, wait: float = 10.0) -> PoolRecord | None:
    """The pool's record of a request, which its generate() publishes as it returns: the usage is built once the
    last token is out, a moment before that (5.17: into RECORDS; 5.25: onto the loaders' queues)."""
    end = time.monotonic() + wait
    while tag not in RECORDS and time.monotonic() < end:
        for loader in LOADERS:
            try:
                while True:
                    got, rec = loader.records.get_nowait()
                    RECORDS[got] = rec
            except queue.Empty:
                pass
        time.sleep(0.001)
    return RECORDS.pop(tag, None)


def _with_cached(request_id: str, usage: Any) -> Any:
    """The usage with `prompt_tokens_details.cached_tokens` from the pool's record of the request."""
    rec = record_for(request_id) if usage is not None else None
    if rec is not None:
        from openai.types.completion_usage import PromptTokensDetails

        usage.prompt_tokens_details = PromptTokensDetails(cached_tokens=rec.reused)
    return usage


def _tagged(method: Any, inputs_at: int) -> Any:
    """A generate method of the server whose `inputs` argument (positional index `inputs_at`) carries the request id."""

    def call(*args: Any, **kwargs: Any) -> Any:
        tag = CURRENT.get()
        if tag is not None:
            args = (*args[:inputs_at], {**args[inputs_at], TAG: tag}, *args[inputs_at + 1:])
        return method(*args, **kwargs)

    return call


def install() -> None:
    """Patch transformers' server: pooled models, tagged requests, cached tokens in the chat usage."""
    handler = chat_completion.ChatCompletionHandler
    handle, build, chunk = handler.handle_request, handler._build_completion, handler._build_chunk_sse

    async def handle_request(self: Any, body: dict, request_id: str) -> Any:
        CURRENT.set(request_id)
        return await handle(self, body, request_id)

    def _build_completion(self: Any, request_id: str, *args: Any, usage: Any = None, **kwargs: Any) -> Any:
        return build(self, request_id, *args, usage=_with_cached(request_id, usage), **kwargs)

    def _build_chunk_sse(self: Any, request_id: str, *args: Any, usage: Any = None, **kwargs: Any) -> Any:
        return chunk(self, request_id, *args, usage=_with_cached(request_id, usage), **kwargs)

    handler.handle_request, handler._build_completion, handler._build_chunk_sse = (
        handle_request, _build_completion, _build_chunk_sse)
    if hasattr(model_manager, "ModelLoader"):
        model_manager.ModelLoader = PooledLoader  # Serve() builds its loader from this name
        engine = model_manager.EngineClient
        engine.generate_non_streaming = _tagged(engine.generate_non_streaming, 1)
        engine.generate_streaming = _tagged(engine.generate_streaming, 1)
    else:  # 5.17: one process
        load = model_manager.ModelManager._load_model
        model_manager.ModelManager._load_model = lambda self, *a, **k: pooled(load(self, *a, **k), _local)
        manager = utils.GenerateManager
        manager.generate_non_streaming = _tagged(manager.generate_non_streaming, 3)
        manager.generate_streaming = _tagged(manager.generate_streaming, 3)


def main(argv: list[str] | None = None) -> int:
    """`kvresume serve MODEL [--pool-tokens N] [--no-pool] [transformers serve options]`."""
    parser = argparse.ArgumentParser(prog="kvresume", description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("command", nargs="?", choices=["serve"])
    parser.add_argument("--pool-tokens", type=int, default=1 << 16, help="tokens the pooled caches may hold")
    parser.add_argument("--pool-bytes", type=int, default=None, help="bytes the pooled caches' tensors may hold")
    parser.add_argument("--no-pool", action="store_true", help="plain generate(): nothing reused")
    own, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.command != "serve":
        parser.print_help()
        return 2
    if own.pool_tokens < 1 or (own.pool_bytes is not None and own.pool_bytes < 1):
        parser.error("--pool-tokens and --pool-bytes must be at least 1")
    os.environ[TOKENS_ENV], os.environ[OFF_ENV] = str(own.pool_tokens), "1" if own.no_pool else "0"
    os.environ[BYTES_ENV] = "" if own.pool_bytes is None else str(own.pool_bytes)
    install()
    from transformers.cli.transformers import app

    app(["serve", *rest], prog_name="kvresume")
    return 0
