"""Reading the partition streams: XREADGROUP ... NOACK from where the partition's last commit
left off, and group creation.

A partition's position is its last commit's last entry (`{prefix}:acked:{p}`, written by the
commit itself, adapters/commit.py): the group's pending-entries list is not used (NOACK), so
reading costs Redis no pending entry to add and no XACK to remove it (about 1 µs per event of
the ~1.5 that XREADGROUP and XACK cost together). Whenever what this worker read may not have
been committed (it took the partition over, a commit applied nothing, a Redis outage), the
partition's next read first seeks: the group's last-delivered id is set back to `acked`
(SEEK_SCRIPT), so everything after the last commit is delivered again, in order. Every batch
knows the entry it follows (`Batch.after`), and its commit applies only if that is still the
partition's last commit and no entry lies between the two.

On one Redis a round is one XREADGROUP over every held partition, blocking while all are
idle. On a Redis Cluster the partitions' streams live in different slots, so a round is one
XREADGROUP per partition, each node's packed in one write on its connection (as the
read-ahead sends them; the cluster pipeline for a node not connected yet or that redirects),
sent to all nodes before any reply is read; those reads never block (a blocked read would hold up
the other partitions on its node): a partition they find idle waits in a blocking read of
its own (adapters/parked.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import hiredis
import redis

from worker.common.connection import Client, is_cluster, raw_replies, read_replies
from worker.common.events import DEFAULT_MAX_TS_SKEW_MS
from worker.engine.adapters.commit_token import position_of
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.adapters.states import PartitionDataError
from worker.engine.compute.batch import Batch, parse_batch
from worker.producers.append_function import ROUTE_SCRIPT

log = logging.getLogger("intentstream.worker")


# KEYS: the partition's stream, its `acked` key, its last commit token. ARGV: the group, the
# walk cap. Sets the group's last-delivered id back to the partition's last commit (`acked`;
# the entry its last commit token records when `acked` was deleted; the stream's start before
# the first commit), so that whatever was delivered and not committed is delivered again, and
# its entries-read with it, so that XINFO GROUPS' lag, which KEDA scales on, stays exact. A
# group behind the last commit (an operator's SETID) is moved up to it. Returns the position.
#
# The cost stays a few milliseconds at any distance: entries-read moves by the entries
# between the group and the position, counted only up to the walk cap (SEEK_WALK_CAP, the
# reads a worker has in flight: about 1 µs each); past it, it comes from the stream's
# counters: entries-added when the position is at or past the last entry, entries-added minus
# the length when it is before the first; inside the stream, entries-added minus the entries
# after the position when they are within a quarter of the cap and no XDEL lies after it
# (max-deleted-entry-id), else the removed entries (entries-added minus the length) plus the
# entries up to the position when those are within a quarter of the cap and no XDEL lies
# inside the stream. Otherwise (farther from the group and from both ends, or an XDEL
# between) it is left unknown: Redis counts it again once the group reaches the end;
# adapters/lag.py counts the lag meanwhile. At most 1.5 caps walked.
#
# An impossible position is refused with an error `BADPOSITION <reason> <detail>`, reason one
# of POSITION_REASONS: `acked` of another type (`wrong_type`), not an entry id
# (`unparsable`), or past the stream's last id (`ahead`: the stream holds entries, all at or
# below it, or it holds none and the position is later than the server's clock), so that
# nothing after it would ever be delivered.
# Lua shared by the scripts that read a partition's position (the seek's here, the losses'
# check in adapters/losses.py): entry ids as (ms, seq) digit strings compared without floating
# point, and the position itself: `acked`, else the entry the last commit token records (a
# deleted `acked`), else the stream's start.
POSITION_LUA = """
local function digits(d) d = string.gsub(d, '^0+', '') if d == '' then return '0' end return d end
local function cmp_num(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if not ms then return nil end
  ms, seq = digits(ms), digits(seq)
  local max = '18446744073709551615'
  if cmp_num(ms, max) > 0 or cmp_num(seq, max) > 0 then return nil end
  return {ms, seq}
end
local function cmp(a, b)
  local c = cmp_num(a[1], b[1])
  if c ~= 0 then return c end
  return cmp_num(a[2], b[2])
end
local function position(acked_key, token_key)
  local at = redis.call('GET', acked_key)
  if not at then
    if redis.call('TYPE', token_key)['ok'] == 'string' then
      at = string.match(redis.call('GET', token_key), ' (%d+%-%d+)$')
    end
    at = at or '0-0'
  end
  return at
end
"""

SEEK_SCRIPT = (
    POSITION_LUA
    + """
local stream, acked_key, token_key, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
if redis.call('TYPE', stream)['ok'] == 'none' then
  return redis.error_reply('NOGROUP no stream ' .. stream)
end
local kind = redis.call('TYPE', acked_key)['ok']
if kind ~= 'string' and kind ~= 'none' then
  return redis.error_reply('BADPOSITION wrong_type ' .. acked_key .. ' holds a ' .. kind)
end
local at = position(acked_key, token_key)
local pos = parse(at)
if not pos then
  return redis.error_reply('BADPOSITION unparsable ' .. acked_key .. ' holds ' ..
    string.sub(at, 1, 64))
end
local info = {}
local flat = redis.call('XINFO', 'STREAM', stream)
for i = 1, #flat, 2 do info[flat[i]] = flat[i + 1] end
local newest = parse(info['last-generated-id'])
if cmp(pos, newest) > 0 then
  local now = redis.call('TIME')
  local now_ms = digits(now[1] .. string.format('%03d', math.floor(now[2] / 1000)))
  if info['entries-added'] > 0 or cmp_num(pos[1], now_ms) > 0 then
    return redis.error_reply('BADPOSITION ahead ' .. acked_key .. ' is ' .. at ..
      ', past the last id of ' .. stream .. ', ' .. info['last-generated-id'])
  end
end
local cap = tonumber(ARGV[2])
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local gi = {}
  for i = 1, #g, 2 do gi[g[i]] = g[i + 1] end
  if gi['name'] == group then
    local last, read = gi['last-delivered-id'], gi['entries-read']
    if last == at then return at end
    local er
    if cmp(pos, parse(last)) < 0 then  -- the group past the position: back by the entries between
      local n = #redis.call('XRANGE', stream, '(' .. at, last, 'COUNT', cap + 1)
      if read and n <= cap and read >= n then er = read - n end
    else  -- the group behind it: forward by the entries between
      local n = #redis.call('XRANGE', stream, '(' .. last, at, 'COUNT', cap + 1)
      if read and n <= cap then er = read + n end
    end
    if not er then  -- far: from the stream's counters, where they tell
      local first = info['first-entry'] and info['first-entry'][1]
      local newest_entry = info['last-entry'] and info['last-entry'][1]
      if info['length'] == 0 or cmp(pos, parse(newest_entry)) >= 0 then
        er = info['entries-added']
      elseif cmp(pos, parse(first)) < 0 then
        er = info['entries-added'] - info['length']
      else  -- inside the stream: from an end within a quarter of the cap, no XDEL between
        local near = math.floor(cap / 4)
        local deleted = parse(info['max-deleted-entry-id']) or {'0', '0'}
        -- (a group at the end walked back past the cap already: the end is farther still)
        local walked = cmp(parse(last), newest) >= 0 and cmp(pos, parse(last)) < 0
        if not walked and cmp(deleted, pos) <= 0 then  -- all added after it still there
          local n = #redis.call('XRANGE', stream, '(' .. at, '+', 'COUNT', near + 1)
          if n <= near then er = info['entries-added'] - n end
        end
        if not er and cmp(deleted, parse(first)) < 0 then  -- all removed lie before the first
          local n = #redis.call('XRANGE', stream, '-', at, 'COUNT', near + 1)
          if n <= near then er = info['entries-added'] - info['length'] + n end
        end
      end
    end
    if er then
      redis.call('XGROUP', 'SETID', stream, group, at, 'ENTRIESREAD', er)
    else
      redis.call('XGROUP', 'SETID', stream, group, at)
    end
    return at
  end
end
return redis.error_reply('NOGROUP ' .. group .. ' of ' .. stream)
"""
)

# Entries a seek counts at most inside Redis (about 1 µs each): a worker's reads in flight
# (two batches of the default 1024) fit.
SEEK_WALK_CAP = 2048

# Why a seek refused the partition's position (SEEK_SCRIPT): `intentstream_partition_stopped`.
POSITION_REASONS = ("wrong_type", "unparsable", "ahead")


class PositionError(PartitionDataError):
    """The partition's position (`acked`) is impossible: the partition stops (only it) until
    `intentstream partitions repair P` or an operator puts it back."""

    def __init__(self, partition: int, reason: str, detail: str) -> None:
        super().__init__(partition, f"position {reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Cursor:
    """Where the next read of a partition resumes: after the entry `after`, the last one this
    worker read of it (None: not known; the read first seeks to the last commit)."""

    partition: int
    after: bytes | None = None

    @property
    def seeking(self) -> bool:
        """The next read first moves the group back to the partition's last commit."""
        return self.after is None

    def rewind(self) -> None:
        """Resume after the partition's last commit, whatever was read since."""
        self.after = None


class StreamReader:
    """Reads the partition streams for one consumer of the workers' group."""

    def __init__(
        self, client: Client, keys, group: str, consumer: str, partitions: int,
        max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS, nodes: PartitionNodes | None = None,
    ) -> None:  # fmt: skip
        self.r = client
        self.nodes = nodes  # on a cluster, who holds each partition
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.partitions = partitions  # the count in force: an entry of another is misrouted
        self.max_skew_ms = max_skew_ms  # the timestamp rule's allowance (worker/common/events.py)
        # the fields the running models declare as inputs (set as models swap: engine/models.py)
        self.input_names: tuple[str, ...] = ()
        self.cluster = is_cluster(client)
        self._seek = client.register_script(SEEK_SCRIPT)
        self._route = client.register_script(ROUTE_SCRIPT)
        # A round's reads name every partition held; their names, and a read's command for a
        # set of partitions, are the same round after round: made once, not once a round (at
        # 32 partitions their making and the reply's parse had cost ~30 µs of every round)
        self._names: dict[int, str] = {}
        self._packed: dict[tuple[tuple[int, ...], int, int | None], bytes] = {}
        self._raw()

    def _raw(self) -> None:
        # Raw replies: redis-py's XREADGROUP parser builds a dict per entry (~2 µs), which
        # parse_flat_entry does without.
        raw_replies(self.r, "XREADGROUP")

    def read_command(self, cursors: list[Cursor], count: int, block_ms: int | None) -> tuple:
        """The XREADGROUP of new entries (NOACK) of these partitions, blocking when asked."""
        names = [self._events_key(c.partition) for c in cursors]
        block = () if block_ms is None else ("BLOCK", block_ms)
        return ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count, *block,
                "NOACK", "STREAMS", *names, *([">"] * len(cursors)))  # fmt: skip

    def packed_read(self, cursors: list[Cursor], count: int, block_ms: int | None) -> bytes:
        """`read_command` packed as RESP (made once for these partitions, count and block)."""
        key = (tuple(c.partition for c in cursors), count, block_ms)
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) >= 256:  # partitions come and go: never grows without bound
                self._packed.clear()
            packed = self._packed[key] = hiredis.pack_command(
                self.read_command(cursors, count, block_ms)
            )
        return packed

    def _events_key(self, p: int) -> str:
        """Partition p's stream key (Keys.events), named once."""
        name = self._names.get(p)
        if name is None:
            name = self._names[p] = self.keys.events(p)
        return name

    def read_groups(self, cursors: list[Cursor]) -> list[list[Cursor]]:
        """The cursors one XREADGROUP each may read together: all of them on one Redis, one
        partition each on a cluster (a command's keys must share a slot)."""
        if not cursors:
            return []
        return [[c] for c in cursors] if self.cluster else [list(cursors)]

    def read(self, cursors: list[Cursor], count: int, block_ms: int | None) -> list[Batch]:
        """One read over the partitions: a Batch per partition that returned entries (a
        partition seeking first seeks; block_ms None: no blocking)."""
        sought = [self.seek(c) for c in cursors if c.seeking]
        if self.cluster:
            return self._read_per_partition(cursors, count)
        if sought or block_ms is None:
            return self.batches(self.r.execute_command(*self.read_command(cursors, count, None)),
                                cursors)  # fmt: skip
        return self.batches(self._woken(cursors, count, block_ms), cursors, count)

    def _woken(self, cursors: list[Cursor], count: int, block_ms: int) -> dict:
        """A blocking read with a plain read of the same streams behind it, in one send on one
        connection; the entries of both, by stream, in order.

        Why: Redis answers a blocked XREADGROUP at a producer's first XADD, with that entry
        alone; a producer's pipeline of XADDs on the other partitions runs before Redis turns
        to this connection again, so the read behind it brings them in the same round trip
        (read after the answer, it cost a round trip a round at low traffic)."""
        pool = self.r.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([  # one bytes: a list's items are a system call each
                self.packed_read(cursors, count, block_ms) + self.packed_read(cursors, count, None)
            ])  # fmt: skip
            replies = read_replies(conn, 2)
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            pool.release(conn)
        by_stream: dict = {}
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply  # both replies read: the connection stays usable
            for name, entries in reply.items() if isinstance(reply, dict) else reply or []:
                by_stream.setdefault(name, []).extend(entries)
        return by_stream

    def seek(self, cursor: Cursor) -> bytes:
        """Move the partition's group back to its last commit (SEEK_SCRIPT), so its next read
        delivers everything after it; the position. PositionError when it is impossible."""
        p = cursor.partition
        keys = [self.keys.events(p), self.keys.acked(p), self.keys.last_commit(p)]
        try:
            cursor.after = self._seek(keys=keys, args=[self.group, SEEK_WALK_CAP])
        except redis.ResponseError as exc:
            text = str(exc)
            at = text.find("BADPOSITION ")
            if at < 0:
                raise
            reason, _, detail = text[at + len("BADPOSITION ") :].partition(" ")
            detail = detail.split(" script:")[0]  # Redis appends the script's name
            raise PositionError(p, reason, detail) from None
        return cursor.after

    def _read_per_partition(self, cursors: list[Cursor], count: int) -> list[Batch]:
        """A cluster round's reads: each node's in one packed write on its connection (with
        `nodes`), every node's sent before any reply is read; the partitions of a node not
        connected yet, or that answered a redirect, through the cluster pipeline."""
        self._raw()  # nodes may have changed since the last round
        groups = self.read_groups(cursors)
        replies: dict[int, object] = {}
        rest = self._read_on_nodes(groups, count, replies) if self.nodes else range(len(groups))
        if rest:
            pipe = self.r.pipeline(transaction=False)
            for i in rest:
                pipe.execute_command(*self.read_command(groups[i], count, None))
            replies.update(zip(rest, pipe.execute(), strict=True))
        batches = []
        for i, group in enumerate(groups):
            batches += self.batches(replies[i], group)
        return batches

    def _read_on_nodes(self, groups: list[list[Cursor]], count: int, replies: dict) -> list[int]:
        """Read `groups` on their nodes' connections into `replies` (by group index); the
        indices left to the cluster client. A redirect means the read did not run."""
        assert self.nodes is not None
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        rest: list[int] = []
        for i, group in enumerate(groups):
            client = self.nodes.node_client(group[0].partition)
            if client is None:
                rest.append(i)
            else:
                by_node.setdefault(id(client), (client, []))[1].append(i)
        sent = []
        try:
            for client, idx in by_node.values():
                conn = client.connection_pool.get_connection()
                sent.append((client, conn))
                reads = (self.packed_read(groups[i], count, None) for i in idx)
                conn.send_packed_command([b"".join(reads)])
            for (_, conn), (_, idx) in zip(sent, by_node.values(), strict=True):
                for i in idx:
                    try:
                        replies[i] = conn.read_response()
                    except REDIRECTS:
                        rest.append(i)
        except BaseException:
            for _, conn in sent:
                conn.disconnect()  # replies may still be in flight on it
            raise
        finally:
            for client, conn in sent:
                client.connection_pool.release(conn)
        return rest

    def batches(self, reply, cursors: list[Cursor], size: int | None = None) -> list[Batch]:
        """Parse an XREADGROUP reply into Batches of at most `size` entries (one per
        partition that has entries when None), each knowing the entry it follows, and move
        the cursors past what it returned."""
        if not reply:  # nothing new (nil): the most frequent reply of a read at low traffic
            return []
        # RESP3 (redis-py 8's default) answers a map, RESP2 a list of [stream, entries]
        pairs = reply.items() if isinstance(reply, dict) else reply
        by_stream = {name.decode(): entries for name, entries in pairs}
        out = []
        for c in cursors:
            entries = by_stream.get(self._events_key(c.partition), [])
            step = size or len(entries) or 1
            for i in range(0, len(entries), step):
                batch = parse_batch(c.partition, entries[i : i + step], self.partitions,
                                    self.max_skew_ms, self.input_names)  # fmt: skip
                batch.after, c.after = c.after or b"0-0", batch.ids[-1]
                out.append(batch)
        return out

    def route(self, p: int) -> None:
        """Write the partition's route key (the count producers route by), unless a resize
        marked it (producers/append_function.py, ROUTE_SCRIPT)."""
        self._route(keys=[self.keys.route(p)], args=[self.partitions])

    def not_streams(self, parts: list[int]) -> dict[int, str]:
        """The partitions whose events key holds another type than a stream: that type."""
        kinds = {p: self.r.type(self.keys.events(p)) for p in parts}
        return {p: kind.decode() for p, kind in kinds.items() if kind not in (b"stream", b"none")}

    def ensure_group(self, p: int) -> bool:
        """Create the group if missing; True if it was created. It starts after the last
        acknowledged entry when Redis still records one (a deleted group), else from the
        start, so entries published before the first worker are scored too."""
        try:
            acked = self.r.get(self.keys.acked(p))
            token = self.r.get(self.keys.last_commit(p))
        except redis.ResponseError:  # a key of another type: the seek stops the partition
            acked = token = None
        start = (position_of(acked, token) or b"0").decode()
        try:
            self.r.xgroup_create(self.keys.events(p), self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        log.info("created consumer group", extra={"partition": p, "group": self.group,
                                                  "from": start})  # fmt: skip
        return True
