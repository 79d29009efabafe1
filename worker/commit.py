"""The atomic, conditional commit of one partition batch (SPEC §4): its Lua script, and the
packing of a pipeline `Commit` into the script's arguments.

One script call writes the score entries, the dead letters, the XACK of every entry, and the
users' states, or, when a check fails, writes nothing and says why:

    not_owned    the partition's lease is another process's (or gone)
    not_pending  an entry is no longer pending for this consumer (claimed by another, or
                 committed by an earlier send of another commit)
    behind       an older entry of the partition is still pending (read, not committed): it
                 must be applied first, or a user's later event would make it look applied
    conflict     a commit of the partition landed since the states were read
    bad_key      a scores, dead-letter or sequence key holds data of another type

and one success besides `ok`: `applied`, when this very commit was applied by an earlier send
whose reply was lost (redis-py resends on timeouts): the caller counts it as committed.

Why it is safe to resend: every write of a partition's states goes through this script and
bumps the partition's commit sequence, so one GET checks that none of the batch's states
moved; the entries it acknowledges can be acknowledged once. All checks come before the
first write, and the writes that could fail on data come first or are guarded (a state key
of another type is replaced): a script is not rolled back when a command in it fails.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import redis

from worker.batch import DeadLetter
from worker.keys import Keys
from worker.pipeline import Commit

# Field/value pairs kept of one dead letter; values are cut to `max_value_bytes` besides.
MAX_DEAD_FIELDS = 32

COMMIT_SCRIPT = """
local events_key, scores_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local lease_key, seq_key, acked_key, last_commit_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local FIRST_STATE = 8 -- KEYS[8..] are the users' state keys

local group, consumer, holder, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local read_seq, model = ARGV[5], ARGV[6]
local scores_maxlen, dead_maxlen, ttl_ms = ARGV[7], ARGV[8], tonumber(ARGV[9])
local user_from = tonumber(ARGV[10]) + 1 -- a state key's user id starts here
local ack_ids = ARGV[11]                 -- entry ids, stream order, space-separated
-- per state key, in KEYS order
local state_h, state_last_id, state_score = ARGV[12], ARGV[13], ARGV[14]
local state_last_ts, state_n, state_event_ids = ARGV[15], ARGV[16], ARGV[17]
-- per score entry, in stream order (space-separated; type names length-prefixed)
local entry_state, type_names, entry_type = ARGV[18], ARGV[19], ARGV[20]
local entry_score, entry_ts, entry_event_id = ARGV[21], ARGV[22], ARGV[23]
local dead_letters = ARGV[24]            -- length-prefixed, see pack_dead_letters

local function words(s)
  local t = {}
  for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
  return t
end

