"""The chats of notebook 11: a local model folder, both servers, and one row per turn of each chat."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

# Qwen3's rule, on the folders' ChatML: with `enable_thinking` false the generation prompt holds an empty thinking
# block, and an earlier assistant turn is rendered without it: the cached turn and its re-rendering differ there.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
            "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
CHATS = {"stable": {}, "re-rendered": {"enable_thinking": False}}  # chat -> its chat_template_kwargs
TINY = "tiny-chat"  # the default: kvresume.serving.folders' seeded Llama and tokenizer, saved here with TEMPLATE


def folder(model_id: str, root: Path, seed: int, size: str) -> str:
    """What the servers load: the tiny default saved under `root` (its template: TEMPLATE), else `model_id` as is."""
    if model_id != TINY:
        return model_id
    import transformers
    from kvresume.serving.folders import chat_folder

    path = chat_folder(root / "chat", size=size, seed=seed)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return str(path)


def served(model: str, revision: str | None) -> dict[str, Any]:
    """What the environment records of the served model and the servers: the folder's digest (a local folder), its
    parameter count, and the kvresume release behind `kvresume serve`."""
    import os

    import kvresume

    from ..models import local_folder_revision

    env: dict[str, Any] = {"server": f"transformers serve; kvresume serve (kvresume {kvresume.__version__})"}
    if os.path.isdir(model):
        env["model_revision"] = local_folder_revision(model)
        env["model_parameters"] = parameter_count(Path(model))
    elif revision:
        env["model_revision"] = revision
    return env


def parameter_count(folder: Path) -> int:
    """The parameters in a folder's safetensors files (read from their headers)."""
    import math

    from safetensors import safe_open

    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def server_args(dtype: str, device: str, attn_implementation: str, seed: int, trust_remote_code: bool) -> list[str]:
    """The notebook's parameters as `transformers serve` options (the same for both servers)."""
    args = ["--dtype", dtype, "--device", device, "--default-seed", str(seed)]
    if attn_implementation:
        args += ["--attn-implementation", attn_implementation]
    return args + (["--trust-remote-code"] if trust_remote_code else [])


def servers(model: str, root: Path, args: list[str]) -> list[tuple[Any, Any]]:
    """[(process, openai client)] of plain `transformers serve` and `kvresume serve`, started together."""
    from kvresume.serving.folders import PLAIN, POOLED, launch, ready

    started = [launch(PLAIN, Path(model), root / "plain.log", *args),
               launch(POOLED, Path(model), root / "pooled.log", *args)]
    return [ready(*s, wait=300) for s in started]


def stop(running: list[tuple[Any, Any]]) -> None:
    for proc, _ in running:
        proc.terminate()
        proc.wait(30)


def turn(client: Any, model: str, messages: list[dict], new: int, kwargs: dict) -> dict[str, Any]:
    """One streamed greedy completion: its reply, seconds to the first content, prompt and cached tokens."""
    start, first, text, usage = time.perf_counter(), None, "", None
    extra = {"chat_template_kwargs": kwargs} if kwargs else {}
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=new, temperature=0,
                                                stream=True, stream_options={"include_usage": True}, extra_body=extra):
        piece = "".join(c.delta.content or "" for c in chunk.choices)
        if piece and first is None:
            first = time.perf_counter() - start
        text, usage = text + piece, chunk.usage or usage
    details = getattr(usage, "prompt_tokens_details", None)
    return dict(reply=text, first_s=first if first is not None else time.perf_counter() - start,
                prompt=usage.prompt_tokens if usage else None, cached=(details.cached_tokens or 0) if details else None)


def shared(a: list[int], b: list[int]) -> int:
    """How many leading ids two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def messages_for(words: list[str], turns: int, size: int, offset: int) -> list[str]:
    """`turns` user messages of `size` words each, from `words` starting at message `offset`."""
    return [" ".join(words[(offset + i) * size:(offset + i + 1) * size]) for i in range(turns)]


def tokenizer(model: str, revision: str | None, trust_remote_code: bool) -> Any:
    """The served model's tokenizer, to render each turn as the servers do."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(model, revision=revision, trust_remote_code=trust_remote_code)


def rendered(tok: Any, messages: list[dict], kwargs: dict) -> list[int]:
    """The prompt ids a server renders for `messages` (its chat template with the generation prompt)."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def chat_rows(running: list[tuple[Any, Any]], model: str, tok: Any, name: str, users: list[str],
              new: int) -> list[dict[str, Any]]:
    """One row per turn of chat `name` through both servers: tokens, what the renders share, timings, equal replies."""
    kwargs, rows = CHATS[name], []
    histories: tuple[list[dict], list[dict]] = ([], [])
    before: list[int] = []
    for i, user in enumerate(users):
        got = []
        for (_, client), messages in zip(running, histories):
            messages.append({"role": "user", "content": user})
            got.append(turn(client, model, messages, new, kwargs))
            messages.append({"role": "assistant", "content": got[-1]["reply"]})
        plain, pooled = got
        ids = rendered(tok, histories[1][:-1], kwargs)
        rows.append(dict(chat=name, turn=i + 1, prompt=pooled["prompt"], rendered=len(ids), before=len(before),
                         common=shared(before, ids), reused=pooled["cached"], plain_cached=plain["cached"],
                         reply=len(tok(plain["reply"], add_special_tokens=False)["input_ids"]),
                         plain_s=plain["first_s"], pooled_s=pooled["first_s"], equal=plain["reply"] == pooled["reply"]))
        before = ids
    return rows


def run(model: str, tok: Any, running: list[tuple[Any, Any]], turns: int, words: int, new: int) -> list[dict[str, Any]]:
    """Both chats, `turns` user messages of `words` words each (other words per chat), then a new chat as long as the
    last turn (the pool's miss: both servers prefill all of it), after one warm-up request per server."""
    from kvresume.serving.folders import corpus

    text = (" ".join(corpus()) * 8).split()
    for _, client in running:
        turn(client, model, [{"role": "user", "content": "warm up"}], 2, {})
    rows = []
    for k, name in enumerate(CHATS):
        rows += chat_rows(running, model, tok, name, messages_for(text, turns, words, k * turns), new)
    last = rows[turns - 1]
    long = " ".join(text[-max(last["rendered"], 1) * 2:])  # more text than the last turn: cut to its length below
    ids = tok(long, add_special_tokens=False)["input_ids"][:max(last["rendered"] - 8, 1)]
    miss = chat_rows(running, model, tok, "stable", [tok.decode(ids)], new)[0]
    return rows + [{**miss, "chat": "new chat", "turn": 1}]
