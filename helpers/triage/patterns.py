"""The resume patterns notebook 06 triages (`-p pattern`) and the cache class of the prefix cache (`-p cache_class`).

A pattern turns the reporter's prompt into a `Resume` (the whole sequence, how many of its columns the
prefix cache holds, the unprocessed suffix after them) and builds that prefix cache the way the pattern's
threads do: a prefill of the prefix (`one_token`, `new_turn`, `prompt_reuse`, `batched`) or a first
`generate()` whose returned cache is resumed (`continue_generate`; how many columns that cache holds is read
from it, not assumed). `static` caches are transformers' own `StaticCache`, sized from the sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import StaticCache

from kvresume import compat
from ..inputs import Prompt
from ..models import ModelBundle
from .prompts import byte_ids

PATTERNS = ("one_token", "new_turn", "continue_generate", "prompt_reuse", "batched")
CACHE_CLASSES = ("dynamic", "static")
SECOND_TURN = "\nUser: and now in two words?\nAssistant:"  # new_turn's second user turn
OTHER_SUFFIX = " Or?"  # prompt_reuse's second suffix (suffix A is the prompt's last token)
FIRST_NEW_TOKENS = 3  # continue_generate: tokens the first generate() makes
STATIC_ROOM = 4  # static caches hold the sequence plus this many slots


@dataclass
class Resume(Prompt):
    """A prompt split for a resume: columns [:processed] are in the prefix cache, [processed:] is the unprocessed
    suffix."""

    processed: int = 0
    positions_from_mask: bool = False  # text model with padding: positions follow the mask (as generate() computes them)

    @property
    def last_token(self) -> torch.Tensor:
        """The unprocessed suffix (one token for one_token; a whole turn for new_turn), shape [batch, k]."""
        return self.input_ids[:, self.processed:]

    def forward_kwargs(self, end: int | None = None) -> dict[str, Any]:
        kwargs = super().forward_kwargs(end)
        if self.positions_from_mask:
            kwargs["position_ids"] = mask_positions(self.attention_mask)[:, :end]
        return kwargs

    def prefix_kwargs(self) -> dict[str, Any]:
        return self.forward_kwargs(end=self.processed)


@dataclass
class Case:
    """One pattern's resume, its prefix cache, and what building it measured (shown in the pattern table)."""

    pattern: str
    cache_class: str
    resume: Resume
    prefix_cache: Any
    notes: dict[str, Any] = field(default_factory=dict)
    second: Resume | None = None  # prompt_reuse: the other suffix on the same prefix


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """generate()'s positions from a (left-padded) mask: cumsum - 1, padding set to 1."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def new_cache(cache_class: str, model: torch.nn.Module, length: int) -> Any:
    """None (the model makes its DynamicCache) or a StaticCache holding `length` + STATIC_ROOM slots."""
    if cache_class == "dynamic":
        return None
    if cache_class == "static":
        return StaticCache(config=compat.text_config(model.config), max_cache_len=length + STATIC_ROOM)
    raise ValueError(f"cache_class {cache_class!r}; valid: {', '.join(CACHE_CLASSES)}")  # pragma: no cover - build checks first


@torch.no_grad()
def prefix_cache(model: torch.nn.Module, resume: Resume, cache_class: str) -> Any:
    """Prefill of the prefix columns into a fresh cache of the class."""
    cache = new_cache(cache_class, model, resume.length)
    extra = {} if cache is None else {compat.cache_kwarg(model): cache}
    out = model(**resume.prefix_kwargs(), use_cache=True, **extra)
    return compat.output_cache(out)


def _ids(bundle: ModelBundle, text: str) -> list[int]:
    """The text's ids: the tokenizer's (no special tokens), else the tiny models' byte mapping."""
    if bundle.tokenizer is None:
        return byte_ids(text)
    return list(bundle.tokenizer(text, add_special_tokens=False)["input_ids"])


def _append(prompt: Prompt, ids: list[int] | torch.Tensor) -> Prompt:
    """The prompt with `ids` appended (text columns: mask 1, mm_token_type_ids 0)."""
    extra = ids if isinstance(ids, torch.Tensor) else torch.tensor([ids], device=prompt.input_ids.device)
    extra = extra.to(prompt.input_ids.device).expand(prompt.input_ids.shape[0], -1)
    mm = dict(prompt.mm_kwargs)
    if "mm_token_type_ids" in mm:
        mm["mm_token_type_ids"] = torch.cat([mm["mm_token_type_ids"], torch.zeros_like(extra)], dim=1)
    return Prompt(torch.cat([prompt.input_ids, extra], dim=1),
                  torch.cat([prompt.attention_mask, torch.ones_like(extra)], dim=1), mm)


def resume_of(prompt: Prompt, split: int) -> Resume:
    """`prompt` as a resume whose first `split` columns are in the prefix cache."""
    return Resume(prompt.input_ids, prompt.attention_mask, dict(prompt.mm_kwargs), split)


def _special_ids(model: torch.nn.Module) -> list[int]:
    """Image/video/vision-boundary ids: a first generate() must not emit them (they would need pixels)."""
    cfg = model.config
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return sorted({int(getattr(cfg, n)) for n in names if isinstance(getattr(cfg, n, None), int)})


