"""The cache families of notebook 07, each a seeded tiny model with its prompt and full-forward reference.

dense (text-only, full attention), multimodal (tiny Qwen3-VL, one synthetic image), sliding (sliding and
full attention layers interleaved, prompt longer than the window), hybrid (tiny Qwen3.5: linear and full
attention layers) and a left-padded batch of two prompts of different lengths on the dense model. The
cache holds `prompt[:-1]`; `prompt[-1]` is the unprocessed suffix every continuation feeds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from ..continuation import current_position_ids
from ..inputs import Prompt, build_prompt
from ..models import ModelBundle

FAMILIES = ("dense", "multimodal", "sliding", "hybrid", "padded_batch")
WHAT = {
    "dense": "text-only, full attention (DynamicLayer)",
    "multimodal": "Qwen3-VL, one synthetic image (M-RoPE, rope_deltas on the model)",
    "sliding": "sliding/full attention interleaved (DynamicSlidingWindowLayer)",
    "hybrid": "Qwen3.5: linear attention (LinearAttentionLayer) and full attention",
    "padded_batch": "dense model, two prompts left-padded to one length",
}


def synthetic_ids(length: int, vocab: int, seed: int) -> torch.Tensor:
    """[1, length] deterministic token ids clear of the first and last ten ids."""
    return torch.randint(10, vocab - 10, (1, length), generator=torch.Generator().manual_seed(seed))


def left_pad(rows: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D token rows -> (input_ids, attention_mask), left-padded to the longest row (mask 0 on padding)."""
    flat = [r.reshape(-1).long() for r in rows]
    ids = pad_sequence(flat, batch_first=True, padding_value=pad_id, padding_side="left")
    return ids, pad_sequence([torch.ones_like(r) for r in flat], batch_first=True, padding_side="left")


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch as generate() derives them: cumulative mask - 1 (padding clamped to 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


@dataclass
class Family:
    """One row of the table: the model, its prompt, what the continuation is compared with."""

    name: str
    bundle: ModelBundle
    prompt: Prompt
    rows: list[torch.Tensor] = field(default_factory=list)  # the unpadded rows (padded batch only)

    @property
    def model(self) -> torch.nn.Module:
        return self.bundle.model

    @property
    def padded(self) -> bool:
        return bool(self.rows)

    @property
    def processed_length(self) -> int:
        return self.prompt.length - 1

    @property
    def suffix(self) -> torch.Tensor:
        return self.prompt.input_ids[:, -1:]

    @property
    def full_mask(self) -> torch.Tensor:
        """Cached prefix + unprocessed suffix (the padded batch: its padding zeros included)."""
        return self.prompt.attention_mask

    def prefill_kwargs(self) -> dict[str, Any]:
        """Forward kwargs over prompt[:-1]; a padded batch gets generate()'s mask-derived positions."""
        kwargs = self.prompt.prefix_kwargs()
        if self.padded:
            kwargs["position_ids"] = mask_positions(self.prompt.attention_mask)[:, :-1]
        return kwargs

    def current_positions(self) -> torch.Tensor:
        """Explicit position ids of the suffix token (M-RoPE ids with rope_deltas for Qwen3-VL; per row for a batch)."""
        if self.padded:
            return mask_positions(self.prompt.attention_mask)[:, -1:]
        return current_position_ids(self.model, self.prompt)


def text_family(name: str, bundle: ModelBundle, length: int, seed: int) -> Family:
    """A batch-1 text prompt of `length` synthetic tokens."""
    vocab = int(bundle.model.config.get_text_config().vocab_size)
    ids = synthetic_ids(length, vocab, seed).to(bundle.device)
    return Family(name, bundle, Prompt(ids, torch.ones_like(ids)))


def padded_family(bundle: ModelBundle, lengths: tuple[int, int], seed: int) -> Family:
    """Two prompts of different lengths, left-padded into one batch (the padding id is 0)."""
    vocab = int(bundle.model.config.get_text_config().vocab_size)
    rows = [synthetic_ids(n, vocab, seed + 1 + i).reshape(-1) for i, n in enumerate(lengths)]
    ids, mask = left_pad(rows)
    return Family("padded_batch", bundle, Prompt(ids.to(bundle.device), mask.to(bundle.device)),
                  [r.to(bundle.device) for r in rows])


@torch.no_grad()
def reference(family: Family) -> torch.Tensor:
    """Last-position logits of one forward over the whole prompt; a padded batch: each row unpadded, stacked."""
    model = family.model
    if family.padded:
        return torch.cat([model(input_ids=r.reshape(1, -1)).logits[:, -1, :] for r in family.rows]).detach().clone()
    return model(**family.prompt.forward_kwargs(None)).logits[:, -1, :].detach().clone()


def build_all(dense: ModelBundle, others: dict[str, ModelBundle], prompt_length: int, sliding_prompt_length: int,
              padded_lengths: tuple[int, int], seed: int) -> dict[str, Family]:
    """The five families in table order; `others`: bundles for multimodal, sliding and hybrid."""
    return {
        "dense": text_family("dense", dense, prompt_length, seed),
        "multimodal": Family("multimodal", others["multimodal"], build_prompt(others["multimodal"], seed=seed)),
        "sliding": text_family("sliding", others["sliding"], sliding_prompt_length, seed),
        "hybrid": text_family("hybrid", others["hybrid"], prompt_length, seed),
        "padded_batch": padded_family(dense, padded_lengths, seed),
    }


def window(bundle: ModelBundle) -> int | None:
    """The sliding window of a model's text config (None: no sliding layers)."""
    text = bundle.model.config.get_text_config()
    types = getattr(text, "layer_types", None) or []
    return getattr(text, "sliding_window", None) if "sliding_attention" in types else None
