"""Local checkpoint folders shaped like Qwen/Qwen3-VL-2B-Instruct, for offline tests of the real loading path.

Each folder holds a tiny random Qwen3-VL (the kit's tiny config with the tokenizer's special token ids),
a byte-level BPE tokenizer carrying Qwen's special tokens, a Qwen3-VL-style chat template, the image
processor settings of the real repository and a generation_config.json that asks for sampling as the
real one does. Two file layouts exist on the hub and in the wild:

- "legacy": preprocessor_config.json (Qwen2VLImageProcessorFast), video_preprocessor_config.json,
  chat_template.json;
- "v5": processor_config.json (image and video processor sections) and chat_template.jinja, as
  transformers 5 saves a processor.

The JSON files are written directly: saving a processor would need torchvision (its video processor).
"""
from __future__ import annotations

import json
from pathlib import Path

LAYOUTS = ("legacy", "v5")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")

# Image processor settings of Qwen/Qwen3-VL-2B-Instruct (its preprocessor_config.json).
IMAGE_PROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
# Its video_preprocessor_config.json.
VIDEO_PROCESSOR = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "video_processor_type": "Qwen3VLVideoProcessor",
}
# Sampling settings as the real generation_config.json sets them (Qwen3-VL Instruct's recommended ones).
SAMPLING = {"do_sample": True, "top_k": 20, "top_p": 0.8, "temperature": 0.7, "repetition_penalty": 1.0}

# A Qwen3-VL-style chat template: ChatML turns, each image as <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

CORPUS = (
    "Describe the image in one word.", "What is in this picture? Answer briefly.",
    "The quick brown fox jumps over the lazy dog.", "A red square on a blue and green gradient.",
    "user assistant system", "You are a helpful assistant.", "one two three four five six seven eight nine ten",
)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tokenizer(folder: Path, vocab_size: int = 400) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE with Qwen's special tokens; returns their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(CORPUS) * 4, trainer)
    # Appended after the learned vocabulary, as in the real tokenizer.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(folder / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    _write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "unk_token": None, "errors": "replace", "add_prefix_space": False,
        "model_max_length": 262144, "split_special_tokens": False,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for t, i in ids.items()},
    })
    return ids


def build_model(folder: Path, ids: dict[str, int], seed: int = 0) -> None:
    """config.json + model.safetensors of a tiny random Qwen3-VL using the tokenizer's special ids."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from kvresume import testing

    config = testing.vl_config(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                               vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    Qwen3VLForConditionalGeneration(config).eval().save_pretrained(folder)


def build_generation_config(folder: Path, ids: dict[str, int]) -> None:
    """generation_config.json asking for sampling, as the real repository's does."""
    _write_json(folder / "generation_config.json", {
        "bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], **SAMPLING,
    })


def build_processor_files(folder: Path, layout: str) -> None:
    """The processor side: legacy (three files) or transformers 5 (processor_config.json + chat_template.jinja)."""
    if layout == "legacy":
        _write_json(folder / "preprocessor_config.json", {**IMAGE_PROCESSOR, "processor_class": "Qwen3VLProcessor"})
        _write_json(folder / "video_preprocessor_config.json", {**VIDEO_PROCESSOR, "processor_class": "Qwen3VLProcessor"})
        _write_json(folder / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    elif layout == "v5":
        _write_json(folder / "processor_config.json", {"processor_class": "Qwen3VLProcessor",
                                                       "image_processor": IMAGE_PROCESSOR,
                                                       "video_processor": VIDEO_PROCESSOR})
        (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    else:
        raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")


def build_folder(folder: Path, layout: str, seed: int = 0) -> Path:
    """A complete local checkpoint folder in `layout` ("legacy" or "v5")."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder)
    build_model(folder, ids, seed)
    build_generation_config(folder, ids)
    build_processor_files(folder, layout)
    return folder
