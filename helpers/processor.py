"""A Qwen3-VL checkpoint's processor, with a torchvision-free fallback.

On transformers 5.x `AutoProcessor.from_pretrained` of a Qwen3-VL checkpoint builds a video processor
that needs torchvision, and fails where torchvision is missing, although the notebooks only feed one
image. The fallback builds what they need from the same folder or hub repository: the checkpoint's
tokenizer and chat template, and its image processor settings in the torchvision-free image processor
class (`compat.image_processor_class()`). It renders the chat template and expands each image token as
`Qwen3VLProcessor` does, so input_ids, attention_mask, pixel_values, image_grid_thw and
mm_token_type_ids come out the same (tests/test_real_folders.py compares both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from kvresume.compat import image_processor_class
from transformers import AutoProcessor, AutoTokenizer
from transformers.image_utils import load_image
from transformers.processing_utils import ProcessorMixin


@dataclass
class TokenizerImageProcessor:
    """The image + text part of a Qwen3-VL processor: tokenizer, chat template, image processor."""

    tokenizer: Any
    image_processor: Any
    chat_template: str
    image_token: str = "<|image_pad|>"
    video_token: str = "<|video_pad|>"

    def expand_image_tokens(self, text: str, image_grid_thw: torch.Tensor) -> str:
        """Each image token in turn becomes grid.prod() // merge_size**2 of them (as Qwen3VLProcessor does)."""
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(image_grid_thw):
            raise ValueError(f"{len(pieces) - 1} image tokens in the prompt but {len(image_grid_thw)} images")
        merge_length = int(self.image_processor.merge_size) ** 2
        tokens = [self.image_token * (int(grid.prod()) // merge_length) for grid in image_grid_thw]
        return "".join(piece + token for piece, token in zip(pieces, tokens + [""]))

    def __call__(self, text: str, images: list[Any] | None = None, return_tensors: str = "pt",
                 add_special_tokens: bool = True) -> dict[str, torch.Tensor]:
        """Tokens of `text` with its image tokens expanded, plus pixel_values / image_grid_thw of `images`."""
        data: dict[str, Any] = {}
        if images:
            pixels = self.image_processor(images=images, return_tensors=return_tensors)
            data.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
            text = self.expand_image_tokens(text, pixels["image_grid_thw"])
        enc = self.tokenizer([text], padding=False, return_token_type_ids=False,
                             add_special_tokens=add_special_tokens, return_tensors=return_tensors)
        ids, token_id = enc["input_ids"], self.tokenizer.convert_tokens_to_ids
        # mm_token_type_ids: 1 on image tokens, 2 on video tokens
        types = (ids == token_id(self.image_token)).long() + 2 * (ids == token_id(self.video_token)).long()
        return {"input_ids": ids, "attention_mask": enc["attention_mask"], "mm_token_type_ids": types, **data}

    def apply_chat_template(self, conversation: list[dict[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = True, return_dict: bool = True,
                            return_tensors: str = "pt", **_: Any) -> Any:
        """Same call as `ProcessorMixin.apply_chat_template` for one conversation with images (no videos)."""
        text = self.tokenizer.apply_chat_template(conversation, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        if not tokenize:
            return text
        images = [block[key] for message in conversation if isinstance(message.get("content"), list)
                  for block in message["content"] if block.get("type") == "image"
                  for key in ("image", "url", "path") if key in block]
        bos = self.tokenizer.bos_token
        out = self(text, [load_image(i) if isinstance(i, str) else i for i in images], return_tensors,
                   add_special_tokens=not (bos is not None and text.startswith(bos)))
        return out if return_dict else out["input_ids"]


def fallback_processor(model_id: str, revision: str | None = None,
                       trust_remote_code: bool = False) -> TokenizerImageProcessor:
    """Tokenizer + chat template + torchvision-free image processor, each read by transformers from the checkpoint's
    files (the image processor settings from processor_config.json or preprocessor_config.json, the chat template
    from chat_template.jinja, chat_template.json or processor_config.json, else the tokenizer's)."""

    tokenizer = AutoTokenizer.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    image_processor = image_processor_class().from_pretrained(model_id, revision=revision)
    template = ProcessorMixin.get_processor_dict(model_id, revision=revision)[0].get("chat_template")
    if not (template or tokenizer.chat_template):
        raise FileNotFoundError(f"{model_id} has no chat template (chat_template.jinja, chat_template.json, "
                                "tokenizer_config.json)")
    return TokenizerImageProcessor(tokenizer, image_processor, template or tokenizer.chat_template)


def load_processor(model_id: str, revision: str | None = None, trust_remote_code: bool = False) -> tuple[Any, str]:
    """(processor, which path built it): AutoProcessor where it loads, else the fallback with the reason."""
    try:
        return AutoProcessor.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code), "AutoProcessor"
    except Exception as exc:  # noqa: BLE001 - any failure of the full processor sends us to the fallback
        why = f"{type(exc).__name__}: {str(exc).strip().split(chr(10))[0].split('. ')[0][:160]}"
    try:
        processor = fallback_processor(model_id, revision, trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - say why both paths failed
        raise RuntimeError(f"cannot build a processor for {model_id}: AutoProcessor failed ({why}); "
                           f"the tokenizer + image processor fallback failed ({type(exc).__name__}: {exc})") from exc
    return processor, f"fallback: tokenizer + {type(processor.image_processor).__name__} (AutoProcessor failed: {why})"
