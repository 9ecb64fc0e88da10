"""Notebook 08's valid call shapes: resume calls transformers and its users make, each run plain and guarded.

Per tiny text model (Qwen3, Llama): the returned `sequences` with the returned cache; a multi-token suffix with the
full mask; `inputs_embeds` with a cache; positional `inputs`; beam search from a cache; a `StaticCache` larger than
the sequence; a left-padded batch's sequences with its cache; assisted decoding with a tiny assistant. Besides: a
tiny BART continued with `decoder_input_ids` = its sequences, and Qwen3-VL with 4-row M-RoPE position ids (a text
row beside the three). Each is judged against the full forward over the same tokens (per row for the batch) with a
floor of the same model under the other attention kernel. Every forward call after the first (generate()'s own
internal calls, the assistant's included) is checked too (`check_forward_call`): `internal_calls`.
"""
from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from transformers import StaticCache

from kvresume import compat, testing
from ..compare import NoiseFloor, noise_floor
from ..continuation import attention_kernel, current_position_ids, greedy_config, other_attention_logits, prefill
from ..inputs import Prompt
from ..families.setup import left_pad
from .cells import Cell, _generate, _step, run_cell
from kvresume.checks import ResumeInputError
from kvresume.call import cache_lengths
from kvresume.guard import check_forward_call

VOCAB = 2048


@dataclass
class Shape:
    """One valid call: generate()'s arguments (beside the cache and the greedy config), its reference, its floor."""

    shape: str
    model: torch.nn.Module
    inputs: torch.Tensor | None
    kwargs: dict[str, Any]
    cache: Any
    reference: torch.Tensor
    floor: NoiseFloor
    processed_length: Any
    config: dict[str, Any] = field(default_factory=dict)  # GenerationConfig fields over the greedy one-step config
    models: tuple[torch.nn.Module, ...] = ()  # whose forward calls are checked (the assistant's too)
    whole: Any = None  # the whole sequence (ids, or a Prompt with its images) for kvresume.resume (None: embeddings, beams, decoder)


@torch.no_grad()
def last_logits(model: torch.nn.Module, **kwargs: Any) -> torch.Tensor:
    return model(**kwargs).logits[:, -1, :].detach().float().clone()


@torch.no_grad()
def floor_of(model: torch.nn.Module, kwargs: dict[str, Any], reference: torch.Tensor) -> NoiseFloor:
    """The full forward under the other attention kernel (sdpa <-> eager) vs the reference: this model's noise."""
    with attention_kernel(model):
        other = last_logits(model, **kwargs)
    return noise_floor(reference, [other], torch.float32, what="full forward vs the other attention kernel's")


def kernel_floor(model: torch.nn.Module, prompt: Prompt, dtype: torch.dtype) -> tuple[torch.Tensor, Any, Any]:
    """The full forward's logits, its noise floor against the other attention kernel, and the prefix's cache."""
    reference, _ = prefill(model, prompt, end=None)
    other, kernel = other_attention_logits(model, prompt)
    floor = noise_floor(reference, [other], dtype, what=f"full forward vs the {kernel} kernel's")
    _, prefix = prefill(model, prompt)
    return reference, floor, prefix


def _gen(model: torch.nn.Module, inputs: Any, **kwargs: Any) -> Any:
    config = greedy_config(model)
    config.update(**kwargs.pop("config", {}))
    with torch.no_grad():
        return model.generate(inputs, generation_config=config, **kwargs)


@torch.no_grad()
def _prefix(model: torch.nn.Module, ids: torch.Tensor, cache: Any = None) -> Any:
    """The cache of a forward over `ids` (filling `cache` where given)."""
    given = {} if cache is None else {compat.cache_kwarg(model): cache}
    return compat.output_cache(model(input_ids=ids, use_cache=True, **given))


