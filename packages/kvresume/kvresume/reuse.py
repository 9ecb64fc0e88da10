"""`resume(model, input_ids, cache, **generate_kwargs)`: the prefix-aware resume a user calls instead of generate().

With a ledger (kvresume.ledger): keep the longest cached prefix that equals `input_ids` (the whole sequence; for an
encoder-decoder, `decoder_input_ids`) and its mask bits, written at increasing positions (kvresume.prefix), keeping at
least one token to feed; crop the rest; feed what is not cached with the mask the cached slots were written with +
the given mask's (or ones), and position_ids counting on from each row's last attended kept position (the M-RoPE rows
where the model has them; the model's rope_deltas put back to the ledger's). Where the cache cannot be cropped there
(a sliding layer past its window, a StaticCache before 5.25, linear layers without recorded states), where its
linear layers' state is stale (kvresume.linear_checks), or where the guard refuses candidate generation beside a cache
(assistant_model, prompt lookup: 5.17's first call gets a mask narrowed to the ids; 5.25 feeds it right and reuses),
everything is re-prefilled: a StaticCache is reset in place, another cache replaced by a new one of its class.
Settings whose processors read the whole input, or that expand the rows, are re-prefilled too (reason `whole_input`);
length limits, the caller's processors, criteria and stop strings count the whole sequence (kvresume.whole). The
output carries a `ResumeRecord` (kvresume.prefix.record_of(output)): tokens cached, reused, fed, and why the reuse
stopped there. Without a ledger: `guarded_generate` with the same arguments. `apply_fix` applies a refusal's `fix`.
A server's arguments are refused by name before any work where a resume cannot take them (kvresume.whole.server_kwargs:
its own cache_position, another cache_implementation, a StaticCache too short); its own position_ids are kept where
they equal the kept slots' and the suffix's, else re-prefilled with them; a model whose multi-token forward on a filled
cache restarts its SSM scan (Mamba: compat.restarts_scan) is re-prefilled into a new cache.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from . import compat, images, whole
from .call import is_encoder_decoder, refuse
from .fingerprint import unfollowed
from .guard import ResumeInputError, check_resume_inputs, guarded_generate
from .ledger import Ledger, attach_ledger, cache_held, ledger_of, ledger_owner, stored_ledger
from .ledger_checks import next_positions
from .linear_checks import ATTR as LINEAR_MARKS, stale_of
from .prefix import ATTR, ResumeRecord, explain, has_crop, misplaced, record_of, reusable, text_positions

CANDIDATES = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")


resume_report = record_of  # the ResumeRecord resume() attached to its output (or the cache it wrote)


def crop_to(cache: Any, n: int) -> Any:
    """Keep the first n cached tokens (a negative crop: the removal count, which every release takes), the ledger
    trimmed with it; returns the cache."""
    held = cache_held(cache)[0]
    if n < held:  # pragma: no mutate - at n == held `<=` crops nothing either (crop(0) is a no-op)
        led = stored_ledger(cache)
        ledger_owner(cache).crop(n - held)
        if led is not None:
            attach_ledger(cache, led.first(n))
    return cache


def fresh(model: torch.nn.Module, cache: Any) -> Any:
    """An empty cache for a re-prefill: a StaticCache reset in place, else a new cache of the same class."""
    if isinstance(cache, EncoderDecoderCache):
        return EncoderDecoderCache(DynamicCache(), DynamicCache())  # pragma: no mutate - one argument: same empty cross
    # static layers (croppable from 5.25 on, and built with a max_cache_len): reset, keep memory
    if isinstance(cache, StaticCache) or not has_crop(cache):
        cache.reset()
        for name in ("kv_ledger", LINEAR_MARKS):
            cache.__dict__.pop(name, None)
        return cache
    return type(cache)(config=compat.text_config(model.config))


def cropped(model: torch.nn.Module, cache: Any, keep: int) -> tuple[Any, int, str]:
    """(the cache holding its first `keep` tokens, keep, "") or, where it cannot be cropped there, (an empty cache, 0,
    why); the crop itself is the cache's own."""
    try:  # (crop_to crops nothing where keep >= what the cache holds)
        return crop_to(cache, keep), keep, ""
    except (RuntimeError, AttributeError, NotImplementedError, ValueError) as exc:
        return fresh(model, cache), 0, f"the cache cannot be cropped to {keep} tokens ({type(exc).__name__}: {exc}); re-prefilled"


