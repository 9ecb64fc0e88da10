"""kvresume.prefix.can_crop on stand-in layers: a sliding layer that no longer records its past crops until its window
is full (at the window it cannot), a layer without the attribute records it, a linear layer without it cannot."""
from __future__ import annotations

from types import SimpleNamespace

from kvresume.prefix import _content_at, can_crop, explain


def layer(length, window=None, **extra):
    return SimpleNamespace(crop=lambda n: None, get_seq_length=lambda: length, sliding_window=window, **extra)


def cache(*layers):
    return SimpleNamespace(layers=list(layers))


def test_a_sliding_layer_without_its_past_crops_below_its_window_only():
    assert can_crop(cache(layer(3, 4, record_past=False)))
    assert not can_crop(cache(layer(4, 4, record_past=False)))
    assert not can_crop(cache(layer(3, 3, record_past=False), layer(0)))


def test_a_layer_that_does_not_say_records_its_past():
    assert can_crop(cache(layer(9, 4), layer(5, None, conv_states={})))
    assert can_crop(cache(layer(9, 4, record_past=True)))


def test_a_linear_layer_without_its_past_states_cannot_crop():
    assert not can_crop(cache(layer(2, None, record_past=False, conv_states={})))
    assert can_crop(cache(layer(2, None, record_past=False)))
    assert not can_crop(cache(layer(2), SimpleNamespace(get_seq_length=lambda: 2)))  # no crop method


class Chars:
    """A tokenizer stand-in: one character a token (id = its code), and 1000 -> "lo" (another split of the text)."""

    def decode(self, ids, skip_special_tokens):
        assert skip_special_tokens is False  # the markup is read too
        return "".join("lo" if i == 1000 else chr(i) for i in ids)


def ids(text: str, *extra: int):
    import torch

    return torch.tensor([[ord(ch) for ch in text] + list(extra)])


OLD = "<u>first message here, long enough</u><a>the reply text that goes on and on, and on, longer still</a>"


def test_without_a_tokenizer_the_ids_differ():
    assert explain(ids("ab"), ids("ac"), 1) == (
        "differs", "the ids differ from the cached ones at token 1 (no tokenizer given to say why)")


def test_the_cached_text_continued_in_other_tokens_is_the_tokenizers_split():
    head = "a long shared text before the join: hel"
    cached, given = ids(head + "loabc"), ids(head, 1000, *map(ord, "abcdef"))
    p = len(head)
    reason, detail = explain(cached, given, p, Chars())
    c = p + 5
    assert reason == "tokenizer" and detail == (
        f"the text is the cached text continued, but the tokenizer split it differently at token {p} (cached "
        f"{[ord('l'), ord('o'), ord('a')]}, given {[1000, ord('a'), ord('b')]}): the join "
        f"{(head + 'loabc')[c - 20:c]!r} is re-tokenized")
    reason, detail = explain(ids("hello"), ids("hel", 1000, 65, 66, 67, 68), 3, Chars())  # a join 5 characters in
    assert detail.endswith("the join 'hello' is re-tokenized") and "given [1000, 65, 66])" in detail
    assert explain(ids("hello world"), ids("hello wor"), 9, Chars())[0] == "tokenizer"  # the given text shorter


def test_a_change_inside_a_message_is_an_edit_and_outside_any_a_template_change():
    new = OLD.replace("goes on", "GOES on")
    c = OLD.index("goes on")
    messages = [{"role": "user", "content": ["a part"]}, {"role": "system", "content": ""},
                {"role": "user", "content": "first message here, long enough"},
                {"role": "tool", "content": "never rendered"},
                {"role": "assistant", "content": "the reply text that GOES on and on, and on, longer still"}]  # as given now
    assert explain(ids(OLD), ids(new), 5, Chars(), messages) == (
        "edit", f"message 4 was edited: text differs at character {c} ({OLD[c:c + 20]!r} -> {new[c:c + 20]!r})")
    markup = OLD.replace("<a>", "<b>")
    c = OLD.index("<a>") + 1
    assert explain(ids(OLD), ids(markup), 5, Chars(), messages) == (
        "template", f"the chat template rendered earlier text differently at character {c} ({OLD[c:c + 20]!r} -> "
                    f"{markup[c:c + 20]!r}): not inside any message's verbatim content")
    c = OLD.index("goes on")
    assert explain(ids(OLD), ids(new), 5, Chars()) == (
        "template", f"earlier text changed at character {c} ({OLD[c:c + 20]!r} -> {new[c:c + 20]!r}); pass messages= "
                    f"to tell a template change from an edit")


def test_a_message_found_where_the_text_first_differs_that_the_old_text_holds_further_on_is_a_template_change():
    old = "abc [sys] hello there, all [end] hello there, all"
    new = "abc hello there, all [end] hello there, all!!!!!!!!!!!!!!!"
    messages = [{"role": "user", "content": "hello there, all"}]
    assert explain(ids(old), ids(new), 1, Chars(), messages)[0] == "template"  # an earlier system part dropped
    assert _content_at(new, 4, messages, old) is None
    assert _content_at(new, 4, messages, "abc hello") == 0  # not further on in the old text: the message itself
    assert _content_at("hello there, all", 0, messages) == 0
    assert _content_at(new, 4, None, old) is None
    text, old = "X: hello, hello there", "X: hello, [s] hello there"  # the old text holds it before and after c
    assert _content_at(text, 10, [{"content": "hello"}, {"content": "hello"}], old) is None


def test_messages_are_found_in_order_each_after_the_one_before():
    text = "abcXabcY"
    messages = [{"content": "abc"}, {"content": "abc"}]
    assert _content_at(text, 5, messages) == 1 and _content_at(text, 1, messages) == 0
    assert _content_at(text, 3, messages) is None and _content_at(text, 7, messages) is None  # between, after
    assert _content_at(text, 5, [{"content": "zzz"}, *messages]) == 2  # one not rendered: skipped


def test_each_rows_start_position_after_its_last_attended_slot():
    import torch

    from kvresume.ledger import empty_ledger, ledger_from_tensors
    from kvresume.prefix import start_positions

    led = ledger_from_tensors(torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[[0, 1, 2], [5, 6, 9]]]),
                              torch.tensor([[1, 1, 1], [1, 1, 0]]))
    got = start_positions(led)
    assert got.dtype == torch.long and got.tolist() == [3, 7]
    none = start_positions(empty_ledger(2))
    assert none.dtype == torch.long and none.tolist() == [0, 0]