def text_shapes(model: torch.nn.Module, assistant: torch.nn.Module, seed: int = 0) -> list[Shape]:
    """The text-model shapes on one model (24-token prompt; batch of 12 and 20 tokens left-padded)."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(10, VOCAB - 10, (1, 24), generator=gen)
    full = {"attention_mask": torch.ones(1, 24, dtype=torch.long)}
    cache23 = _prefix(model, ids[:, :23])

    def judged(name: str, against: torch.Tensor, inputs: torch.Tensor | None, kwargs: dict[str, Any], cache: Any,
               processed: int, resumable: bool = True, **extra: Any) -> Shape:
        """A shape judged against the full forward over `against` (the whole sequence resume takes, if `resumable`)."""
        ref = last_logits(model, input_ids=against)
        return Shape(name, model, inputs, kwargs, cache, ref, floor_of(model, {"input_ids": against}, ref), processed,
                     whole=against if resumable else None, **extra)

    first = _gen(model, ids[:, :16], config={"max_new_tokens": 4})
    seqs = first.sequences
    return [judged("sequences + returned cache", seqs, seqs, {"attention_mask": torch.ones_like(seqs)},
                   compat.output_cache(first), seqs.shape[1] - 1),
            judged("multi-token suffix, full mask", ids, None, {"input_ids": ids[:, 20:], **full},
                   _prefix(model, ids[:, :20]), 20),
            judged("inputs_embeds + cache", ids, None, {"inputs_embeds": model.get_input_embeddings()(ids).detach(),
                                                        **full}, cache23, 23, False),
            judged("positional inputs", ids, ids[:, -1:], full, cache23, 23),
            judged("beam search from a cache", ids, ids[:, -1:], full, _beams(cache23, 2), 23, False,
                   config={"num_beams": 2}),
            judged("assisted decoding from a cache of prompt[:-1]", ids, ids, {**full, "assistant_model": assistant},
                   cache23, 23, models=(model, assistant)),
            judged("suffix longer than the cache, mask of its own width", ids[:, :20], ids[:, 8:20],
                   {"attention_mask": torch.ones(1, 12, dtype=torch.long)}, _prefix(model, ids[:, :8]), 8),
            judged("StaticCache larger than the sequence", ids, ids[:, -1:], full, _prefix(
                model, ids[:, :23], StaticCache(config=model.config, max_cache_len=64)), 23),
            _padded(model, gen)]


def _beams(cache: Any, beams: int) -> Any:
    """The cache of a batch-1 prefix repeated for `beams` beams (generate() expands the inputs, not the cache)."""
    out = copy.deepcopy(cache)
    out.batch_repeat_interleave(beams)
    return out


def per_row(model: torch.nn.Module, rows: list[torch.Tensor]) -> tuple[torch.Tensor, NoiseFloor]:
    """Each unpadded row's full forward (last logits, stacked) and the widest of their floors."""
    refs = [last_logits(model, input_ids=r) for r in rows]
    floor = max((floor_of(model, {"input_ids": r}, ref) for r, ref in zip(rows, refs)), key=lambda f: f.threshold)
    return torch.cat(refs), floor


def _padded(model: torch.nn.Module, gen: torch.Generator) -> Shape:
    """A left-padded batch (12 and 20 tokens) generated 3 tokens, continued from its sequences and returned cache."""
    ids, mask = left_pad([torch.randint(10, VOCAB - 10, (n,), generator=gen) for n in (12, 20)])
    first = _gen(model, ids, attention_mask=mask, config={"max_new_tokens": 3})
    seqs = first.sequences
    full = torch.cat([mask, torch.ones(2, seqs.shape[1] - 20, dtype=torch.long)], dim=1)
    kept = [seqs[i][full[i].bool()].view(1, -1) for i in range(2)]
    ref, floor = per_row(model, kept)
    return Shape("left-padded batch: sequences + cache", model, seqs, {"attention_mask": full}, compat.output_cache(first),
                 ref, floor, [int(k.shape[1]) - 1 for k in kept], whole=seqs)


def bart_shapes(seed: int = 0, prepare: Callable[[torch.nn.Module], Any] | None = None) -> list[Shape]:
    """A tiny BART: encoder ids and mask of 4 columns, decoder_input_ids = its 8 sequences beside a decoder cache of 7,
    with a decoder mask over them (valid) and without one (generate() then feeds all 8)."""
    model = testing.build("bart", "sdpa", seed)
    if prepare is not None:  # e.g. kvresume.track
        prepare(model)
    gen = torch.Generator().manual_seed(seed + 3)
    enc = torch.randint(10, VOCAB - 10, (1, 4), generator=gen)
    mask = torch.ones_like(enc)
    first = _gen(model, enc, attention_mask=mask, config={"max_new_tokens": 7, "min_new_tokens": 7})
    seqs = first.sequences
    kwargs = {"input_ids": enc, "attention_mask": mask, "decoder_input_ids": seqs}
    ref = last_logits(model, **kwargs)
    floor, cache, n = floor_of(model, kwargs, ref), compat.output_cache(first), seqs.shape[1]
    full = {"attention_mask": mask, "decoder_input_ids": seqs}
    return [Shape("encoder-decoder: decoder_input_ids = sequences + decoder mask", model, enc,
                  {**full, "decoder_attention_mask": torch.ones(1, n, dtype=torch.long)}, cache, ref, floor, n - 1),
            Shape("encoder-decoder: decoder_input_ids = sequences, no decoder mask", model, enc, full, cache,
                  ref, floor, n - 1)]


