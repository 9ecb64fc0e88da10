"""The guard's checks that read the cache's token ledger (kvresume.ledger): what the cache holds, not its lengths.

Each runs only where the cache has a ledger (`track(model)`, or the factory given token ids) and raises
`ResumeInputError` with `fix`: the arguments that replace the call's (`crop`: keep the first N cached tokens;
`attention_mask` / `position_ids`: pass these), which notebook 08 applies and compares with the full forward.
`resume`: pass the whole sequence through kvresume.resume, which the caller runs with its whole ids.
In order: `ledger_tokens` (ids generate() reads as a whole sequence that differ from the cached tokens: a cache reused
without copy.deepcopy, or a suffix passed without the cached columns of its mask: resume on the whole sequence, since
which cached prefix the suffix follows is not among the inputs), `ledger_length` (a cache holding all the ids it
should precede), `ledger_mask` (a mask that attends to slots written as padding), `ledger_positions` (the positions
the model would rotate the first fed token with do not continue each row's last cached position, the last
the given mask attends: a row that ended early, its padding after EOS hidden, continues after its EOS; read at the text
rotary embedding, so the model's own position state, M-RoPE's rope_deltas, is included: where they continue a prefix
of the cached slots, the rest was written after it, re-fed or another request's: crop to that prefix; where they
skip slots a crop removed (the stored ledger, trimmed lazily, still holds them): re-feed those through resume; where
the cache's own slots sit at stuck positions (`prefix.misplaced`): re-feed from there through resume).
Every fix is fitted to the call (`_refuse`): an encoder-decoder's mask and whole decoder ids, and, where the cache
cannot be cropped (5.17.0's StaticCache, a sliding layer past its window, linear layers without recorded states), a
re-prefill through resume() instead of a crop that would raise.
"""
from __future__ import annotations

from typing import Any

import torch

from .call import ResumeCall, ResumeInputError, is_encoder_decoder, refuse
from .ledger import Ledger
from .prefix import can_crop, has_crop, misplaced
from .writes import mask_slots, plain


def _refuse(call: ResumeCall, check: str, message: str, **fix: object) -> ResumeInputError:
    """`refuse`, the fix fitted to the call: an encoder-decoder's mask is its decoder_attention_mask; a crop of a cache
    that cannot be cropped (a StaticCache, a sliding layer past its window) becomes a re-prefill through resume()."""
    if is_encoder_decoder(call.model) and "attention_mask" in fix:
        fix["decoder_attention_mask"] = fix.pop("attention_mask")
        message = message.replace("a mask of", "a decoder_attention_mask of")
    if is_encoder_decoder(call.model) and fix.get("crop") is not None and call.given_ids is not None and call.ledger:
        whole = _decoder_whole(call.ledger, call.given_ids, int(fix["crop"]))  # type: ignore[arg-type]
        fix.update(decoder_input_ids=whole, decoder_attention_mask=torch.ones_like(whole))
        message += (f" (an encoder-decoder: generate() prepends the start token to decoder ids that lack it, so pass "
                    f"the whole decoder sequence, {whole.shape[-1]} tokens, with a decoder_attention_mask of ones)")
    if fix.get("crop") is not None and not can_crop(call.cache):
        message = (f"{message}. This cache cannot be cropped ({type(call.cache).__name__}"
                   f"{', a sliding layer past its window' if has_crop(call.cache) else ': its layers have no crop'}): "
                   f"pass the whole sequence through kvresume.resume(model, whole_ids, cache), which re-prefills it")
        fix = {"resume": True}
    return refuse(check, message, **fix)


def _decoder_whole(led: Ledger, ids: torch.Tensor, crop: int) -> torch.Tensor:
    """The whole decoder sequence after a crop to `crop`: the ids where they start with the first `crop` cached tokens,
    else those cached tokens + the ids (a suffix)."""
    if int(ids.shape[-1]) > crop and led.common_prefix(ids) >= crop:
        return ids
    return torch.cat([led.first(crop).token_ids.to(ids.device), ids], 1)


def _whole(call: ResumeCall) -> bool:
    """generate() reads the ids as the whole sequence (it feeds fewer than given, the cached part sliced off)."""
    return call.given_ids is not None and call.fed is not None and call.f != call.n