@torch.no_grad()
def _continue_generate(bundle: ModelBundle, prompt: Prompt, cache_class: str, options: dict[str, Any]) -> Case:
    """A first generate() of FIRST_NEW_TOKENS; its returned cache and sequences are what the second call resumes."""
    model = bundle.model
    cache = new_cache(cache_class, model, prompt.length + FIRST_NEW_TOKENS)
    suppress = _special_ids(model)
    kwargs = {**options, "max_new_tokens": FIRST_NEW_TOKENS, "min_new_tokens": FIRST_NEW_TOKENS, "do_sample": False,
              "return_dict_in_generate": True, **({"suppress_tokens": suppress} if suppress else {}),
              **({} if cache is None else {compat.generate_cache_kwarg(model): cache})}
    out = model.generate(**prompt.forward_kwargs(), **kwargs)
    sequences, returned = out.sequences, out.past_key_values
    full = _append(prompt, sequences[:, prompt.length:])
    held = int(returned.get_seq_length())
    notes = {"first_generate": {"max_new_tokens": FIRST_NEW_TOKENS, "suppress_tokens": suppress},
             "sequences_length": int(sequences.shape[1]), "returned_cache_length": held,
             "returned_cache_lacks_last_token": int(sequences.shape[1]) - held == 1,
             "unprocessed_after_returned_cache": int(sequences.shape[1]) - held}
    return Case("continue_generate", cache_class, resume_of(full, held), returned, notes)


def _batched(bundle: ModelBundle, prompt: Prompt, cache_class: str) -> Case:
    """Two text rows of different lengths (the prompt's text ids, and their first two thirds), left-padded."""
    model = bundle.model
    special = set(_special_ids(model))
    row = [t for t in prompt.input_ids[0].tolist() if t not in special]
    short = row[: max(2, (2 * len(row)) // 3)]
    pad = getattr(model.generation_config, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    device = prompt.input_ids.device
    ids = torch.tensor([row, [pad] * (len(row) - len(short)) + short], device=device)
    mask = torch.tensor([[1] * len(row), [0] * (len(row) - len(short)) + [1] * len(short)], device=device)
    resume = Resume(ids, mask, {}, ids.shape[1] - 1, True)  # text rows: positions follow the mask, as in generate()
    compat.put_rope_state(model, None)  # a text-only batch carries no multimodal position state
    notes = {"rows": 2, "row_lengths": [len(row), len(short)], "left_padding": [0, len(row) - len(short)],
             "pad_token_id": pad, "text_only": True}
    return Case("batched", cache_class, resume, prefix_cache(model, resume, cache_class), notes)


def build(bundle: ModelBundle, prompt: Prompt, pattern: str, cache_class: str, options: dict[str, Any]) -> Case:
    """The pattern's resume and prefix cache for this prompt (ValueError for an unknown pattern or cache class)."""
    if pattern not in PATTERNS or cache_class not in CACHE_CLASSES:
        raise ValueError(f"pattern {pattern!r}, cache_class {cache_class!r}; valid: {', '.join(PATTERNS)} and "
                         f"{', '.join(CACHE_CLASSES)}")
    if pattern == "continue_generate":
        return _continue_generate(bundle, prompt, cache_class, options)
    if pattern == "batched":
        return _batched(bundle, prompt, cache_class)
    resume, notes, second = resume_of(prompt, prompt.length - 1), {}, None  # one_token
    if pattern == "new_turn":
        turn = _ids(bundle, SECOND_TURN)
        resume = resume_of(_append(prompt, turn), prompt.length)
        notes = {"second_turn": SECOND_TURN, "second_turn_tokens": len(turn)}
    if pattern == "prompt_reuse":
        other = _ids(bundle, OTHER_SUFFIX)
        head = Prompt(prompt.input_ids[:, :-1], prompt.attention_mask[:, :-1],
                      {k: (v[:, :-1] if k == "mm_token_type_ids" else v) for k, v in prompt.mm_kwargs.items()})
        second = resume_of(_append(head, other), prompt.length - 1)
        notes = {"suffix_a_tokens": 1, "suffix_b": OTHER_SUFFIX, "suffix_b_tokens": len(other)}
    return Case(pattern, cache_class, resume, prefix_cache(bundle.model, resume, cache_class), notes, second)


def facts(case: Case) -> dict[str, Any]:
    """What ran, measured: batch, sequence length, processed columns, suffix length, the cache class, the notes."""
    r = case.resume
    return {"pattern": case.pattern, "cache_class": case.cache_class, "cache_type": type(case.prefix_cache).__name__,
            "batch": int(r.input_ids.shape[0]), "sequence_length": r.length, "processed_length": r.processed,
            "suffix_length": int(r.last_token.shape[1]), "prefix_cache_length": int(case.prefix_cache.get_seq_length()),
            **case.notes}


def as_dynamic(cache: Any, config: Any) -> Any:
    """A StaticCache's filled slots (each layer's get_seq_length()) `update()`d into a config-aware DynamicCache."""
    out = compat.dynamic_cache(compat.text_config(config))
    for i, layer in enumerate(compat.cache_layers(cache)):
        n = int(layer.get_seq_length())
        out.update(layer.keys[..., :n, :].clone(), layer.values[..., :n, :].clone(), i)
    return out


def as_static(cache: Any, config: Any, max_cache_len: int) -> StaticCache:
    """A DynamicCache `update()`d layer by layer into a StaticCache of `max_cache_len` slots (transformers' own class)."""
    out = StaticCache(config=compat.text_config(config), max_cache_len=max_cache_len)
    for i, layer in enumerate(compat.cache_layers(cache)):
        out.update(layer.keys, layer.values, i)
    return out
