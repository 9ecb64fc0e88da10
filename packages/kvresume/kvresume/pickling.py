"""What a pickled tracked model holds (pickle, torch.save, multiprocessing): each tracking hook pickles as a no-op
and the tracker as nothing, so the copy loads untracked, in any process; `track()` it there to record again."""
from __future__ import annotations

from typing import Any, Callable


def noop(*_args: Any, **_kwargs: Any) -> None:
    """A tracking hook of a model that was pickled: it records nothing."""
    return None


def nothing() -> None:
    """A tracker, unpickled: none (the model reads as untracked)."""
    return None


def method(owner: Any, name: str) -> Any:
    """An image encoder the tracker wrapped, unpickled: the owner's own method."""
    return getattr(type(owner), name).__get__(owner)


class Hook:
    """A tracking hook that pickles as `noop` (its closure holds the tracker, which cannot cross a process)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "Hook":
        """A deep copy of the model keeps the hook itself (it is the tracker's, as a plain function would be)."""
        return self

    def __reduce__(self) -> tuple:
        return (_noop, ())


def _noop() -> Callable[..., None]:
    return noop