def _candidates(kwargs: dict[str, Any]) -> str | None:
    """The candidate-generation argument (assisted decoding, prompt lookup) among the call's, or None."""
    config = kwargs.get("generation_config")
    return next((n for n in CANDIDATES if kwargs.get(n) is not None or getattr(config, n, None) is not None), None)


def plan(led: Ledger, ids: torch.Tensor, mask: torch.Tensor | None, tokenizer: Any = None,
         messages: Any = None) -> ResumeRecord:
    """How many cached tokens to reuse, and why not more (the record's `fed` filled in later)."""
    n, cached = int(ids.shape[1]), led.length
    p = reusable(led, ids, mask)
    keep = min(p, n - 1)
    common = led.common_prefix(ids)
    if keep == cached:
        reason, detail = "extends", f"all {cached} cached tokens reused"
    elif common >= n:
        reason, detail = "regenerate", f"the ids are the cache's first {n} tokens: re-fed from token {keep}"
    elif p < common:
        bad = misplaced(led.first(common))  # pragma: no mutate - first(None): a stuck slot past the common prefix is never p
        reason, detail = (("misplaced", f"cached slots from {bad} were written at stuck positions: re-fed")
                          if bad is not None and bad == p else
                          ("mask", f"the given mask differs from the cached slots' at token {p} (padding): re-fed"))
    else:
        reason, detail = explain(led.token_ids, ids.cpu(), p, tokenizer, messages)
    return ResumeRecord(cached, keep, 0, reason, detail)


def resume(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, **generate_kwargs: Any) -> Any:
    """generate() from `cache` for the whole sequence `input_ids`, reusing the longest cached common prefix; the output
    carries a ResumeRecord (prefix.record_of). `messages=` (the chat's messages) is read to explain a break only."""
    led = ledger_of(cache)
    name = compat.generate_cache_kwarg(model)
    messages = generate_kwargs.pop("messages", None)
    why = unfollowed(cache) if led is None else None
    if why is not None:  # a QuantizedCache: which tokens it holds cannot be known, so no prefix can be chosen
        raise refuse("ledger_unfollowed", f"resume(): {why}, so kvresume cannot tell which tokens this cache holds "
                     "and which of them the new ids still share. Pass a new cache (a re-prefill, nothing reused: "
                     "the fix's cache=None) or keep the conversation in a DynamicCache to reuse its prefix", cache=None)
    decoder = is_encoder_decoder(model)
    whole_ids = generate_kwargs.get("decoder_input_ids") if decoder else input_ids
    if whole_ids is not None:  # a server's arguments a resume cannot take: refused before any work
        generate_kwargs = whole.server_kwargs(model, whole_ids, cache, generate_kwargs)
    if compat.restarts_scan(model):
        return _rescan(model, input_ids, cache, led, name, generate_kwargs)
    if led is None or led.batch != int(input_ids.shape[0]):  # untracked or stale, or rows to select: the guard says
        return guarded_generate(model, input_ids, **{name: cache}, **generate_kwargs)
    mask_key = "decoder_attention_mask" if decoder else "attention_mask"
    ids = generate_kwargs.pop("decoder_input_ids", None) if decoder else input_ids
    if ids is None:
        raise ValueError("resume() on an encoder-decoder takes the decoder's whole sequence as decoder_input_ids")
    given_mask = generate_kwargs.pop(mask_key, None)
    record = plan(led, ids, given_mask, generate_kwargs.get("tokenizer"), messages)
    rows = False
    if not decoder:  # (an encoder-decoder's generate() is fed the whole decoder sequence: its processors see it all)
        setting = whole.needs_prefill(whole.effective_config(model, generate_kwargs))
        if setting is not None:  # re-prefilled: the whole input fed, and where rows expand, into a new cache
            record.reused, record.reason, record.detail = 0, "whole_input", f"{setting[1]}: re-prefilled"
            rows = setting[0] in whole.EXPANDS_ROWS
        # images keyed by their pixels: the prefix ends before one that differs or would be cut
        images.limit_record(model, cache, ids, generate_kwargs, record, led.length)
        given_positions = generate_kwargs.get("position_ids")
        if record.reused and given_positions is not None and \
                not same_positions(model, led.first(record.reused), ids, given_mask, given_positions):
            record.reused, record.reason = 0, "positions"
            record.detail = "the given position_ids differ from the kept slots' and the suffix's: re-prefilled with them"
    if rows:  # generate() expands the ids and not the cache: a new one
        cache = fresh(model, cache)
    elif stale_of(cache, led.length) is not None:  # linear layers cropped without rolling back: re-prefill all
        record.reused, record.detail = 0, record.detail + "; linear layers' state not rolled back: re-prefilled"
        cache = fresh(model, cache)
    cache, keep, why = cropped(model, cache, record.reused)
    if why:
        record.reused, record.detail = 0, f"{record.detail}; {why}"
    if keep and not decoder:  # length limits, processors, criteria and stop strings counted over the whole sequence
        generate_kwargs = whole.whole_input_kwargs(model, ids, generate_kwargs)
    if decoder:  # the cross-attention K/V are recomputed from this call's encoder input
        cache.cross_attention_cache, cache.is_updated = type(cache.cross_attention_cache)(), {}
    inputs, kwargs = _arguments(model, input_ids, ids, led.first(keep), given_mask, generate_kwargs, decoder)
    try:
        cache, inputs, kwargs = _checked(model, inputs, cache, kwargs, name)
    except ResumeInputError as exc:  # candidate generation this release feeds wrongly beside a cache: re-prefill
        which = _candidates(generate_kwargs)
        if which is None or keep == 0:
            raise
        cache, keep = fresh(model, cache), 0
        record.reused, record.reason = 0, "assisted"
        record.detail = f"{which}: this release's generate() cannot continue a cache with it ({exc.check}); re-prefilled"
        inputs, kwargs = _arguments(model, input_ids, ids, led.first(0), given_mask, generate_kwargs, decoder)
    record.fed = int(ids.shape[1]) - keep
    out = compat.plain_generate(model)(inputs, **{name: cache}, **kwargs)
    return _with_record(out, cache, record)


