"""The reporter's own input for notebook 06: `prompt_text`, `prompt_ids` (a JSON file) and `generate_kwargs`.

prompt_text: with a tokenizer, the model's chat template (image + text for a multimodal checkpoint; a
text model without a chat template: the tokenizer alone). The tiny defaults have no tokenizer: their
prompt is the text's UTF-8 bytes mapped to ids `BYTE_OFFSET + byte` (deterministic, not a real
tokenisation; the tiny Qwen3-VL gets its synthetic image block first). prompt_ids: a JSON list of token
ids (or {"input_ids": [...]}), batch 1, used as they are (text only).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..inputs import TINY_TEXT_AFTER, TINY_TEXT_BEFORE, Prompt, build_prompt
from ..models import ModelBundle
from ..pipeline.run.params import check_generate_kwargs, read_ids

BYTE_OFFSET = 10  # byte b -> token id 10 + b: clear of the first ids, below every tiny vocabulary (2048)


def byte_ids(text: str) -> list[int]:
    """The tiny models' prompt_text mapping: UTF-8 bytes -> BYTE_OFFSET + byte."""
    return [BYTE_OFFSET + b for b in text.encode("utf-8")]


def _tiny_with_image(bundle: ModelBundle, text_ids: list[int]) -> Prompt:
    """The tiny Qwen3-VL's synthetic image block, then the text's ids."""
    base = build_prompt(bundle)  # TINY_TEXT_BEFORE synthetic text ids, the image block, TINY_TEXT_AFTER more
    block = base.input_ids[:, TINY_TEXT_BEFORE:base.length - TINY_TEXT_AFTER]  # vision start, image tokens, vision end
    new = torch.cat([block, torch.tensor([text_ids], device=block.device)], dim=1)
    mm = dict(base.mm_kwargs)
    if "mm_token_type_ids" in mm:
        mm["mm_token_type_ids"] = (new == bundle.model.config.image_token_id).long()
    return Prompt(new, torch.ones_like(new), mm)


def build(bundle: ModelBundle, prompt_text: str, prompt_ids: str, seed: int) -> tuple[Prompt, str]:
    """(prompt, one line saying where it came from and how it was tokenised)."""
    device = bundle.device
    if prompt_ids:
        ids = torch.tensor([read_ids(prompt_ids)], device=device)
        return Prompt(ids, torch.ones_like(ids)), f"prompt_ids from {Path(prompt_ids).name}: {ids.shape[1]} ids, text only"
    if not prompt_text:
        prompt = build_prompt(bundle, seed=seed)
        return prompt, f"the kit's synthetic prompt ({prompt.length} tokens{', one synthetic 224x224 image' if prompt.is_multimodal else ''})"
    if bundle.tokenizer is None:
        ids = byte_ids(prompt_text)
        if len(ids) < 2:
            raise ValueError("prompt_text must give at least 2 tokens (bytes on a tiny model)")
        how = (f"prompt_text on a tiny model (no tokenizer): UTF-8 bytes -> ids {BYTE_OFFSET}+byte, {len(ids)} ids "
               "(deterministic, not a real tokenisation)")
        if bundle.is_multimodal:
            prompt = _tiny_with_image(bundle, ids)
            return prompt, how + f", after the synthetic image block ({prompt.length} tokens)"
        t = torch.tensor([ids], device=device)
        return Prompt(t, torch.ones_like(t)), how
    if bundle.is_multimodal:
        prompt = build_prompt(bundle, text=prompt_text, seed=seed)
        return prompt, f"prompt_text through the processor's chat template with one synthetic image ({prompt.length} tokens)"
    tok = bundle.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt_text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        how = "prompt_text through the tokenizer's chat template"
    else:
        ids, how = tok(prompt_text, return_tensors="pt")["input_ids"], "prompt_text through the tokenizer (no chat template)"
    ids = ids.to(device)
    return Prompt(ids, torch.ones_like(ids)), f"{how} ({ids.shape[1]} tokens)"


def generate_options(value: Any) -> dict[str, Any]:
    """generate_kwargs as a dict (a JSON text is parsed); the runner's check (a ValueError) for anything the controls
    cannot pass on."""
    check_generate_kwargs(value)
    return json.loads(value) if isinstance(value, str) else value


def record(prompt_text: str, prompt_ids: str, how: str, ids: torch.Tensor) -> dict[str, Any]:
    """The prompt as the results file keeps it: the text given, or the ids file's name and its ids, and the ids
    of the sequence that ran (a pattern may extend the prompt: a second turn, generated tokens, a padded batch)."""
    source = "prompt_ids" if prompt_ids else "prompt_text" if prompt_text else "synthetic"
    out: dict[str, Any] = {"source": source, "how": how}
    if prompt_ids:
        out |= {"ids_file": Path(prompt_ids).name, "ids": read_ids(prompt_ids)}
    if prompt_text:
        out["text"] = prompt_text
    return out | {"sequence_ids": ids.tolist()}
