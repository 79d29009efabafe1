"""Changing the partition count: `intentstream partitions resize --to N`.

A user's partition is crc32(user_id) mod P, so a new P moves most users: their state hash
and their events not yet applied must follow them, or their next event would start from zero
on the new partition. With every worker stopped (producers may keep running), the resize
records `resize_to` in `{prefix}:config` (workers refuse to start while it is there), holds
the producers back (each partition's route key says `resizing`: the producers' function
makes them wait), moves every unacknowledged entry whose user changes partition to the end
of its new partition's stream, moves each state hash, bumps the moved partitions' commit
sequences, creates the new partitions' streams and groups, records the new count, removes
`resize_to`, and lets the producers go with the new count (they re-route what they hold).

Every step can be repeated: an entry is copied into its new stream together with a marker of
the last entry copied from its old partition, then acknowledged and deleted there; a state is
copied whole (fields and TTL) to its new key before the old key is deleted, and a run that
finds both keys equal only deletes the old one. So a run interrupted anywhere and run again
finishes the job without losing or duplicating an entry or a state.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from worker.common.connection import Client, is_cluster
from worker.common.entry_ids import entry_id
from worker.common.events import EventError, flat_fields, parse_flat_entry
from worker.common.keys import Keys, parse_state_key, partition_of
from worker.engine.compute.lean_state import as_fields, later_id
from worker.producers.append_function import RESIZING, set_routes
from worker.producers.append_function import install as install_function

STRAGGLER_SECONDS = 1.0  # the XADD pipelines of producers without the function, in flight

MAX_PARTITIONS = 4096  # the bound of the `partitions` setting
CHUNK = 500  # state keys read and written per pipeline

# KEYS: the config hash. ARGV: the new count. The last step, in one atomic call.
FINISH_SCRIPT = """
redis.call('HSET', KEYS[1], 'partitions', ARGV[1])
redis.call('HDEL', KEYS[1], 'resize_to')
return 1
"""


# KEYS: the new partition's stream and its `moved` marker hash. ARGV: the old partition,
# then per entry: its old id, its field count n, n pairs. Copies, in order, the entries not
# copied before (ids above the marker), and moves the marker: one atomic step per slot.
MOVE_IN_SCRIPT = """
local stream, marker_key = KEYS[1], KEYS[2]
local from = ARGV[1]
local function ms_seq(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms, seq
end
local function above(a, b) -- entry id a > b, compared as decimal strings (ids reach 2^64)
  if not b then return true end
  local am, as = ms_seq(a)
  local bm, bs = ms_seq(b)
  if #am ~= #bm then return #am > #bm end
  if am ~= bm then return am > bm end
  if #as ~= #bs then return #as > #bs end
  return as > bs
end
local last = redis.call('HGET', marker_key, from)
if not last then last = nil end
local copied = 0
local i = 2
while i <= #ARGV do
  local id, pairs = ARGV[i], tonumber(ARGV[i + 1])
  if above(id, last) then
    redis.call('XADD', stream, '*', unpack(ARGV, i + 2, i + 1 + 2 * pairs))
    last = id
    copied = copied + 1
  end
  i = i + 2 + 2 * pairs
end
if last then redis.call('HSET', marker_key, from, last) end
return copied
"""

# KEYS: the old partition's stream. ARGV: the group, then the ids copied away. Acknowledged
# (they may be pending) and deleted, so the old partition's group never delivers them.
MOVE_OUT_SCRIPT = """
local stream, group = KEYS[1], ARGV[1]
local has_group = false
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  for k = 1, #g, 2 do
    if g[k] == 'name' and g[k + 1] == group then has_group = true end
  end
end
for i = 2, #ARGV, 1000 do
  local j = math.min(i + 999, #ARGV)
  if has_group then redis.call('XACK', stream, group, unpack(ARGV, i, j)) end
  redis.call('XDEL', stream, unpack(ARGV, i, j))
end
return #ARGV - 1
"""

PAGE = 1000  # entries read and moved per step


class ResizeRefusedError(Exception):
    """The resize cannot run now; the message (one line) says why and what to do."""


@dataclass
class ResizeReport:
    """What a resize did."""

    old: int
    new: int
    moved: int = 0  # state hashes moved to their new partition
    entries: int = 0  # unacknowledged entries moved to their new partition's stream
    finished: int = 0  # moves an interrupted run had copied; only the old key was left
    conflicts: int = 0  # a user with a state in two partitions: the later one was kept
    skipped: int = 0  # keys where a state should be that hold another type: left in place
    created: list[int] = field(default_factory=list)  # partitions whose group was created

    def summary(self) -> str:
        created = ", ".join(map(str, self.created)) or "none"
        line = (
            f"partitions {self.old} -> {self.new}: {self.entries} unacknowledged entries and "
            f"{self.moved} user states moved"
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


# ---- moving the entries not yet applied -------------------------------------------------


def _home(fields: list[bytes], entry_ms: int, p: int, to: int) -> int:
    """The partition an entry belongs to under `to`; an unparseable entry stays at p, or
    goes to p mod `to` when p is dropped (its worker there dead-letters it)."""
    try:
        user = parse_flat_entry(fields, entry_ms, max_skew_ms=2**62)[0]
    except EventError:
        return p if p < to else p % to
    return partition_of(user, to)


def move_entries(
    client: Client, keys: Keys, group: str, span: int, to: int, report: ResizeReport
) -> None:
    """Move every unacknowledged entry of partitions 0..span-1 whose user belongs elsewhere
    under `to` to the end of its new partition's stream, keeping its fields (and its time:
    an entry without `ts` gets its old id's)."""
    move_in = client.register_script(MOVE_IN_SCRIPT)
    move_out = client.register_script(MOVE_OUT_SCRIPT)
    for p in range(span):
        stream = keys.events(p)
        if client.type(stream) != b"stream":
            continue
        acked = client.get(keys.acked(p))
        start = "(" + acked.decode() if acked else "-"  # commits acknowledge in stream order
        while True:
            page = client.xrange(stream, start, "+", count=PAGE)
            if not page:
                break
            start = "(" + page[-1][0].decode()
            by_target: dict[int, list] = {}
            for raw_id, fields in page:
                flat = flat_fields(fields)
                ms = entry_id(raw_id)[0]
                q = _home(flat, ms, p, to)
                if q == p:
                    continue
                if b"ts" not in flat[::2] and b"json" not in flat[::2]:
                    flat = [*flat, b"ts", str(ms).encode()]
                by_target.setdefault(q, []).append((raw_id, flat))
            gone = []
            for q, entries in sorted(by_target.items()):
                args: list = [p]
                for raw_id, flat in entries:
                    args += [raw_id, len(flat) // 2, *flat]
                report.entries += move_in(keys=[keys.events(q), keys.moved(q)], args=args)
                gone += [raw_id for raw_id, _ in entries]
            if gone:
                move_out(keys=[stream], args=[group, *gone])
                if client.exists(keys.losses(p)):  # moved, not lost (engine/adapters/losses.py)
                    client.hincrby(keys.losses(p), "base", len(gone))


# ---- moving the states ----------------------------------------------------------------------


def _primaries(client: Client) -> list[redis.Redis]:
    if is_cluster(client):
        return [client.get_redis_connection(n) for n in client.get_primaries()]
    return [client]


def state_keys(client: Client, keys: Keys) -> Iterator[bytes]:
    """Every key under the prefix's state namespace, SCANned on every primary."""
    for node in _primaries(client):
        yield from node.scan_iter(match=keys.state_match(), count=1000)


def _later(a: dict, b: dict) -> dict:
    """Of two states of one user, the one that applied the later entry (a on a tie)."""
    last_a, last_b = (as_fields(s).get(b"last_id", b"") for s in (a, b))  # either layout
    return b if later_id(last_b, last_a) else a


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


def _refuse_if_busy(client: Client, keys: Keys, partitions: int) -> None:
    live, leased = live_workers(client, keys, partitions)
    if live or leased:
        raise ResizeRefusedError(
            f"workers are running under prefix {keys.prefix!r} ({live} announced in "
            f"{keys.workers}, leases held on partitions {leased or 'none'}): stop every "
            "worker, then run it again (a killed worker's lease lasts until lease-ms passes)"
        )


def resize(client: Client, keys: Keys, group: str, to: int) -> ResizeReport:
    """Change the partition count to `to` (see the module docstring); ResizeRefusedError
    when workers run or no count is recorded."""
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
    _refuse_if_busy(client, keys, span)
    client.hset(keys.config, "resize_to", to)
    # A worker that started just before resize_to was recorded is announced by now or soon:
    # look again before the first state moves.
    try:
        _refuse_if_busy(client, keys, span)
    except ResizeRefusedError:
        if unfinished is None:
            client.hdel(keys.config, "resize_to")
        else:
            client.hset(keys.config, "resize_to", unfinished)
        raise
    install_function(client)  # producers that fell back to XADD take the checked path now
    set_routes(client, keys, span, RESIZING)  # producers wait from here on
    # A producer without the function (a named ACL user before the first worker) checked
    # for a resize before it sent its XADDs: those in flight land before the moves.
    time.sleep(STRAGGLER_SECONDS)
    report = ResizeReport(old, to)
    move_entries(client, keys, group, span, to, report)
    changed = move_states(client, keys, to, report)
    # A run finishing an interrupted one may move nothing itself: bump every partition then.
    bump_sequences(client, keys, set(range(span)) if unfinished is not None else changed)
    report.created = create_groups(client, keys, group, to)
    client.register_script(FINISH_SCRIPT)(keys=[keys.config], args=[to])
    set_routes(client, keys, span, to)  # waiting producers re-route what they hold
    for q in range(span):
        client.delete(keys.moved(q))
    return report