local function length_prefixed(s)
  local t, pos = {}, 1
  while pos <= #s do
    local item
    item, pos = struct.unpack('<I4c0', s, pos)
    t[#t + 1] = item
  end
  return t
end

-- ---- checks: nothing is written above this line ----
if redis.pcall('GET', lease_key) ~= holder then return {'not_owned', ''} end

local ids = words(ack_ids)
for _, id in ipairs({ids[1], ids[#ids]}) do
  if #redis.call('XPENDING', events_key, group, id, id, 1, consumer) == 0 then
    if redis.pcall('GET', last_commit_key) == token then
      return {'applied', redis.call('GET', seq_key) or ''}
    end
    return {'not_pending', id}
  end
end
local oldest = redis.call('XPENDING', events_key, group)[2]
if oldest and oldest ~= ids[1] then return {'behind', oldest} end

local seq = redis.pcall('GET', seq_key)
if type(seq) == 'table' or (seq and not string.match(seq, '^%d+$')) then
  return {'bad_key', seq_key}
end
seq = seq or ''
if seq ~= read_seq then return {'conflict', seq} end
for _, key in ipairs({scores_key, dead_key}) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'stream' and t ~= 'none' then return {'bad_key', key} end
end

-- ---- writes ----
local types = length_prefixed(type_names)
local state_of, type_of = string.gmatch(entry_state, '%S+'), string.gmatch(entry_type, '%S+')
local score_of, ts_of = string.gmatch(entry_score, '%S+'), string.gmatch(entry_ts, '%S+')
for event_id in string.gmatch(entry_event_id, '%S+') do
  local key = KEYS[FIRST_STATE - 1 + tonumber(state_of())]
  redis.call('XADD', scores_key, 'MAXLEN', '~', scores_maxlen, '*',
             'user_id', string.sub(key, user_from), 'score', score_of(),
             'event_id', event_id, 'type', types[tonumber(type_of())], 'ts', ts_of(),
             'model', model)
end

local dead = length_prefixed(dead_letters)
local d = 1
while d <= #dead do
  local args, pairs = {}, tonumber(dead[d + 2])
  for j = 1, 2 * pairs do args[j] = dead[d + 2 + j] end
  args[#args + 1] = 'source_id'
  args[#args + 1] = dead[d]
  args[#args + 1] = 'error'
  args[#args + 1] = dead[d + 1]
  redis.call('XADD', dead_key, 'MAXLEN', '~', dead_maxlen, '*', unpack(args))
  d = d + 3 + 2 * pairs
end

for i = 1, #ids, 1000 do
  redis.call('XACK', events_key, group, unpack(ids, i, math.min(i + 999, #ids)))
end
redis.call('SET', acked_key, ids[#ids])
local previous = redis.pcall('GET', last_commit_key)
if type(previous) ~= 'string' then previous = '' end
redis.call('SET', last_commit_key, token)
if seq == '' then -- seeded from the clock: a flushed database never repeats a sequence
  local now = redis.call('TIME')
  redis.call('SET', seq_key, now[1] .. string.format('%06d', tonumber(now[2])))
end
local new_seq = redis.call('INCR', seq_key)

-- A state key of another type (an operator's SET) is an invalid state: replaced whole.
local replaced = 0
local function write_state(key, ...)
  local reply = redis.pcall('HSET', key, ...)
  if type(reply) == 'table' and reply.err then
    redis.call('DEL', key)
    redis.call('HSET', key, ...)
    replaced = replaced + 1
  end
  if ttl_ms > 0 then redis.call('PEXPIRE', key, ttl_ms) end
end
local U = #KEYS - FIRST_STATE + 1
local hsize = U > 0 and (#state_h / U) or 0
local last_id_of = string.gmatch(state_last_id, '%S+')
local user_score_of = string.gmatch(state_score, '%S+')
local last_ts_of, n_of = string.gmatch(state_last_ts, '%S+'), string.gmatch(state_n, '%S+')
local event_ids_of = string.gmatch(state_event_ids, '([^\\n]*)\\n')
for i = 1, U do
  local key, event_ids = KEYS[FIRST_STATE - 1 + i], event_ids_of()
  local h = string.sub(state_h, (i - 1) * hsize + 1, i * hsize)
  if event_ids == '' then
    write_state(key, 'h', h, 'score', user_score_of(), 'last_id', last_id_of(),
                'last_ts', last_ts_of(), 'model', model, 'n', n_of())
  else
    write_state(key, 'h', h, 'score', user_score_of(), 'last_id', last_id_of(),
                'last_ts', last_ts_of(), 'model', model, 'n', n_of(), 'event_ids', event_ids)
  end
end
return {'ok', new_seq, replaced, previous}
"""

REASONS = ("not_owned", "not_pending", "behind", "conflict", "bad_key")


class CommitRefusedError(Exception):
    """The commit applied nothing; `reason` is one of REASONS, `detail` the script's word."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class CommitResult:
    """A commit that took effect: the partition's new sequence and the state keys of
    another type it replaced (0 when the reply is `applied`: the count went with the
    lost reply)."""

    seq: bytes
    replaced: int
    resent: bool  # True when an earlier send had applied it
    previous: bytes = b""  # the token of the partition's commit before this one


@dataclass(frozen=True)
class CommitLimits:
    """Sizes the commit bounds its writes to (settings)."""

    scores_maxlen: int
    deadletter_maxlen: int
    deadletter_max_value_bytes: int
    state_ttl_ms: int


def formatted(values: np.ndarray) -> bytes:
    """Floats as space-separated decimal strings, 9 significant digits (float32 round-trips)."""
    return " ".join(map("{:.9g}".format, values.tolist())).encode()


def integers(values: Iterable[int]) -> bytes:
    """Integers as space-separated decimal strings."""
    return " ".join(map(str, values)).encode()


def length_prefixed(items: Iterable[bytes]) -> bytes:
    """Length-prefixed strings, as the script reads them with '<I4c0'."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def cut(value: bytes, limit: int) -> bytes:
    """A value cut to `limit` bytes."""
    return value if len(value) <= limit else value[:limit]


def dead_letter_items(dead: DeadLetter, max_value_bytes: int) -> list[bytes]:
    """One dead letter as the script reads it: source_id, error, pair count, pairs.

    Names and values are cut to max_value_bytes; a cut value's original length is kept
    beside it in a field `<name>:bytes`, and pairs beyond MAX_DEAD_FIELDS are dropped
    (the error says so)."""
    pairs = list(zip(dead.fields[::2], dead.fields[1::2], strict=False))
    error = dead.error
    if len(pairs) > MAX_DEAD_FIELDS:
        error += f" (only the first {MAX_DEAD_FIELDS} of {len(pairs)} fields kept)"
        pairs = pairs[:MAX_DEAD_FIELDS]
    flat: list[bytes] = []
    for name, value in pairs:
        short = cut(name, max_value_bytes)
        flat += [short, cut(value, max_value_bytes)]
        if len(value) > max_value_bytes:
            flat += [short + b":bytes", str(len(value)).encode()]
    head = [dead.source_id, cut(error.encode(), max_value_bytes)]
    return [*head, str(len(flat) // 2).encode(), *flat]


def token_of(holder: str, commit: Commit) -> bytes:
    """What the commit records as the partition's last commit: who, and up to which entry."""
    return holder.encode() + b" " + commit.ack_ids[-1]


class CommitScript:
    """Packs Commits for one worker process and runs them."""

    def __init__(
        self, client: redis.Redis, keys: Keys, group: str, consumer: str, holder: str,
        limits: CommitLimits,
    ) -> None:  # fmt: skip
        self.script = client.register_script(COMMIT_SCRIPT)
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.holder = holder
        self.limits = limits

    def token(self, commit: Commit) -> bytes:
        """The token this commit records as the partition's last commit."""
        return token_of(self.holder, commit)

    @property
    def sha(self) -> str:
        return self.script.sha

    def pack(self, c: Commit) -> tuple[list[str], list]:
        """KEYS and ARGV of the script for a Commit."""
        p, keys, lim = c.partition, self.keys, self.limits
        type_names = list(dict.fromkeys(c.score_types))
        type_pos = {t: i + 1 for i, t in enumerate(type_names)}
        dead = [x for d in c.dead for x in dead_letter_items(d, lim.deadletter_max_value_bytes)]
        key_list = [
            keys.events(p), keys.scores(p), keys.deadletter(p), keys.lease(p),
            keys.commit_seq(p), keys.acked(p), keys.last_commit(p),
            *(keys.state(p, u) for u in c.users),
        ]  # fmt: skip
        args = [
            self.group, self.consumer, self.holder, self.token(c),
            c.seq, c.model, lim.scores_maxlen, lim.deadletter_maxlen, lim.state_ttl_ms,
            len(keys.state_prefix(p).encode()),
            b" ".join(c.ack_ids),
            np.ascontiguousarray(c.h, "<f4").tobytes(),
            b" ".join(c.last_ids),
            formatted(c.user_scores),
            integers(c.last_ts.tolist()),
            integers(c.n.tolist()),
            b"".join(b" ".join(ids) + b"\n" for ids in c.event_ids),
            integers((c.score_user + 1).tolist()),
            length_prefixed(t.encode() for t in type_names),
            integers(type_pos[t] for t in c.score_types),
            formatted(c.scores),
            integers(c.score_ts.tolist()),
            b" ".join(c.score_event_ids),
            length_prefixed(dead),
        ]  # fmt: skip
        return key_list, args

    def run(self, commit: Commit) -> CommitResult:
        """Apply a Commit; CommitRefusedError when it applied nothing."""
        keys, args = self.pack(commit)
        return settle(self.script(keys=keys, args=args))


def settle(reply: list) -> CommitResult:
    """The script's reply as a CommitResult, or CommitRefusedError."""
    status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if status == "ok":
        return CommitResult(str(reply[1]).encode(), int(reply[2]), False, reply[3] or b"")
    if status == "applied":
        seq = reply[1] if isinstance(reply[1], bytes) else str(reply[1]).encode()
        return CommitResult(seq, 0, resent=True)
    detail = reply[1].decode(errors="replace") if isinstance(reply[1], bytes) else str(reply[1])
    raise CommitRefusedError(status, detail)
