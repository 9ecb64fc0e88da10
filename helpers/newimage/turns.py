"""The two-turn prompt: turn 1 (the kit's 82-token seed prompt with image A) cached, turn 2 (text, a new image B,
text) not yet processed, and what every call shape is compared with (one forward over both turns)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import image_utils

from kvresume import compat
from ..compare import noise_floor as floor_of
from ..continuation import generate_first_step, other_attention_logits, prefill
from ..inputs import Prompt, build_prompt, synthetic_image, tiny_image_ids
from ..models import ModelBundle

# Turn 2 of the tiny default: 8 text tokens, vision start, image B's tokens, vision end, 14 text tokens
# (49 tokens with a 160x160 image: 5x5 merged patches = 25 image tokens).
TURN2_TEXT_BEFORE, TURN2_TEXT_AFTER = 8, 14
TURN2_TEXT = "And this one? One word."


@dataclass
class TwoTurns:
    """Turn 1 (a Prompt, cached whole), turn 2's ids and image B, and the full sequence they make."""

    turn1: Prompt
    turn2_ids: torch.Tensor
    pixel_b: torch.Tensor
    grid_b: torch.Tensor
    image_token_id: int
    takes_types: bool  # whether this release's forward takes mm_token_type_ids

    @property
    def cached(self) -> int:
        return self.turn1.length

    @property
    def full_ids(self) -> torch.Tensor:
        return torch.cat([self.turn1.input_ids, self.turn2_ids], dim=1)

    @property
    def full_mask(self) -> torch.Tensor:
        return torch.ones_like(self.full_ids)

    def types(self, ids: torch.Tensor) -> torch.Tensor:
        """mm_token_type_ids of `ids`: 1 on image tokens, 0 elsewhere."""
        return (ids == self.image_token_id).long()

    @property
    def pixel_a(self) -> torch.Tensor:
        return self.turn1.mm_kwargs["pixel_values"]

    @property
    def grid_a(self) -> torch.Tensor:
        return self.turn1.mm_kwargs["image_grid_thw"]

    @property
    def both_grids(self) -> torch.Tensor:
        return torch.cat([self.grid_a, self.grid_b], dim=0)

    def image_b_span(self) -> tuple[int, int]:
        """[start, end) of image B's tokens inside turn 2."""
        where = (self.turn2_ids[0] == self.image_token_id).nonzero().flatten()
        return int(where[0]), int(where[-1]) + 1

    def full_prompt(self) -> Prompt:
        """Both turns as one prompt (both images): the reference's input."""
        mm = {"pixel_values": torch.cat([self.pixel_a, self.pixel_b], dim=0), "image_grid_thw": self.both_grids}
        if self.takes_types:
            mm["mm_token_type_ids"] = self.types(self.full_ids)
        return Prompt(self.full_ids, self.full_mask, mm)

    def text_turn(self) -> tuple[torch.Tensor, Prompt]:
        """The control: turn 2 without its image block (text only), and both turns as one prompt for its reference."""
        start, end = self.image_b_span()
        ids = torch.cat([self.turn2_ids[:, :start - 1], self.turn2_ids[:, end + 1:]], dim=1)
        full = torch.cat([self.turn1.input_ids, ids], dim=1)
        return ids, Prompt(full, torch.ones_like(full), dict(self.turn1.mm_kwargs, **(
            {"mm_token_type_ids": self.types(full)} if self.takes_types else {})))


def build(bundle: ModelBundle, seed: int = 0, image_a: int = 224, image_b: int = 160,
          text: str = TURN2_TEXT, picture_a: Any = None, picture_b: Any = None) -> TwoTurns:
    """Turn 1 = the kit's prompt with image A, turn 2 = text, image B, text. The images are synthetic test cards of
    image_a / image_b pixels a side, or `picture_a` / `picture_b` (a path, a URL online, or a PIL image)."""
    turn1 = build_prompt(bundle, seed=seed, image_size=image_a,
                         image=None if picture_a is None else image_utils.load_image(picture_a))
    # the synthetic B is mirrored: a different image from A, not only a smaller one
    picture = synthetic_image(image_b).transpose(0) if picture_b is None else image_utils.load_image(picture_b)
    if bundle.tokenizer is None:
        pixels = bundle.processor(images=[picture], return_tensors="pt")
        ids = tiny_image_ids(bundle, pixels["image_grid_thw"], TURN2_TEXT_BEFORE, TURN2_TEXT_AFTER, seed + 1)
    else:  # turn 2 as the checkpoint's chat template renders a follow-up user message (image + text) after turn 1
        message = {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": text}]}
        pixels = bundle.processor.apply_chat_template([message], tokenize=True, add_generation_prompt=True,
                                                      return_dict=True, return_tensors="pt")
        ids = pixels["input_ids"]
    grid = pixels["image_grid_thw"]
    device = bundle.device
    return TwoTurns(turn1, ids.to(device), pixels["pixel_values"].to(device, bundle.dtype), grid.to(device),
                    int(bundle.model.config.image_token_id), compat.accepts_mm_token_type_ids(bundle.model))


@torch.no_grad()
def reference(model: torch.nn.Module, turns: TwoTurns) -> torch.Tensor:
    """Last-position logits of one forward over both turns with both images (the one-forward reference)."""
    return prefill(model, turns.full_prompt(), end=None)[0]


@torch.no_grad()
def turn1_cache(model: torch.nn.Module, turns: TwoTurns) -> Any:
    """The cache after prefilling all of turn 1 (image A); leaves the model's rope_deltas at turn 1's value."""
    compat.set_rope_state(model, None)
    return prefill(model, turns.turn1, end=None)[1]


@torch.no_grad()
def noise_floor(model: torch.nn.Module, turns: TwoTurns, reference_logits: torch.Tensor, dtype: torch.dtype) -> Any:
    """The floor: how far two computations that must equal the reference are from it in this run and dtype (both
    turns prefilled but the last token, then generate() on it; the same forward with the other attention kernel)."""
    full = turns.full_prompt()
    compat.set_rope_state(model, None)
    _, cache = prefill(model, full)
    split = generate_first_step(model, full.last_token, cache, attention_mask=full.attention_mask)
    if not split.ok:
        raise RuntimeError(f"the valid split of both turns failed: {split.error_summary()}")
    other, kernel = other_attention_logits(model, full)
    return floor_of(reference_logits, [split.logits, other], dtype,
                    what=f"both turns in one forward vs (prefill all but the last token + generate() it) and vs {kernel}")
