"""kvresume.pickling on stand-ins: a tracking hook calls through, deep-copies as itself and pickles as a no-op; an
image encoder the tracker wrapped unpickles as its owner's own method (5.25's path, taken here on any release)."""
from __future__ import annotations

import copy
import pickle

from kvresume import pickling


class Owner:
    def encode(self, x):
        return ("own", self, x)


def test_an_unpickled_encoder_is_the_owners_own_method_not_the_instances():
    owner = Owner()
    owner.encode = lambda x: "wrapped"
    method = pickling.method(owner, "encode")
    assert method(3) == ("own", owner, 3) and method.__self__ is owner


def test_a_hook_calls_through_copies_as_itself_and_pickles_as_a_noop():
    hook = pickling.Hook(lambda *a, **k: (a, k))
    assert hook(1, b=2) == ((1,), {"b": 2})
    assert copy.deepcopy(hook) is hook
    loaded = pickle.loads(pickle.dumps(hook))
    assert loaded is pickling.noop and loaded(1, b=2) is None
    assert pickling.nothing() is None and pickling._noop() is pickling.noop
