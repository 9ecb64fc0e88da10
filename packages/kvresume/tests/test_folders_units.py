"""The serving folders (kvresume.serving.folders) a real server loads, pinned without a server: the tokenizer's text,
entries and ChatML template, the two sizes, the saved chat and VLM folders (seeded weights, end and pad ids, 16 image
tokens per 32x32 picture)."""
from __future__ import annotations

import hashlib

import pytest
import torch
import transformers

from kvresume.serving import folders


@pytest.fixture(scope="module")
def tok():
    return folders.tokenizer()


def test_the_corpus_is_every_rotation_of_its_words_with_numbers():
    text = folders.corpus()
    words = text[0].split()[:-3]
    assert len(text) == len(words) == 146 and words[0] == "the" and words[-1] == "image"
    assert text[0].endswith("image 0 0, 0.") and text[1] == " ".join(words[1:] + words[:1]) + " 1 7, 13."
    assert hashlib.sha1("\n".join(text).encode()).hexdigest() == "ac78d53fd1051c9da666504576298ec555db6348"


def test_the_tokenizer_has_its_entries_special_tokens_and_template(tok):
    assert len(tok) == 1024 and tok.convert_ids_to_tokens([0, 1, 2]) == folders.SPECIAL
    assert (tok.eos_token, tok.pad_token, tok.bos_token, tok.unk_token) == ("<|im_end|>", "<|endoftext|>", None, None)
    messages = [{"role": "user", "content": "hi there"},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                                  {"type": "text", "text": "b"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\nab<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(messages[:1], tokenize=False) == "<|im_start|>user\nhi there<|im_end|>\n"
    ids = tok("the cache 12, 7.")["input_ids"]
    assert tok.decode(ids) == "the cache 12, 7." and len(ids) < 8  # byte-level BPE, merges learned
    assert tok("the cache 12, 7. Resume the prefix!")["input_ids"] == [334, 470, 567, 14, 556, 16, 223, 52, 71, 408, 272,
                                                                       504, 3]


def test_the_two_sizes(tok, monkeypatch):
    cfg = folders.config("tiny", tok)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.tie_word_embeddings) == (1024, 4096, False)
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (2, 0, None)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (64, 2, 2)
    monkeypatch.setattr(folders, "tokenizer", lambda: tok)  # (trained once, in the fixture)
    assert folders.parameters("tiny") == 205120


def test_the_chat_folder_holds_the_seeded_model_and_its_tokenizer(tmp_path, tok):
    path = folders.chat_folder(tmp_path / "chat")
    assert path == tmp_path / "chat"
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    want = transformers.LlamaForCausalLM(folders.config("tiny", tok))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), want.state_dict().values()))
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (2, 0)
    assert transformers.AutoTokenizer.from_pretrained(path).chat_template == folders.TEMPLATE
    other = transformers.AutoModelForCausalLM.from_pretrained(folders.chat_folder(tmp_path / "seeded", seed=1))
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_the_vlm_folder_places_16_image_tokens_per_picture(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    path = folders.vlm_folder(tmp_path / "vlm")
    processor = transformers.AutoProcessor.from_pretrained(path)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(path)
    image = model.config.image_token_index
    assert processor.tokenizer.convert_ids_to_tokens(image) == "<image>"
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (2, 0)
    vision = model.config.vision_config
    assert (vision.hidden_size, vision.intermediate_size, vision.num_hidden_layers, vision.num_attention_heads,
            vision.image_size, vision.patch_size) == (32, 64, 2, 2, 32, 8)
    assert model.config.vision_feature_layer == -1 and model.config.vision_feature_select_strategy == "default"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text == "<|im_start|>user\n<image>what<|im_end|>\n<|im_start|>assistant\n"
    picture = Image.fromarray((torch.arange(40 * 40 * 3).view(40, 40, 3) % 251).to(torch.uint8).numpy())
    got = processor(text=text, images=picture, return_tensors="pt")
    assert int((got["input_ids"] == image).sum()) == 16 and tuple(got["pixel_values"].shape) == (1, 3, 32, 32)
    assert float(got["pixel_values"].double().abs().sum()) == pytest.approx(1632.087, abs=0.05)  # resized to 32, cropped
    torch.manual_seed(0)
    want = transformers.LlavaForConditionalGeneration(model.config)
    assert torch.equal(want.lm_head.weight, model.lm_head.weight)
