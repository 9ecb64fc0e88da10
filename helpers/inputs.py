"""Prompts: the seed's one synthetic 224x224 image plus text, and the prefix/suffix split of it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from kvresume.compat import accepts_mm_token_type_ids
from .models import TINY_VL_TOKENS, ModelBundle

PROMPT_TEXT = "Describe the image in one word."
# The tiny default's synthetic text around the image block (vision start + 49 image tokens + vision end = 51):
# 12 + 51 + 19 = 82 tokens, the control's full multimodal length, so the cached prefix is 81 and the full
# mask [1, 82], as in the source.
TINY_TEXT_BEFORE, TINY_TEXT_AFTER = 12, 19


@dataclass
class Prompt:
    """Token ids, full attention mask and the multimodal tensors of one batch-1 prompt."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mm_kwargs: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def is_multimodal(self) -> bool:
        return bool(self.mm_kwargs)

    def forward_kwargs(self, end: int | None = None) -> dict[str, Any]:
        """Keyword arguments for a forward pass over input_ids[:, :end] (the whole prompt by default)."""
        mm = {name: value[:, :end] if name == "mm_token_type_ids" else value for name, value in self.mm_kwargs.items()}
        return {"input_ids": self.input_ids[:, :end], "attention_mask": self.attention_mask[:, :end], **mm}

    def prefix_kwargs(self) -> dict[str, Any]:
        """The already processed part: everything but the last token."""
        return self.forward_kwargs(end=-1)

    @property
    def last_token(self) -> torch.Tensor:
        """The one unprocessed token the continuation feeds (shape [1, 1])."""
        return self.input_ids[:, -1:]


def synthetic_image(size: int = 224) -> Image.Image:
    """A deterministic RGB test card: two gradients and a square (no randomness, no files)."""
    ramp = np.linspace(0, 255, size, dtype=np.float64).astype(np.uint8)
    arr = np.zeros((size, size, 3), dtype=np.uint8)
    arr[..., 0] = ramp[:, None]
    arr[..., 1] = ramp[None, :]
    lo, hi = size // 4, 3 * size // 4
    arr[lo:hi, lo:hi, 2] = 255
    return Image.fromarray(arr)


def tiny_image_ids(bundle: ModelBundle, grid: torch.Tensor, before: int, after: int, seed: int) -> torch.Tensor:
    """Seeded text ids, an image block as long as `grid` makes it, text ids: a tiny model's prompt (no tokenizer)."""
    cfg = bundle.model.config
    n_image = int(grid.prod()) // (cfg.vision_config.spatial_merge_size ** 2)
    text_vocab = min(TINY_VL_TOKENS.values()) - 100  # synthetic text ids stay clear of the special ids
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(10, text_vocab, (1, before), generator=gen)
    tail = torch.randint(10, text_vocab, (1, after), generator=gen)
    image_block = torch.tensor([[cfg.vision_start_token_id] + [cfg.image_token_id] * n_image + [cfg.vision_end_token_id]])
    return torch.cat([head, image_block, tail], dim=1)


def _tiny_multimodal(bundle: ModelBundle, image: Image.Image, seed: int) -> Prompt:
    pixels = bundle.processor(images=[image], return_tensors="pt")
    grid = pixels["image_grid_thw"]
    ids = tiny_image_ids(bundle, grid, TINY_TEXT_BEFORE, TINY_TEXT_AFTER, seed)
    mm = {"pixel_values": pixels["pixel_values"], "image_grid_thw": grid}
    if accepts_mm_token_type_ids(bundle.model):
        mm["mm_token_type_ids"] = (ids == bundle.model.config.image_token_id).long()
    return Prompt(ids, torch.ones_like(ids), mm)


def _real_multimodal(bundle: ModelBundle, image: Image.Image, text: str) -> Prompt:
    """The checkpoint's chat template and image processor (AutoProcessor or its fallback) decide the prompt:
    its settings may resize the image (a minimum pixel count), so the image token count comes from the run."""
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]
    enc = bundle.processor.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                               return_dict=True, return_tensors="pt")
    ids, mask = enc.pop("input_ids"), enc.pop("attention_mask")
    mm = {k: v for k, v in enc.items() if isinstance(v, torch.Tensor)}
    if not accepts_mm_token_type_ids(bundle.model):
        mm.pop("mm_token_type_ids", None)
    return Prompt(ids, mask, mm)


def _text(bundle: ModelBundle, text: str, seed: int, length: int = 24) -> Prompt:
    if bundle.tokenizer is None:
        vocab = int(bundle.model.config.get_text_config().vocab_size)
        ids = torch.randint(10, max(11, vocab - 10), (1, length), generator=torch.Generator().manual_seed(seed))
    else:
        ids = bundle.tokenizer(text, return_tensors="pt")["input_ids"]
        if ids.shape[1] < 2:
            raise ValueError(f"the tokenizer of {bundle.model_id} turned the prompt into {ids.shape[1]} token(s); need at least 2")
    return Prompt(ids, torch.ones_like(ids))


def build_prompt(bundle: ModelBundle, text: str = PROMPT_TEXT, seed: int = 0, image_size: int = 224,
                 image: Image.Image | None = None) -> Prompt:
    """The notebook prompt for this model: image (`image`, else a synthetic one) + text for Qwen3-VL, text alone for a
    text-only LM."""
    picture = synthetic_image(image_size) if image is None else image
    if not bundle.is_multimodal:
        prompt = _text(bundle, text, seed)
    elif bundle.tokenizer is None:
        prompt = _tiny_multimodal(bundle, picture, seed)
    else:
        prompt = _real_multimodal(bundle, picture, text)
    device = bundle.device
    return Prompt(prompt.input_ids.to(device), prompt.attention_mask.to(device),
                  {k: (v.to(device, bundle.dtype) if v.is_floating_point() else v.to(device)) for k, v in prompt.mm_kwargs.items()})
