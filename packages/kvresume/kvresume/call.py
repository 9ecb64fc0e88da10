"""What the resume guard decides on: generate()'s own arguments, and what generate() fed its first model call.

`ResumeCall` holds both. `from_generate` reads generate()'s arguments (positional `inputs` first, as generate()
takes them; the decoder side for an encoder-decoder model) and the model's own state (`rope_deltas`) before
generate() runs; `fed` is filled from the keyword arguments of the first forward call, read by a forward pre-hook
(`first_call_hook`): the slicing of the suffix is the installed release's own, never re-derived from mask widths.
`from_forward` builds a call from one forward call alone (generate()'s internal calls). Nothing is patched.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from . import compat
from . import layers
from .ledger import Ledger, ledger_of, ledger_owner, stored_ledger


def cache_lengths(cache: Any) -> tuple[int, int]:
    """(what `get_seq_length()` reports, the largest length any attention layer reports)."""
    cache = ledger_owner(cache)
    reported = int(cache.get_seq_length())
    per_layer = [n for n in layers.lengths(cache) if n is not None]
    return reported, max(per_layer + [reported])


_FED = {False: ("input_ids", "inputs_embeds"), True: ("decoder_input_ids", "decoder_inputs_embeds")}


def fed_ids(model: torch.nn.Module, kwargs: dict[str, Any],
            decoder: bool | None = None) -> tuple[torch.Tensor | None, int | None, int | None]:
    """(ids or None for embeddings, batch, tokens) of one forward call."""
    names = _FED[bool(is_encoder_decoder(model) if decoder is None else decoder)]
    ids, embeds = kwargs.get(names[0]), kwargs.get(names[1])
    if isinstance(ids, torch.Tensor):
        ids = ids.view(1, -1) if ids.dim() == 1 else ids
        return ids, int(ids.shape[0]), int(ids.shape[-1])
    if isinstance(embeds, torch.Tensor):
        return None, int(embeds.shape[0]), int(embeds.shape[1])
    return None, None, None


# generate()'s multimodal inputs beside the ids: what a vision check reads (new images in the suffix)
MULTIMODAL = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids",
              "mm_encoder_outputs")


class ResumeInputError(ValueError):
    """Resume inputs that generate() would take silently or fail on deep inside; the message says what to pass."""

    check: str = ""  # the name of the check that raised it (set by the guard)
    fix: dict[str, Any] = {}  # what replaces the call's arguments (crop / attention_mask / position_ids), where known


def refuse(check: str, message: str, **fix: object) -> ResumeInputError:
    """A ResumeInputError from the check `check`, carrying the fix that replaces the call's arguments."""
    error = ResumeInputError(message)
    error.check, error.fix = check, dict(fix)
    return error


