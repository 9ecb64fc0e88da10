"""`kvresume serve` against plain `transformers serve`: two real server processes on localhost over tiny local model
folders (a chat model with a byte-level BPE tokenizer and a chat template; a LLaVA-style VLM with a PIL image
processor), both talked to with the official `openai` client. Every reply is equal; the pooled server reports the
cached tokens its pool reused (and the plain one none)."""
from __future__ import annotations

import threading

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Both servers at once, without a model: each loads the folder a request names (the chat and the VLM)."""
    pytest.importorskip("PIL")  # the VLM's image processor
    from kvresume.serving.folders import POOLED, PLAIN, chat_folder, launch, ready, vlm_folder

    root = tmp_path_factory.mktemp("serve")
    folders = {"chat": chat_folder(root / "chat-tiny"), "vlm": vlm_folder(root / "vlm-tiny")}
    launched = [launch(PLAIN, None, root / "plain.log"), launch(POOLED, None, root / "pooled.log")]
    try:
        (_, plain), (_, pooled) = [ready(*one) for one in launched]
        yield folders, plain, pooled, root / "pooled.log"
    finally:
        for proc, _, _ in launched:
            proc.terminate()
            proc.wait(30)


def ask(client, folder, messages, stream=False, **extra):
    """(reply text, prompt tokens, cached tokens or None) of one chat completion."""
    args = dict(model=str(folder), messages=messages, max_tokens=10, **{"temperature": 0, **extra})
    if not stream:
        r = client.chat.completions.create(**args)
        details = r.usage.prompt_tokens_details
        return r.choices[0].message.content, r.usage.prompt_tokens, details and details.cached_tokens
    text, usage = "", None
    for chunk in client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    details = usage and usage.prompt_tokens_details
    return text, usage and usage.prompt_tokens, details and details.cached_tokens


def both(servers, messages, kind="chat", **extra):
    folders, plain, pooled, _ = servers
    a, b = ask(plain, folders[kind], messages, **extra), ask(pooled, folders[kind], messages, **extra)
    assert a[0] == b[0] and (a[1] is None or a[1] == b[1]), (a, b)
    assert not a[2]  # plain transformers serve reuses nothing
    return b


def user(i: int, topic: str = "cache") -> dict:
    return {"role": "user", "content": f"turn {i}: say more about the {topic} and the model, number {i * 7}"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_multi_turn_chat_answers_as_plain_serve_and_reports_cached_tokens(servers, stream):
    messages, cached = [], []
    for i in range(4):
        messages.append(user(i, "stream" if stream else "cache"))
        text, prompt, hit = both(servers, messages, stream=stream)
        cached.append(hit)
        messages.append({"role": "assistant", "content": text})
    assert all(c is not None for c in cached) and cached == sorted(set(cached)) and cached[1] > 12, cached


def test_a_regenerated_answer_and_an_edited_message(servers):
    messages = [user(0, "regenerate")]
    text, prompt, _ = both(servers, messages)
    assert both(servers, messages)[2] == prompt - 1  # the same prompt again: all but one token reused
    messages += [{"role": "assistant", "content": text}, user(1, "regenerate")]
    _, before, _ = both(servers, messages)
    messages[-1] = {"role": "user", "content": "turn 1: say more about the EDITED message"}
    _, prompt, hit = both(servers, messages)
    assert 0 < hit < before - 8  # reused up to the edit, not past it


def test_penalties_stop_and_seeded_sampling_answer_as_plain_serve(servers):
    messages = [user(0, "penalty")]
    text = both(servers, messages)[0]
    messages += [{"role": "assistant", "content": text}, user(1, "penalty")]
    assert both(servers, messages, frequency_penalty=0.5)[2] == 0  # re-prefilled: the penalty reads the whole input
    stop = text[2:5] or "e"
    both(servers, messages, stop=[stop])
    both(servers, messages, temperature=1.0, seed=7)


def test_two_clients_at_once(servers):
    folders, plain, pooled, _ = servers
    folder = folders["chat"]
    want = {i: ask(plain, folder, [user(i, f"client {i}")])[0] for i in range(2)}
    got: dict[int, str] = {}

    def run(i: int) -> None:
        got[i] = ask(pooled, folder, [user(i, f"client {i}")])[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_each_request_logs_what_was_reused_and_why(servers):
    lines = [line for line in servers[3].read_text().splitlines() if line.startswith("kvresume: request")]
    assert lines and all("reused" in line and "fed (" in line for line in lines)


def picture(seed: int) -> dict:
    """An image_url part: a 40x40 PNG of seeded noise as a data URI."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.random.RandomState(seed).rand(40, 40, 3) * 255).astype("uint8")).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_images_as_data_uris_answer_as_plain_serve_and_are_keyed_by_pixels(servers):
    def chat(first: int) -> list[int]:
        messages, cached = [], []
        for i, part in enumerate([picture(first), None, picture(9)]):
            text = {"type": "text", "text": f"turn {i}: what is in the picture"}
            messages.append({"role": "user", "content": [part, text] if part else [text]})
            reply, _, hit = both(servers, messages, kind="vlm")
            cached.append(hit)
            messages.append({"role": "assistant", "content": reply})
        return cached

    first = chat(1)
    assert first[1] > 20 and first[2] > first[1]  # the image of turn 0 reused by pixels, then the text after it
    other = chat(2)  # another first picture behind the same placeholder ids
    assert other[0] <= 5 and other[1] > 20  # only the text before the image; then this chat's own image reused