def mrope_shape(model: torch.nn.Module, prompt: Any) -> Shape:
    """Qwen3-VL with 4-row position ids (the text row at the processed length beside the three M-RoPE rows)."""
    ref, floor, cache = kernel_floor(model, prompt, torch.float32)
    three = current_position_ids(model, prompt)
    four = torch.cat([torch.full((1, 1, 1), prompt.length - 1, dtype=three.dtype), three])
    kwargs = {"attention_mask": prompt.attention_mask, "position_ids": four}
    return Shape("M-RoPE position ids with four rows", model, prompt.last_token, kwargs, cache, ref.float(), floor,
                 prompt.length - 1, whole=prompt)


@contextmanager
def checked_calls(models: tuple[torch.nn.Module, ...], rows: list[dict[str, Any]], shape: str) -> Iterator[None]:
    """Every forward call of `models` with a filled cache, but the first model's first (the guard's), checked on its
    own arguments: one row each (which model, call index, tokens, cache length, refused or not, message)."""
    calls = {id(m): 0 for m in models}

    def pre(module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        index, calls[id(module)] = calls[id(module)], calls[id(module)] + 1
        cache = compat.cache_from_kwargs(kwargs)
        if (module is models[0] and index == 0) or cache is None or cache_lengths(cache)[0] == 0:
            return
        message = ""
        try:
            check_forward_call(module, kwargs)
        except ResumeInputError as exc:
            message = str(exc)
        mask = kwargs.get("attention_mask")
        rows.append({"shape": shape, "model": "assistant" if module is not models[0] else "main", "call": index,
                     "mask": mask[0].tolist() if isinstance(mask, torch.Tensor) and mask.dim() == 2 and
                     mask.shape[-1] <= 40 else None, "refused": bool(message), "message": message[:160]})

    with ExitStack() as stack:
        for m in models:
            stack.callback(m.register_forward_pre_hook(pre, with_kwargs=True).remove)
        yield


def run_shape(s: Shape, internal: list[dict[str, Any]]) -> Cell:
    """The shape plain (its internal calls checked) and guarded; judged against its reference."""
    rows = s.reference.shape[0]
    read = lambda out: compat.generate_logits(out)[0][:rows].float()  # noqa: E731 - beams: the first beam's row
    config = greedy_config(s.model)
    config.update(**s.config)
    kwargs = {**s.kwargs, "generation_config": config}
    with checked_calls(s.models or (s.model,), internal, s.shape):  # a raise plain: a measurement
        plain = _step(_generate, s.model, s.inputs, s.cache, kwargs, read)
    cell = run_cell("valid", f"{type(s.model).__name__} · {s.shape}", s.model, None, s.cache, kwargs, s.reference,
                    s.floor, s.processed_length, plain, s.whole, inputs=s.inputs, read=read)
    cell.shape = s.shape
    if s.whole is None:
        cell.resume_scope = ("an encoder-decoder: resume takes a decoder-only model's whole ids" if
                             getattr(s.model.config, "is_encoder_decoder", False) else "no whole ids (embeddings or beams)")
    return cell


def population(text_models: dict[str, tuple[torch.nn.Module, torch.nn.Module]], vl_model: torch.nn.Module,
               vl_prompt: Any, seed: int = 0,
               prepare: Callable[[torch.nn.Module], Any] | None = None) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Every valid shape's cell (the text models', the tiny BART's, Qwen3-VL's), and every internal call checked:
    (cells, internal call rows); `prepare(model)` on the models built here (the tiny BART), e.g. kvresume.track."""
    shapes = [s for model, assistant in text_models.values() for s in text_shapes(model, assistant, seed)]
    shapes += bart_shapes(seed, prepare) + [mrope_shape(vl_model, vl_prompt)]
    internal: list[dict[str, Any]] = []
    cells = [run_shape(s, internal) for s in shapes]
    for model, assistant in text_models.values():
        internal += masked_assisted_calls(model, assistant, seed)
    return cells, internal


def masked_assisted_calls(model: torch.nn.Module, assistant: torch.nn.Module, seed: int = 0) -> list[dict[str, Any]]:
    """Assisted decoding from a prompt whose mask has masked tokens mid-sequence ([1, 0 x6, 1, ...]): every internal call."""
    gen = torch.Generator().manual_seed(seed + 5)
    ids = torch.randint(10, VOCAB - 10, (1, 16), generator=gen)
    mask = torch.ones_like(ids)
    mask[:, 1:7] = 0
    rows: list[dict[str, Any]] = []
    with checked_calls((model, assistant), rows, "assisted decoding, masked tokens mid-sequence"):
        _gen(model, ids, attention_mask=mask, assistant_model=assistant, config={"max_new_tokens": 6})
    return rows