@dataclass
class ResumeCall:
    """One resume: the cache, the tokens given (n) and fed (f), the mask and positions given, the model's state."""

    cache: Any
    n: int
    fed: int | None = None  # tokens in the first model call (None: not captured; the checks then use n)
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    processed_length: int | None = None
    rows: torch.Tensor | None = None  # per-row processed (unpadded) counts of a left-padded batch
    keeps_rope_state: bool = False
    rope_deltas: torch.Tensor | None = None
    decoder_start: int | None = None  # an encoder-decoder's decoder_start_token_id
    fed_ids: torch.Tensor | None = None  # the ids of the first model call (None: embeddings, or not captured)
    layer_types: tuple[str, ...] = ()  # the config's per-layer attention types (empty where it lists none)
    model: Any = None  # the model generate() runs (its config and its release's source, for model-specific checks)
    multimodal: dict[str, Any] = field(default_factory=dict)  # the MULTIMODAL inputs given (None ones left out)
    given_ids: torch.Tensor | None = None  # the ids given (the decoder's for an encoder-decoder); None: embeddings
    ledger: Ledger | None = None  # what the cache holds, where it is tracked (kvresume.ledger_of)
    stored: Ledger | None = None  # the ledger as stored before the call (a crop trims it lazily): what a crop removed
    fed_positions: torch.Tensor | None = None  # [rows, batch, f]: the positions the first call rotates with
    fed_mask: Any = None  # the attention mask generate() gave its first model call (the decoder's for enc-dec)

    def __post_init__(self) -> None:
        if self.stored is None and self.cache is not None:
            self.stored = stored_ledger(self.cache)

    def feed(self, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
        """Record what generate() gave its first model call (these keyword arguments)."""
        decoder = is_encoder_decoder(model)
        self.fed_ids, _, self.fed = fed_ids(model, kwargs, decoder)  # pragma: no mutate - decoder given: model unread
        self.fed_mask = kwargs.get("decoder_attention_mask" if decoder else "attention_mask")

    @property
    def lengths(self) -> tuple[int, int]:
        return cache_lengths(self.cache)

    @property
    def given_rows(self) -> int:
        """Rows of the ids given (1 where embeddings were given)."""
        return self.given_ids.shape[0] if self.given_ids is not None else 1

    @property
    def f(self) -> int:
        return self.n if self.fed is None else self.fed

    def mask2d(self) -> torch.Tensor | None:
        """The mask given, where it is a [batch, columns] tensor (a 4-D or per-layer-type mask is not read)."""
        m = self.attention_mask
        return m if isinstance(m, torch.Tensor) and m.dim() == 2 else None


def processed(value: int | torch.Tensor | list[int] | None) -> tuple[int | None, torch.Tensor | None]:
    """(the processed length, per-row processed tokens or None): a batch's rows may give one count each."""
    if value is None or isinstance(value, int):
        return value, None
    rows = torch.as_tensor(value, dtype=torch.long).reshape(-1)
    return int(rows.max()), rows


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def layer_types(model: torch.nn.Module) -> tuple[str, ...]:
    """The decoder's per-layer attention types from the model's config (empty where it lists none)."""
    try:
        return tuple(getattr(compat.text_config(model.config), "layer_types", None) or ())  # pragma: no mutate - caught
    except Exception:  # noqa: BLE001 - a config without a text part lists none
        return ()


def decoder_start(model: torch.nn.Module) -> int | None:
    """The decoder start token id (generation config first, then the model config)."""
    sources = (getattr(model, "generation_config", None), getattr(model, "config", None))
    values = (getattr(source, "decoder_start_token_id", None) for source in sources)
    return next((value for value in values if isinstance(value, int)), None)


def _call(model: torch.nn.Module, cache: Any, n: int, kwargs: dict[str, Any], decoder: bool,
          ids: Any = None, length: int | None = None, rows: torch.Tensor | None = None) -> ResumeCall:
    """A call on `cache` with these keyword arguments' mask and positions, the model's own state read now."""
    side = "decoder_" if decoder else ""
    owner = compat.rope_state_owner(model)
    return ResumeCall(cache, n, None, kwargs.get(f"{side}attention_mask"), kwargs.get(f"{side}position_ids"), length,
                      rows, owner is not None, compat.get_rope_state(model) if owner is not None else None,
                      decoder_start(model) if decoder else None, None, layer_types(model), model, multimodal(kwargs),
                      ids if isinstance(ids, torch.Tensor) else None, ledger_of(cache))


def from_generate(model: torch.nn.Module, inputs: torch.Tensor | None, kwargs: dict[str, Any],
                  processed_length: int | torch.Tensor | list[int] | None = None) -> ResumeCall | None:
    """The resume generate() is asked for (None where no filled cache is given): read before generate() runs."""
    cache = compat.cache_from_kwargs(kwargs)
    if cache is None:
        return None
    decoder = is_encoder_decoder(model)
    given = dict(kwargs)
    if inputs is not None and not decoder:
        given["inputs_embeds" if inputs.is_floating_point() else "input_ids"] = inputs
    ids, _, n = fed_ids(model, given, decoder)  # pragma: no mutate - decoder given: model unread
    if n is None:
        return None
    return _call(model, cache, n, kwargs, decoder, ids, *processed(processed_length))


def multimodal(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The multimodal inputs among a call's keyword arguments (MULTIMODAL, those given)."""
    return {k: kwargs[k] for k in MULTIMODAL if kwargs.get(k) is not None}


def from_forward(model: torch.nn.Module, kwargs: dict[str, Any]) -> ResumeCall | None:
    """A call of its own from one forward call's keyword arguments (generate()'s internal calls)."""
    decoder = is_encoder_decoder(model)
    cache, n = compat.cache_from_kwargs(kwargs), fed_ids(model, kwargs, decoder)[2]  # pragma: no mutate - decoder given: model unread
    if cache is None or n is None:
        return None
    call = _call(model, cache, n, kwargs, decoder)
    call.feed(model, kwargs)
    call.given_ids = call.fed_ids
    return call


@contextmanager
def first_call_hook(model: torch.nn.Module, on_first: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """`on_first(kwargs)` before the model's first forward call inside the block (it may raise to stop generate())."""
    seen: list[bool] = []

    def pre(_module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        if not seen:
            seen.append(True)
            on_first(kwargs)

    handle = model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
