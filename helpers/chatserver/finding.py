"""Notebook 11's finding, declared once: its claims and quotes and what the kit's lists need of it (helpers.findings)."""
from ..findings import Decisions, Finding
from ..quotes import CONTROL, ENGINES, SERVE, passage

_ENGINE = passage(CONTROL, "extends", ENGINES, answers=SERVE)  # a chat server is an inference engine owning its state

FINDING = Finding(
    stem="11_chat_server_resumed",
    title="A chat server resumed: plain `transformers serve` against `kvresume serve`, turn by turn",
    source="serve",
    claims={
        "serve.replies_equal": _ENGINE,
        "serve.plain_recomputes_every_turn": _ENGINE,
        "serve.pool_reuses_earlier_turns": _ENGINE,
        "serve.rerendered_template_stops_reuse": _ENGINE,
        "serve.first_token_sooner": _ENGINE,
    },
    bisect="serve.pool_reuses_earlier_turns",
    functions=("transformers.cli.serving.chat_completion.ChatCompletionHandler.handle_request",
               "transformers.generation.utils.GenerationMixin._prepare_cache_for_generation"),
    repro="examples/repro/serve_prefix_reuse.py",
    decisions=(Decisions("helpers/chatserver/decisions.py", ("*",), "tests/test_kill_chatserver.py"),),
    estimate_s=18.0,
    summary=("One chat through two real servers on a local model folder, with the `openai` client: per turn the prompt "
             "tokens plain `transformers serve` recomputes against those `kvresume serve` reuses, time to first token, "
             "replies compared; a chat template that re-renders earlier turns (thinking off) and what it costs."),
    models="`tiny-chat` (a 24.7M random Llama folder built here)",
    needs="CPU, `transformers[serving]`, `openai`",
)
