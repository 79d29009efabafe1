"""Changing the partition count: `intentstream partitions resize --to N`.

A user's partition is crc32(user_id) mod P, so a new P moves most users: their state hash
must follow them, or their next event would start from zero on the new partition. With every
worker stopped and the streams drained, the resize records `resize_to` in `{prefix}:config`
(workers and producers refuse to start while it is there), moves each state hash to its new
partition, bumps the moved partitions' commit sequences, creates the new partitions' streams
and groups, and finally records the new count and removes `resize_to`.

Every step can be repeated: a state is copied whole (fields and TTL) to its new key before
the old key is deleted, and a run that finds both keys equal only deletes the old one. So a
run interrupted anywhere and run again finishes the job without losing or duplicating a state.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from worker.batch import entry_id
from worker.connection import Client, is_cluster
from worker.keys import Keys
from worker.lag import COUNT_CAP, count_after, undelivered

MAX_PARTITIONS = 4096  # the bound of the `partitions` setting
CHUNK = 500  # state keys read and written per pipeline

# KEYS: the config hash. ARGV: the new count. The last step, in one atomic call.
FINISH_SCRIPT = """
redis.call('HSET', KEYS[1], 'partitions', ARGV[1])
redis.call('HDEL', KEYS[1], 'resize_to')
return 1
"""


class ResizeRefusedError(Exception):
    """The resize cannot run now; the message (one line) says why and what to do."""


@dataclass
class ResizeReport:
    """What a resize did."""

    old: int
    new: int
    moved: int = 0  # state hashes moved to their new partition
    finished: int = 0  # moves an interrupted run had copied; only the old key was left
    conflicts: int = 0  # a user with a state in two partitions: the later one was kept
    skipped: int = 0  # keys where a state should be that hold another type: left in place
    created: list[int] = field(default_factory=list)  # partitions whose group was created

    def summary(self) -> str:
        created = ", ".join(map(str, self.created)) or "none"
        line = (
            f"partitions {self.old} -> {self.new}: {self.moved} user states moved"
            f" ({self.finished} finished from an interrupted run), consumer groups created"
            f" on partitions: {created}"
        )
        if self.conflicts:
            line += f"; {self.conflicts} users had states in two partitions (kept the later)"
        if self.skipped:
            line += f"; {self.skipped} keys of another type left in place"
        return line


# ---- the checks before anything is written ---------------------------------------------------


def live_workers(client: Client, keys: Keys, partitions: int) -> tuple[int, list[int]]:
    """Live announced workers (entries of `{prefix}:workers` not yet expired) and the
    partitions whose lease key exists."""
    now_ms = int(time.time() * 1000)
    live = client.zcount(keys.workers, f"({now_ms}", "+inf")
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.exists(keys.lease(p))
    leased = [p for p, n in zip(range(partitions), pipe.execute(), strict=True) if n]
    return int(live), leased


def _field(info: dict, name: str):
    value = info.get(name, info.get(name.encode()))
    return value.decode() if isinstance(value, bytes) else value


def undrained(client: Client, keys: Keys, group: str, partitions: int) -> list[str]:
    """Per partition with entries the group has not finished: how many are undelivered
    (the group's lag) and pending (delivered, not acknowledged)."""
    problems = []
    for p in range(partitions):
        stream = keys.events(p)
        kind = client.type(stream)
        if kind == b"none":
            continue
        if kind != b"stream":
            problems.append(f"partition {p}: {stream} holds a {kind.decode()}, not a stream")
            continue
        info = next((g for g in client.xinfo_groups(stream) if _field(g, "name") == group), None)
        if info is None:  # no group yet: a worker would create it after the last acknowledged
            acked = client.get(keys.acked(p))
            lag = count_after(client, stream, acked.decode()) if acked else client.xlen(stream)
            pending = 0
        else:
            pending = int(_field(info, "pending"))
            lag = undelivered(client, stream, info)  # not XINFO's lag alone: see worker/lag.py
        if lag is None:
            problems.append(f"partition {p}: more than {COUNT_CAP} undelivered, {pending} pending")
        elif lag or pending:
            problems.append(f"partition {p}: {lag} undelivered, {pending} pending")
    return problems


# ---- moving the states ----------------------------------------------------------------------


def _primaries(client: Client) -> list[redis.Redis]:
    if is_cluster(client):
        return [client.get_redis_connection(n) for n in client.get_primaries()]
    return [client]


def state_keys(client: Client, keys: Keys) -> Iterator[bytes]:
    """Every key under the prefix's state namespace, SCANned on every primary."""
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", keys.prefix) + ":state:*"
    for node in _primaries(client):
        yield from node.scan_iter(match=pattern, count=1000)


def parse_state_key(keys: Keys, key: bytes) -> tuple[int, bytes] | None:
    """(partition, user id bytes) of a state key, or None for a key of another shape."""
    head = f"{keys.prefix}:state:{{".encode()
    if not key.startswith(head):
        return None
    digits, sep, user = key[len(head) :].partition(b"}:")
    if not sep or not digits.isdigit() or not user:
        return None
    return int(digits), user


def _later(a: dict, b: dict) -> dict:
    """Of two states of one user, the one that applied the later entry (a on a tie)."""

    def last(state: dict) -> tuple[int, int]:
        try:
            return entry_id(state.get(b"last_id", b""))
        except ValueError:
            return (-1, -1)

    return b if last(b) > last(a) else a


def _move_chunk(
    client: Client, keys: Keys, chunk: list[tuple[bytes, int, bytes]], to: int,
    report: ResizeReport, changed: set[int],
) -> None:  # fmt: skip
    """Move a chunk of (old key, old partition, user) to their partitions under `to`."""
    targets = [keys.state(zlib.crc32(user) % to, "").encode() + user for _, _, user in chunk]
    read = client.pipeline(transaction=False)
    for (old, _, _), new in zip(chunk, targets, strict=True):
        read.type(old)  # one command per line: a cluster pipeline's commands do not chain
        read.pttl(old)
        read.hgetall(old)
        read.type(new)
        read.hgetall(new)
    replies = read.execute(raise_on_error=False)  # HGETALL of a key of another type fails
    plan: dict[bytes, tuple[dict, int]] = {}  # new key -> (state, ttl) to write
    moves = []
    for i, ((old, p, user), new) in enumerate(zip(chunk, targets, strict=True)):
        kind, ttl, state, new_kind, existing = replies[5 * i : 5 * i + 5]
        if kind != b"hash" or not state:
            report.skipped += kind not in (b"hash", b"none")
            continue
        if new in plan:  # a second old state of this user in the same chunk
            report.conflicts += 1
            state = _later(plan[new][0], state)
        elif new_kind == b"hash" and existing:
            if existing == state:
                report.finished += 1  # an interrupted run copied it; the DEL is left
            else:
                report.conflicts += 1
                state = _later(existing, state)
        else:
            report.moved += 1
        plan[new] = (state, ttl)
        moves.append(old)
        changed.update({p, zlib.crc32(user) % to})
    if not moves:
        return
    write = client.pipeline(transaction=False)
    for new, (state, ttl) in plan.items():
        # DEL first: the new key then holds exactly these fields and this TTL
        write.delete(new)
        write.hset(new, mapping=state)
        if ttl > 0:
            write.pexpire(new, ttl)
    write.execute()  # every copy is in place before any old key goes
    drop = client.pipeline(transaction=False)
    for old in moves:
        drop.delete(old)
    drop.execute()


def move_states(client: Client, keys: Keys, to: int, report: ResizeReport) -> set[int]:
    """Move every state hash not at its partition under `to`; the partitions changed."""
    changed: set[int] = set()
    chunk: list[tuple[bytes, int, bytes]] = []
    for key in state_keys(client, keys):
        parsed = parse_state_key(keys, key)
        if parsed is None or parsed[0] == zlib.crc32(parsed[1]) % to:
            continue
        chunk.append((key, *parsed))
        if len(chunk) >= CHUNK:
            _move_chunk(client, keys, chunk, to, report, changed)
            chunk = []
    if chunk:
        _move_chunk(client, keys, chunk, to, report, changed)
    return changed


def bump_sequences(client: Client, keys: Keys, partitions: set[int]) -> None:
    """INCR the commit sequence of these partitions where one exists (an absent one is
    seeded by the next commit), so no worker's cache of their states stays valid."""
    for p in sorted(partitions):
        if client.exists(keys.commit_seq(p)):
            client.incr(keys.commit_seq(p))


def create_groups(client: Client, keys: Keys, group: str, to: int) -> list[int]:
    """Make sure partitions 0..to-1 have a stream and the group; those created."""
    created = []
    for p in range(to):
        start = (client.get(keys.acked(p)) or b"0").decode()
        try:
            client.xgroup_create(keys.events(p), group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            created.append(p)
    return created


# ---- the whole job --------------------------------------------------------------------------


def _refuse_if_busy(client: Client, keys: Keys, group: str, partitions: int) -> None:
    live, leased = live_workers(client, keys, partitions)
    if live or leased:
        raise ResizeRefusedError(
            f"workers are running under prefix {keys.prefix!r} ({live} announced in "
            f"{keys.workers}, leases held on partitions {leased or 'none'}): stop every "
            "worker, then run it again (a killed worker's lease lasts until lease-ms passes)"
        )
    problems = undrained(client, keys, group, partitions)
    if problems:
        raise ResizeRefusedError(
            f"the streams of group {group!r} are not drained ({'; '.join(problems)}): run the "
            "workers until the lag and pending entries are 0, stop them, then run it again"
        )


def resize(client: Client, keys: Keys, group: str, to: int) -> ResizeReport:
    """Change the partition count to `to` (see the module docstring); ResizeRefusedError
    when workers run, the streams are not drained, or no count is recorded."""
    if not 1 <= to <= MAX_PARTITIONS:
        raise ResizeRefusedError(f"--to must be between 1 and {MAX_PARTITIONS}, got {to}")
    config = client.hgetall(keys.config)
    if b"partitions" not in config:
        raise ResizeRefusedError(
            f"no partition count is recorded in {keys.config}: nothing has run under prefix "
            f"{keys.prefix!r}; start the workers with --partitions {to} instead"
        )
    old = int(config[b"partitions"])
    unfinished = int(config[b"resize_to"]) if b"resize_to" in config else None
    if old == to and unfinished is None:
        return ResizeReport(old, to)
    span = max(old, to, unfinished or 0)  # every partition that may hold streams or leases
    _refuse_if_busy(client, keys, group, span)
    client.hset(keys.config, "resize_to", to)
    # A worker that started just before resize_to was recorded is announced by now or soon:
    # look again before the first state moves.
    try:
        _refuse_if_busy(client, keys, group, span)
    except ResizeRefusedError:
        if unfinished is None:
            client.hdel(keys.config, "resize_to")
        else:
            client.hset(keys.config, "resize_to", unfinished)
        raise
    report = ResizeReport(old, to)
    changed = move_states(client, keys, to, report)
    # A run finishing an interrupted one may move nothing itself: bump every partition then.
    bump_sequences(client, keys, set(range(span)) if unfinished is not None else changed)
    report.created = create_groups(client, keys, group, to)
    client.register_script(FINISH_SCRIPT)(keys=[keys.config], args=[to])
    return report
