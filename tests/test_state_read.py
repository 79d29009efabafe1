"""The states' read (adapters/states.py) against a real Redis: the partition's sequence first,
then an HMGET per state, every kind of data a state key may hold."""

from __future__ import annotations

import hiredis
import pytest

from worker.common.connection import connect
from worker.common.keys import Keys
from worker.engine.adapters.states import (
    FIELDS,
    WRONG_TYPE,
    PartitionDataError,
    StateReader,
    hmgets_of,
)
from worker.engine.compute.state_cache import StateCache

KEYS = Keys("intentstream")


def reader(r) -> StateReader:
    return StateReader(r, KEYS, StateCache(1000), lambda version: version)


def test_the_sequence_is_read_before_the_states():
    """A commit landing between the two reads makes some states newer than the sequence
    read, which refuses the commit built on them; read the other way round, states older than
    the sequence would pass."""
    states = reader(connect("redis://localhost:1/0"))  # never connected
    read = states.command(states.request(0, ["a", "b"]))
    r = hiredis.Reader()
    r.feed(read.packed)
    commands = list(iter(r.gets, False))
    assert read.replies == len(commands) == 3
    assert commands[0] == [b"GET", KEYS.commit_seq(0).encode()]
    assert commands[1] == [b"HMGET", KEYS.state(0, "a").encode(), *(f.encode() for f in FIELDS)]


def test_each_kind_of_state_key_reads_as_its_fields(redis_server):
    r = connect(redis_server.url)
    r.set(KEYS.commit_seq(0), "41")
    r.hset(KEYS.state(0, "full"), mapping={"h": b"\0" * 8, "n": "2", "model": "1"})
    r.set(KEYS.state(0, "wrong"), "an operator's SET")
    states = reader(r)
    request = states.request(0, ["full", "absent", "wrong"])
    flat = states._run(0, states.command(request))
    width = len(FIELDS)
    assert flat[0] == b"41" and len(flat) == 1 + 3 * width
    full = dict(zip(FIELDS, flat[1 : 1 + width], strict=True))
    assert full["h"] == b"\0" * 8 and full["n"] == b"2" and full["s"] is None
    assert flat[1 + width : 1 + 2 * width] == [None] * width
    assert flat[1 + 2 * width] == WRONG_TYPE and flat[2 + 2 * width : 1 + 3 * width] == [None] * (
        width - 1
    )


@pytest.mark.parametrize("bad", ["list", "text"])
def test_a_sequence_that_is_no_sequence_stops_the_partition(redis_server, bad):
    r = connect(redis_server.url)
    if bad == "list":
        r.lpush(KEYS.commit_seq(0), "x")
    else:
        r.set(KEYS.commit_seq(0), "not a number")
    states = reader(r)
    with pytest.raises(PartitionDataError, match="seq"):
        states.read(0, ["a"], (1, 4), "1")


@pytest.mark.parametrize("users", [1, 40])  # a few: hmgets_of; more than FEW_READS: framers
def test_each_hmget_is_the_command_hiredis_packs(users):
    """The HMGETs laid out from a packed head and tail are hiredis's bytes for any key (a
    user id of any script, any length)."""
    names = ["ü-ß-用户", "u" * 300, "plain"] + [f"u{i}" for i in range(users)]
    states = reader(connect("redis://localhost:1/0"))  # never connected
    read = states.command(states.request(3, names))
    expected = hiredis.pack_command(("GET", KEYS.commit_seq(3))) + b"".join(
        hiredis.pack_command(("HMGET", KEYS.state(3, u), *FIELDS)) for u in names
    )
    assert read.packed == expected and read.replies == len(names) + 1
    keys = [KEYS.state(3, u) for u in names]
    assert hmgets_of(keys) == [hiredis.pack_command(("HMGET", k, *FIELDS)) for k in keys]