def _given(call: ResumeCall) -> torch.Tensor | None:
    """The ids given, repeated per cache row where generate() repeats them (num_return_sequences, num_beams: the
    cache expanded alike holds a multiple of their rows)."""
    ids, led = call.given_ids, call.ledger
    if ids is None or led is None or led.batch == int(ids.shape[0]) or led.batch % int(ids.shape[0]):
        return ids
    return ids.repeat_interleave(led.batch // int(ids.shape[0]), 0)


def ledger_tokens(call: ResumeCall) -> None:
    """Ids read as the whole sequence whose first tokens differ from the cached ones."""
    led, ids = call.ledger, _given(call)
    if led is None or not _whole(call):
        return
    past, n = led.length, call.n
    p = led.common_prefix(ids)
    if p >= min(n, past):
        return
    if p > 0:
        row = int((led.token_ids[:, p].to(ids.device) != ids[:, p]).nonzero()[0])
        raise _refuse(call, "ledger_tokens", f"input_ids differ from the cached tokens at position {p} (row {row}: cached "
                     f"{int(led.token_ids[row, p])}, given {int(ids[row, p])}): the cache holds {past - p} token(s) of "
                     f"another request after the common prefix (a cache reused without copy.deepcopy?); copy.deepcopy "
                     f"the cache before each reuse, or crop it to the common prefix of {p} tokens (cache.crop({p}))",
                     crop=p)
    if _tail(led, ids) and past > n:  # the given tokens are the cache's own last ones: cached already
        raise _refuse(call, "ledger_tokens", f"input_ids are the cache's last {n} token(s), cached already: generate() would "
                     f"process them twice; crop the cache to {past - n} tokens (cache.crop({past - n})) with a mask of "
                     f"{past} columns, or pass only new tokens", crop=past - n,
                     attention_mask=_mask(led.first(past - n), n, ids.device))
    raise _refuse(call, "ledger_tokens", f"input_ids do not start with the cache's tokens (position 0: cached "
                 f"{int(led.token_ids[0, 0])}, given {int(ids[0, 0])}), so they are the new tokens, not the whole sequence "
                 f"generate() reads them as: pass the whole sequence (the cached part's ids + these) through "
                 f"kvresume.resume(model, whole_ids, cache), which keeps the longest cached common prefix and feeds "
                 f"the rest; only where these tokens follow all {past} cached ones (not another request's): "
                 f"attention_mask with {past + n} columns and position_ids from {led.next_positions().tolist()}",
                 resume=True)


def _mask(led: Ledger, n: int, device: Any) -> torch.Tensor:
    """The cached slots' mask + n ones."""
    return torch.cat([led.mask.to(device), torch.ones(led.batch, n, dtype=torch.long, device=device)], 1)


def _tail(led: Ledger, ids: torch.Tensor | None, k: int | None = None) -> bool:
    """Whether the first k given ids (all where None) are the cache's last k tokens in every row."""
    if ids is None:
        return False
    k = int(ids.shape[-1]) if k is None else k
    return 0 < k <= led.length and bool((led.token_ids[:, led.length - k:] == ids[:, :k].cpu()).all())


def ledger_length(call: ResumeCall) -> None:
    """A cache holding at least as many tokens as the whole ids it should precede (ids sliced as a whole sequence, or
    a mask as wide as the ids alone: nothing new would be fed), or holding the first of the whole ids that generate()
    feeds all of (assisted decoding, prompt lookup on a model whose positions follow the cache position, which the
    positions check cannot see: 0.62 off measured on BartForCausalLM, 5.17.0 and 5.25.0). A regenerate (ids = the prompt, the cache also holding
    the old answer) is refused too: plain generate() re-feeds ids[cached - n:] with an n-column mask, so from step 2
    it attends the OLD answer's slots; right only while the new answer equals the old (greedy), 0.03-0.57 off once it
    differs (sampling), measured on 5.17.0."""
    led, mask = call.ledger, call.mask2d()
    as_whole = _whole(call) or (call.given_ids is not None and (mask is None or int(mask.shape[-1]) == call.n))
    if led is None or not as_whole:
        return
    past, n = led.length, call.n
    if past >= n and led.common_prefix(_given(call)) >= n:
        raise _refuse(call, "ledger_length", f"the cache holds {past} tokens, the first {n} of them these input_ids: nothing "
                     f"is left to feed; crop the cache to {n - 1} tokens (cache.crop({n - 1})) so generate() feeds the "
                     f"last one", crop=n - 1)
    if 0 < past < n and call.fed is not None and call.f == n and led.common_prefix(_given(call)) >= past:
        raise _refuse(call, "ledger_length", f"generate() feeds all {n} input_ids beside a cache that holds the first "
                     f"{past} of them (this call does not slice the cached part off): those {past} would be written a "
                     f"second time after themselves; crop the cache to 0 tokens (cache.crop(0)) with a mask of {n} columns "
                     f"so each is fed once, or pass the whole sequence through kvresume.resume(model, whole_ids, cache), "
                     f"which keeps the cached part where this release can continue it with these arguments", crop=0,
                     attention_mask=_mask(led.first(0), n, call.given_ids.device))


def ledger_mask(call: ResumeCall) -> None:
    """A 2-D mask whose cached columns attend to slots the cache wrote as padding."""
    led, mask = call.ledger, call.mask2d()
    if led is None or mask is None or int(mask.shape[-1]) < led.length or int(mask.shape[0]) != led.batch:
        return
    cached = mask[:, :led.length].long().cpu()
    wrong = ((cached != 0) & (led.mask == 0)).nonzero()
    if wrong.numel():
        row, slot = (int(v) for v in wrong[0])
        fixed = torch.cat([led.mask.to(mask.device, mask.dtype), mask[:, led.length:]], 1)
        raise _refuse(call, "ledger_mask", f"attention_mask attends to cached slot {slot} of row {row}, which the cache wrote as "
                     f"padding (mask 0): pass the mask the cached slots were written with (zeros on padding) + the new "
                     f"tokens' columns", attention_mask=fixed)


def next_positions(led: Ledger, f: int, start: torch.Tensor | None = None,
                   fed_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The position_ids that continue each row (from `start`, default the ledger's next positions): [batch, f], or
    [3, batch, f] for an M-RoPE ledger (text tokens); with the fed tokens' 2-D mask [batch, f], each row's attended
    tokens count on from `start` and its padding sits at 1 (as generate() fills it)."""
    start = led.next_positions() if start is None else start
    if fed_mask is not None and led.positions.shape[0] == 1:
        m = plain(fed_mask).cpu()
        return (start.view(-1, 1) + m.cumsum(-1) - 1).masked_fill(m == 0, 1)
    ids = start.view(-1, 1) + torch.arange(f).view(1, -1)
    return ids if led.positions.shape[0] == 1 else ids.unsqueeze(0).expand(led.positions.shape[0], *ids.shape).clone()


def attended_next(led: Ledger, mask: torch.Tensor | None) -> torch.Tensor:
    """Per row, the position the next token continues at beside the given 2-D mask: 1 + the largest position of the
    cached slots it attends (a row that ended early, EOS then padding the mask hides, continues after its EOS, as a
    no-cache run of the same mask places it); the ledger's next positions where no such mask of these rows is given
    or a row attends no cached slot. Slots hidden before an attended one (a hole) do not move it: the slots after
    them were written counting them."""
    base = led.next_positions()
    if mask is None or mask.dim() != 2 or int(mask.shape[0]) != led.batch or int(mask.shape[-1]) < led.length:
        return base
    attended = (plain(mask[:, :led.length]).cpu() != 0) & (led.mask != 0)
    top = led.positions.amax(0).masked_fill(~attended, -1).amax(-1)
    return torch.where(top >= 0, top + 1, base)


def first_attended(fed: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per row, the position of the first fed token the mask attends (-1 where it attends none; without a 2-D mask of
    these rows, the first fed token); fed [R, B, f]. A padding token's position is whatever the caller filled in
    (assisted decoding feeds a left-padded row's pads)."""
    first = fed.amin(0).cpu()  # [B, f]: the smallest rotary row per token
    real = plain(mask_slots(mask, int(first.shape[0]), int(fed.shape[-1]), "cpu")).cpu().bool()
    at = real.to(torch.uint8).argmax(-1, keepdim=True)
    return torch.where(real.any(-1), first.gather(-1, at).squeeze(-1), torch.full_like(first[:, 0], -1))


def ledger_positions(call: ResumeCall) -> None:
    """The first fed token's positions (as the model rotates them) continue each row's last cached position."""
    led, fed = call.ledger, call.fed_positions
    if led is None or fed is None or fed.shape[-1] == 0 or led.length == 0:
        return
    bad = misplaced(led)
    if bad is not None:
        raise _refuse(call, "ledger_positions", f"the cache's slots from {bad} were written at stuck positions (row 0: "
                      f"{led.positions[0, 0, max(bad - 2, 0):bad + 3].tolist()}), not after the slots before them: "
                      f"continuing them keeps the wrong keys; re-feed the tokens from slot {bad} (the whole sequence "
                      f"through kvresume.resume(model, whole_ids, cache), which keeps the {bad} slots written right)",
                      resume=True)
    got, want = first_attended(fed, call.attention_mask), attended_next(led, call.mask2d())
    if got.shape != want.shape:
        return
    got = torch.where(got < 0, want, got)  # a row whose fed tokens are all padding: nothing rotated to compare
    if torch.equal(got, want):
        return
    f, ids = int(fed.shape[-1]), call.fed_ids
    device = ids.device if ids is not None else "cpu"
    keep = prefix_before(led, got)
    if keep is not None:  # the fed tokens continue the first `keep` slots; the cache holds more at or after them
        k = led.length - keep
        if k <= f and _tail(led, ids, k):
            raise _refuse(call, "ledger_positions", f"the first {k} fed token(s) are the cache's last {k}, at the same positions "
                         f"(cached already): crop the cache to {keep} tokens (cache.crop({keep})) with a mask of "
                         f"{keep + f} columns, or pass only tokens after position {int(want.max()) - 1}", crop=keep,
                         attention_mask=_mask(led.first(keep), f, device))
        raise _refuse(call, "ledger_positions", f"the first fed token's position(s) {got.tolist()} continue the cache's first "
                     f"{keep} slots, but it holds {k} more written at or after them (token ids "
                     f"{led.token_ids[0, keep:keep + 8].tolist()}): another request's tokens (a cache reused without "
                     f"copy.deepcopy?); crop the cache to {keep} tokens (cache.crop({keep})) with a mask of {keep + f} "
                     f"columns", crop=keep, attention_mask=_mask(led.first(keep), f, device))
    cropped = cropped_before(call, led, got)
    if cropped:
        raise _refuse(call, "ledger_positions", f"the first fed token is at position(s) {got.tolist()}, but the cache was cropped "
                     f"to {led.length} tokens and continues at {want.tolist()}: the {len(cropped)} cropped token(s) "
                     f"{cropped} between are not in it; feed them before these (the whole sequence through "
                     f"kvresume.resume(model, whole_ids, cache), which re-feeds what the cache lacks)", resume=True)
    hidden = not torch.equal(want, led.next_positions())  # a row's last slots hidden by the mask (ended early)
    mask = call.mask2d()
    fed_mask = mask[:, -f:] if mask is not None and int(mask.shape[0]) == led.batch and mask.shape[-1] >= f else None
    last, counted = (("last attended slots", "; the slots the mask hides after them are not counted") if hidden
                     else ("last slots", ""))
    each = " (each row's attended tokens counted on from there)" if fed_mask is not None else ""
    raise _refuse(call, "ledger_positions", f"the model would place the first fed token at position(s) {got.tolist()}, but the "
                 f"cache's rows continue at {want.tolist()} (their {last} were written at {(want - 1).tolist()}"
                 f"{counted}): pass position_ids starting at {want.tolist()}"
                 f"{each}",
                 position_ids=next_positions(led, f, want, fed_mask))


def prefix_before(led: Ledger, got: torch.Tensor) -> int | None:
    """How many first slots were written before each row's fed position `got`, where exactly those are a prefix that
    the fed token continues and the cache holds more slots after them (None otherwise)."""
    below = led.positions.amax(0) < got.view(-1, 1)
    keep = int(below.sum(-1).min())
    if keep == led.length or not bool(below[:, :keep].all()) or bool(below[:, keep:].any()):
        return None
    start = led.first(keep).next_positions() if keep else led.positions[..., 0].amin(0)  # keep 0: where slot 0 sits
    return keep if torch.equal(start, got) else None


def cropped_before(call: ResumeCall, led: Ledger, got: torch.Tensor) -> list[int]:
    """The token ids of slots a crop removed (still in the stored ledger, which a crop trims lazily) whose positions
    lie between the cache's last slot and the fed position `got` ([] where the ledger shows no such crop)."""
    stored = call.stored  # read before generate() ran: the tracker trims it at the call's first write
    if stored is None or stored.length <= led.length or stored.batch != led.batch or bool((got <= led.next_positions()).any()):
        return []
    for m in range(1, stored.length - led.length + 1):
        if torch.equal(stored.first(led.length + m).next_positions(), got):
            return stored.token_ids[0, led.length:led.length + m].tolist()
    return []


def ledger_processed(call: ResumeCall) -> None:
    """The caller's processed length (where given, one count for every row) differs from what the ledger holds: slots
    after it (re-fed, or another request's: crop to it) or tokens it lacks (a crop: re-feed them through resume)."""
    led, p = call.ledger, call.processed_length
    if led is None or not isinstance(p, int) or call.rows is not None or p == led.length or call.given_ids is None:
        return
    if p > led.length:
        raise _refuse(call, "ledger_processed", f"{p} tokens were processed but the cache holds {led.length} (the ledger's "
                     f"tokens): the {p - led.length} token(s) between are not in it; feed them before these (the whole "
                     f"sequence through kvresume.resume(model, whole_ids, cache))", resume=True)
    f = call.f
    raise _refuse(call, "ledger_processed", f"{p} tokens were processed but the cache holds {led.length}: its last "
                 f"{led.length - p} slot(s) (token ids {led.token_ids[0, p:p + 8].tolist()}) came after them (re-fed, or "
                 f"another request's); crop the cache to {p} tokens (cache.crop({p})) with a mask of {p + f} columns",
                 crop=p, attention_mask=_mask(led.first(p), f, call.given_ids.device))
