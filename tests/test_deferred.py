"""Dataclass instances whose fields, but a few, are made on first use (compute/deferred.py):
made once, whichever is read first; equal field by field to the instance made at once;
copies, equality and a name it never has behave as on a plain dataclass."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields

import numpy as np
import pytest

from worker.engine.compute.deferred import Deferred, complete
from worker.engine.compute.user_states import UserStates


@dataclass
class Pair:
    name: str
    values: np.ndarray


class LazyPair(Deferred, Pair):
    pass


def made(calls: list[int]) -> LazyPair:
    def rest() -> dict:
        calls.append(1)
        return {"values": np.arange(3)}

    return LazyPair.made({"name": "a"}, rest)


def test_the_rest_is_made_once_on_the_first_read_of_any_of_it():
    calls: list[int] = []
    pair = made(calls)
    assert pair.name == "a" and pair.deferring and calls == []
    assert pair.values.tolist() == [0, 1, 2] and calls == [1] and not pair.deferring
    assert pair.values.tolist() == [0, 1, 2] and calls == [1]
    complete(pair)
    assert calls == [1]


def test_complete_makes_it_now_and_leaves_other_objects_alone():
    calls: list[int] = []
    pair = made(calls)
    complete(pair)
    assert calls == [1] and "values" in vars(pair)
    plain = Pair("b", np.zeros(1))
    complete(plain)
    assert vars(plain) == {"name": "b", "values": plain.values}


def test_a_name_it_never_has_raises_and_dunders_make_nothing():
    calls: list[int] = []
    pair = made(calls)
    with pytest.raises(AttributeError):
        pair.__missing_dunder__  # noqa: B018
    assert calls == []
    with pytest.raises(AttributeError):
        pair.nothing  # noqa: B018 (reading it makes the rest, which does not hold it)
    assert calls == [1]


def test_copies_and_repr_see_every_field():
    pair = made([])
    twin = copy.deepcopy(pair)
    assert twin.values.tolist() == [0, 1, 2] and twin.name == "a"
    assert "values=array([0, 1, 2])" in repr(made([]))


def test_a_states_view_is_rows_of_the_whole_once_read():
    """UserStates.view: the users, sequence and resets made at once, every other field
    `rows` gives once read, still views of the whole's arrays."""
    whole = UserStates.empty([f"u{i}" for i in range(5)], (1, 2), b"1")
    whole.replay, whole.rewrite = [0, 3], [4]
    view = whole.view(2, 5, b"9")
    assert view.deferring and view.users == ["u2", "u3", "u4"] and view.seq == b"9"
    assert view.deferring and not view.resets
    rows = whole.rows(2, 5)
    for f in fields(UserStates):
        if f.name != "seq":
            mine, theirs = getattr(view, f.name), getattr(rows, f.name)
            if isinstance(mine, np.ndarray):
                assert np.array_equal(mine, theirs, equal_nan=True), f.name
            else:
                assert mine == theirs, f.name
    whole.h += 1
    assert view.h.sum() == 6
