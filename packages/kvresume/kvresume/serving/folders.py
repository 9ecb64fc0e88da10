"""Tiny local model folders a real server loads (nothing downloaded), and the server processes on localhost:
`chat_folder(path)` saves a seeded random Llama with a byte-level BPE tokenizer trained here on a fixed text and a
ChatML chat template, as `transformers serve` and `kvresume serve` load it from disk (`size="24M"`: the benchmark's
model; the default is tiny); `start(command, folder, log)` starts one on a free port and waits for its /health
(`launch` and `ready`, the two halves, start several at once).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
import transformers

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
            "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SIZES = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2),
         "24M": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                     num_key_value_heads=4)}


def corpus() -> list[str]:
    """The fixed text the tokenizer is trained on: English words and their pieces, digits, punctuation."""
    words = ("the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
             "word but what some we can out other were all there when up use your how said an each she which do their "
             "time if will way about many then them write would like so these her long make thing see him two has look"
             " more day could go come did number sound no most people my over know water than call first who may down "
             "side been now find any new work part take get place made live where after back little only round man "
             "year came show every good me give our under name very through just form sentence great think say help "
             "low line cache token model resume prefix server chat turn reply prompt image").split()
    return [" ".join(words[i:] + words[:i]) + f" {i} {i * 7}, {i * 13}." for i in range(len(words))]


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (1,024 entries) with the ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                                bos_token=None, unk_token=None)
    fast.chat_template = TEMPLATE
    return fast


def config(size: str, tok: transformers.PreTrainedTokenizerFast) -> transformers.LlamaConfig:
    """The chat model's config at `size`, for the chat tokenizer."""
    return transformers.LlamaConfig(vocab_size=len(tok), max_position_embeddings=4096, tie_word_embeddings=False,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                                    **SIZES[size])


def parameters(size: str) -> int:
    """The chat model's parameter count at `size` (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in transformers.LlamaForCausalLM(config(size, tokenizer())).parameters())


def chat_folder(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Save a seeded random Llama of `size` with the chat tokenizer into `path` (made if missing); returns the path."""
    path = Path(path)
    tok = tokenizer()
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config(size, tok)).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


PLAIN = [str(Path(sys.executable).with_name("transformers")), "serve"]  # transformers' own CLI, beside this python
POOLED = [sys.executable, "-m", "kvresume", "serve"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start(command: list[str], folder: Path | None, log: Path, *extra: str,
          wait: float = 120) -> tuple[subprocess.Popen, Any]:
    """(the server process, an openai client of it): `command [MODEL] --port P extra`, offline, once /health answers
    (without a MODEL, a server loads each request's model folder on its first request)."""
    return ready(*launch(command, folder, log, *extra), wait=wait)


def launch(command: list[str], folder: Path | None, log: Path, *extra: str) -> tuple[subprocess.Popen, int, Path]:
    """The server process started on a free port (not yet answering): (process, port, log)."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    model = [str(folder)] if folder is not None else []
    proc = subprocess.Popen([*command, *model, "--port", str(port), *extra], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env)
    return proc, port, log


def ready(proc: subprocess.Popen, port: int, log: Path, wait: float = 120) -> tuple[subprocess.Popen, Any]:
    """(the process, an openai client of it) once its /health answers; the log's tail where it exits or times out."""
    import openai

    client = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="none", max_retries=0, timeout=600)
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(f"http://localhost:{port}/health", timeout=5).close()
            return proc, client
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError(log.read_text()[-3000:])


VLM_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
                "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
                "{% elif p['type'] == 'text' %}"
                "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vlm_folder(path: str | Path, seed: int = 0) -> Path:
    """Save a seeded random LLaVA (a 2-layer CLIP tower on 32x32 images: 16 image tokens, the tiny Llama) with a PIL
    image processor (no torchvision) and the chat tokenizer plus `<image>` into `path`; returns the path."""
    path = Path(path)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image = tok.convert_tokens_to_ids("<image>")
    text = config("tiny", tok)
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8)
    cfg = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=image,
                                   vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    pixels = transformers.CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(image_processor=pixels, tokenizer=tok, patch_size=8,
                                            vision_feature_select_strategy="default", chat_template=VLM_TEMPLATE,
                                            num_additional_image_tokens=1)  # CLIP's class token ("default" drops it)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