def _arguments(model: torch.nn.Module, input_ids: torch.Tensor, ids: torch.Tensor, kept: Ledger,
               given_mask: torch.Tensor | None, generate_kwargs: dict[str, Any],
               decoder: bool) -> tuple[torch.Tensor, dict[str, Any]]:
    """(generate()'s inputs, its keyword arguments) after the kept slots: the suffix (an encoder-decoder: the encoder
    ids, the whole decoder sequence), the kept slots' mask + the given mask's rest, the suffix's positions."""
    keep = kept.length
    mask_key = "decoder_attention_mask" if decoder else "attention_mask"
    suffix = ids[:, keep:]
    suffix_mask = given_mask[:, keep:].to(ids.device) if given_mask is not None else torch.ones_like(suffix)
    kwargs = {k: v for k, v in generate_kwargs.items() if k not in (mask_key, "position_ids")}  # (the encoder's mask kept)
    given_positions = generate_kwargs.get("position_ids")
    if not keep and not decoder and given_positions is not None and given_positions.shape[-1] == ids.shape[1]:
        kwargs["position_ids"] = given_positions  # nothing kept: the caller's own positions of the whole sequence
    mm_positions = mm_deltas = None  # pragma: no mutate - both are set by images.fed wherever they are read
    if not decoder:  # the images of ids[:, keep:] only, and their positions over the whole conversation
        kwargs, mm_positions, mm_deltas = images.fed(model, ids, kwargs, keep)
    kwargs[mask_key] = torch.cat([kept.mask.to(ids.device, suffix_mask.dtype), suffix_mask], 1)
    if keep and not decoder:
        positions = mm_positions if mm_positions is not None else _positions(model, kept, suffix, suffix_mask, kwargs)
        kwargs["position_ids"] = positions.to(ids.device)
        deltas = mm_deltas if mm_deltas is not None else kept.rope_deltas
        if compat.rope_state_owner(model) is not None and deltas is not None:
            compat.set_rope_state(model, deltas.clone())
    if decoder:
        kwargs["decoder_input_ids"] = ids
        return input_ids, kwargs
    return suffix, kwargs


def _checked(model: torch.nn.Module, inputs: torch.Tensor, cache: Any, kwargs: dict[str, Any],
             name: str) -> tuple[Any, torch.Tensor, dict[str, Any]]:
    """What this release's generate() feeds for these arguments, checked against the ledger; a refusal's fix applied
    in place (resume owns the cache it was given)."""
    try:
        check_resume_inputs(model, inputs, **{name: cache}, **kwargs)
    except ResumeInputError as exc:
        if not exc.fix or exc.fix.get("resume"):  # resume's own advice: nothing further to apply here
            raise
        cache, kwargs = apply_fix(exc.fix, cache, {"input_ids": inputs, **kwargs}, copy_cache=False)
        inputs = kwargs.pop("input_ids")
    return cache, inputs, kwargs


def _with_record(out: Any, cache: Any, record: ResumeRecord) -> Any:
    """The output with the record attached (and the cache it wrote)."""
    for target in (out, ledger_owner(compat.output_cache(out) or cache)):
        try:
            object.__setattr__(target, ATTR, record)
        except (AttributeError, TypeError):
            pass
    return out


def _positions(model: torch.nn.Module, kept: Ledger, suffix: torch.Tensor, suffix_mask: torch.Tensor,
               kwargs: dict[str, Any]) -> torch.Tensor:
    """The suffix's positions after the kept slots: text positions (each row's attended tokens counted on), or, where
    new images or videos come with it, the model's own M-RoPE positions of the suffix (get_rope_index from 0) shifted
    to each row's next position."""
    grids = any(kwargs.get(k) is not None for k in ("image_grid_thw", "video_grid_thw"))
    ones = {**kwargs, "attention_mask": torch.ones_like(suffix)}
    local = images.rope_index(model, suffix, ones)[0] if grids else None
    if local is not None:  # (None: no get_rope_index)
        return local + kept.next_positions().view(1, -1, 1).to(local.device)
    if kept.positions.shape[0] == 1:
        return text_positions(kept, suffix_mask)
    return next_positions(kept, int(suffix.shape[1]))


def apply_fix(fix: dict[str, Any], cache: Any, kwargs: dict[str, Any],
              copy_cache: bool = True) -> tuple[Any, dict[str, Any]]:
    """(the cache, a copy unless `copy_cache` is False, cropped where the fix says, the call's keyword arguments with
    the fix's replacements); `cache`: another cache (a rebuild with what was missing), `call`: other (input_ids,
    kwargs) altogether; `decoder_input_ids`: an encoder-decoder's whole decoder sequence (generate() prepends the start
    token to decoder ids that lack it, so a suffix cannot be passed there)."""
    cache = fix.get("cache", cache)
    cache = copy.deepcopy(cache) if copy_cache else cache
    if fix.get("crop") is not None:
        crop_to(cache, int(fix["crop"]))
    out = dict(kwargs)
    if fix.get("call") is not None:
        ids, other = fix["call"]
        keep = {k: v for k, v in kwargs.items() if k == "generation_config"}
        out = {**keep, "input_ids": ids, **other}
    names = ("attention_mask", "position_ids", "decoder_attention_mask", "decoder_input_ids")
    out = whole.without(out, tuple(fix.get("drop", ())))  # `drop`: arguments to leave out (and unset in the config)
    return cache, {**out, **{name: fix[name] for name in names if fix.get(name) is not None}}


def same_positions(model: torch.nn.Module, kept: Ledger, ids: torch.Tensor, given_mask: torch.Tensor | None,
                   given: torch.Tensor) -> bool:
    """Whether the caller's position_ids of the whole sequence are the kept slots' and the suffix's that resume()
    feeds (text positions only: False for M-RoPE)."""
    if given.dim() != 2 or kept.positions.shape[0] != 1 or compat.rope_state_owner(model) is not None:
        return False
    suffix = ids[:, kept.length:]
    mask = given_mask[:, kept.length:] if given_mask is not None else torch.ones_like(suffix)
    ours = torch.cat([kept.positions[0].cpu(), text_positions(kept, mask)], 1)
    return bool(torch.equal(given.cpu().long().expand_as(ours), ours.long()))


def _rescan(model: torch.nn.Module, input_ids: torch.Tensor, cache: Any, led: Ledger | None, name: str,
            kwargs: dict[str, Any]) -> Any:
    """generate() over the whole sequence into a new cache: the model restarts its SSM scan on a multi-token forward
    over a filled cache (compat.restarts_scan), so no cached state is continued."""
    held = led.length if led is not None else 0
    record = ResumeRecord(held, 0, int(input_ids.shape[1]), "recurrent", f"{type(model).__name__} restarts its SSM "
                          "scan on a multi-token forward over a filled cache (transformers reads the cached state for "
                          "one token only): re-prefilled into a new cache")
    if cache is not None:  # (None: generate() builds its own)
        new = type(cache) is DynamicCache
        cache = DynamicCache(config=compat.text_config(model.config)) if new else fresh(model, cache)
    out = compat.plain_generate(model)(input_ids, **{name: cache}, **kwargs)
    return _with_record(out, cache, record)
