"""The atomic, conditional commit of one partition batch (docs/contract.md, User state and
scores out): its Lua script, and the packing of a pipeline `Commit` into the script's arguments.

One script call writes the score entries, the actions the intent rules fired, the dead
letters, the XACK of every entry, and the users' states (their rule states with them), in the
full layout or the lean one (docs/contract.md, The lean layout), or, when a check fails,
writes nothing and says why:

    not_owned    the partition's lease is another process's (or gone)
    not_pending  an entry is no longer pending for this consumer (claimed by another, or
                 committed by an earlier send of another commit)
    behind       an older entry of the partition is still pending (read, not committed): it
                 must be applied first, or a user's later event would make it look applied
    conflict     a commit of the partition landed since the states were read
    bad_key      a scores, actions, dead-letter or sequence key holds data of another type

and one success besides `ok`: `applied`, when this very commit was applied by an earlier send
whose reply was lost (redis-py resends on timeouts): the caller counts it as committed.

Why it is safe to resend: every write of a partition's states goes through this script and
bumps the partition's commit sequence, so one GET checks that none of the batch's states
moved; the entries it acknowledges can be acknowledged once. All checks come before the
first write, and the writes that could fail on data come first or are guarded (a state key
of another type is replaced): a script is not rolled back when a command in it fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import redis

from worker.common.connection import call_packed, is_cluster
from worker.common.keys import Keys
from worker.engine.adapters.nodes import REDIRECTS
from worker.engine.adapters.resp import Joined, as_arguments, resp_args, resp_column
from worker.engine.compute.batch import DeadLetter
from worker.engine.compute.lean_state import packed_states
from worker.engine.compute.pipeline import Commit

# Field/value pairs kept of one dead letter; values are cut to `max_value_bytes` besides.
MAX_DEAD_FIELDS = 32

COMMIT_SCRIPT = """
local events_key, scores_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local lease_key, seq_key, acked_key, last_commit_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local actions_key = KEYS[8]
local FIRST_STATE = 9 -- KEYS[9..] are the users' state keys, U of them
local U = #KEYS - FIRST_STATE + 1

local group, consumer, holder, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local read_seq, model = ARGV[5], ARGV[6]
local scores_maxlen, dead_maxlen, ttl_ms = ARGV[7], ARGV[8], tonumber(ARGV[9])
local n_ack, n_scores = tonumber(ARGV[10]), tonumber(ARGV[11])
local shadow = ARGV[12]           -- the shadow model's version, '' = none
local SH = shadow ~= '' and 1 or 0
local RU = tonumber(ARGV[13])     -- 1: intent rules are set, states carry `rules`
local n_actions = tonumber(ARGV[14])
local IT = tonumber(ARGV[15])     -- 1: the model declares item inputs, states carry `items`
local LE = tonumber(ARGV[16])     -- 1: the lean layout (score, model, s; short score entries)
local n_rewrite = tonumber(ARGV[17])
-- Then runs of plain arguments (nothing to parse here), a column at a time:
local ACK = 18                    -- the batch's entry ids, stream order
local STATE = ACK + n_ack         -- U each: h, score, last_id, last_ts, n, recent, event_ids
                                  --   [, rules] [, items]; lean: score, s;
                                  --   then [, shadow_h, shadow_score [, shadow_rules]]
local STATE_COLUMNS = (LE == 1 and 2 or 7 + RU + IT) + SH * (2 + RU)
local SCORE = STATE + STATE_COLUMNS * U -- n_scores each: user_id, score, event_id[, type, ts]
                                        --   [, shadow_score]
local SCORE_COLUMNS = (LE == 1 and 3 or 5) + SH
local ACTION = SCORE + SCORE_COLUMNS * n_scores -- n_actions each: user_id, rule, score,
                                                --   event_id, ts, reasons
local REWRITE = ACTION + 6 * n_actions -- n_rewrite state rows (1..U) holding the other
                                       --   layout's fields: rewritten whole
local DEAD = REWRITE + n_rewrite -- per dead letter: pair count, source_id, error, pairs...
local first_id, last_id = ARGV[ACK], ARGV[STATE - 1]

-- ---- checks: nothing is written above this line ----
if redis.pcall('GET', lease_key) ~= holder then return {'not_owned', ''} end
for _, id in ipairs({first_id, last_id}) do
  if #redis.call('XPENDING', events_key, group, id, id, 1, consumer) == 0 then
    if redis.pcall('GET', last_commit_key) == token then
      return {'applied', redis.call('GET', seq_key) or ''}
    end
    return {'not_pending', id}
  end
end
local oldest = redis.call('XPENDING', events_key, group)[2]
if oldest and oldest ~= first_id then return {'behind', oldest} end

local seq = redis.pcall('GET', seq_key)
if type(seq) == 'table' or (seq and not string.match(seq, '^%d+$')) then
  return {'bad_key', seq_key}
end
seq = seq or ''
if seq ~= read_seq then return {'conflict', seq} end
for _, key in ipairs(n_actions > 0 and {scores_key, dead_key, actions_key}
                     or {scores_key, dead_key}) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'stream' and t ~= 'none' then return {'bad_key', key} end
end

-- ---- writes ----
-- The streams are trimmed once a commit, not at every XADD (whose MAXLEN option costs
-- about a quarter of the XADD): the same bound, seen from outside the atomic script.
local S = n_scores
for b = SCORE, SCORE + S - 1 do
  if LE == 1 and SH == 0 then
    redis.call('XADD', scores_key, '*',
               'user_id', ARGV[b], 'score', ARGV[b + S], 'event_id', ARGV[b + 2 * S],
               'model', model)
  elseif LE == 1 then
    redis.call('XADD', scores_key, '*',
               'user_id', ARGV[b], 'score', ARGV[b + S], 'event_id', ARGV[b + 2 * S],
               'model', model, 'shadow_score', ARGV[b + 3 * S], 'shadow_model', shadow)
  elseif SH == 0 then
    redis.call('XADD', scores_key, '*',
               'user_id', ARGV[b], 'score', ARGV[b + S], 'event_id', ARGV[b + 2 * S],
               'type', ARGV[b + 3 * S], 'ts', ARGV[b + 4 * S], 'model', model)
  else
    redis.call('XADD', scores_key, '*',
               'user_id', ARGV[b], 'score', ARGV[b + S], 'event_id', ARGV[b + 2 * S],
               'type', ARGV[b + 3 * S], 'ts', ARGV[b + 4 * S], 'model', model,
               'shadow_score', ARGV[b + 5 * S], 'shadow_model', shadow)
  end
end
if S > 0 then redis.call('XTRIM', scores_key, 'MAXLEN', '~', scores_maxlen) end

local A = n_actions
for a = ACTION, ACTION + A - 1 do
  redis.call('XADD', actions_key, '*',
             'user_id', ARGV[a], 'rule', ARGV[a + A], 'score', ARGV[a + 2 * A],
             'event_id', ARGV[a + 3 * A], 'ts', ARGV[a + 4 * A], 'model', model,
             'reasons', ARGV[a + 5 * A])
end
if A > 0 then redis.call('XTRIM', actions_key, 'MAXLEN', '~', scores_maxlen) end

local d = DEAD
while d <= #ARGV do
  local pairs = tonumber(ARGV[d])
  local fields = {unpack(ARGV, d + 3, d + 2 + 2 * pairs)}
  redis.call('XADD', dead_key, 'MAXLEN', '~', dead_maxlen, '*', 'source_id', ARGV[d + 1],
             'error', ARGV[d + 2], unpack(fields))
  d = d + 3 + 2 * pairs
end

for i = ACK, STATE - 1, 1000 do
  redis.call('XACK', events_key, group, unpack(ARGV, i, math.min(i + 999, STATE - 1)))
end
redis.call('SET', acked_key, last_id)
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
local rewrite = {}
for r = REWRITE, DEAD - 1 do rewrite[tonumber(ARGV[r])] = true end
for i = 1, U do
  local key, b = KEYS[FIRST_STATE - 1 + i], STATE + i - 1
  local event_ids = LE == 0 and ARGV[b + 6 * U] or ''
  if rewrite[i] then redis.call('DEL', key) end
  if LE == 1 then
    write_state(key, 'score', ARGV[b], 'model', model, 's', ARGV[b + U])
  elseif IT == 1 then -- the general case, one table of field/value pairs
    local state = {'h', ARGV[b], 'score', ARGV[b + U], 'last_id', ARGV[b + 2 * U],
                   'last_ts', ARGV[b + 3 * U], 'model', model, 'n', ARGV[b + 4 * U],
                   'recent', ARGV[b + 5 * U]}
    if event_ids ~= '' then
      state[#state + 1] = 'event_ids'
      state[#state + 1] = event_ids
    end
    if RU == 1 then
      state[#state + 1] = 'rules'
      state[#state + 1] = ARGV[b + 7 * U]
    end
    state[#state + 1] = 'items'
    state[#state + 1] = ARGV[b + (7 + RU) * U]
    write_state(key, unpack(state))
  elseif RU == 0 and event_ids == '' then
    write_state(key, 'h', ARGV[b], 'score', ARGV[b + U], 'last_id', ARGV[b + 2 * U],
                'last_ts', ARGV[b + 3 * U], 'model', model, 'n', ARGV[b + 4 * U],
                'recent', ARGV[b + 5 * U])
  elseif RU == 0 then
    write_state(key, 'h', ARGV[b], 'score', ARGV[b + U], 'last_id', ARGV[b + 2 * U],
                'last_ts', ARGV[b + 3 * U], 'model', model, 'n', ARGV[b + 4 * U],
                'recent', ARGV[b + 5 * U], 'event_ids', event_ids)
  elseif event_ids == '' then
    write_state(key, 'h', ARGV[b], 'score', ARGV[b + U], 'last_id', ARGV[b + 2 * U],
                'last_ts', ARGV[b + 3 * U], 'model', model, 'n', ARGV[b + 4 * U],
                'recent', ARGV[b + 5 * U], 'rules', ARGV[b + 7 * U])
  else
    write_state(key, 'h', ARGV[b], 'score', ARGV[b + U], 'last_id', ARGV[b + 2 * U],
                'last_ts', ARGV[b + 3 * U], 'model', model, 'n', ARGV[b + 4 * U],
                'recent', ARGV[b + 5 * U], 'event_ids', event_ids, 'rules', ARGV[b + 7 * U])
  end
  if SH == 1 then
    local c = b + (LE == 1 and 2 or 7 + RU + IT) * U
    if RU == 0 then
      redis.call('HSET', key, 'shadow_h', ARGV[c], 'shadow_score', ARGV[c + U],
                 'shadow_model', shadow)
    else
      redis.call('HSET', key, 'shadow_h', ARGV[c], 'shadow_score', ARGV[c + U],
                 'shadow_model', shadow, 'shadow_rules', ARGV[c + 2 * U])
    end
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
class PreparedCommit:
    """A commit's EVALSHA packed in two parts around its head (see CommitScript.prepare)."""

    start: bytes  # EVALSHA, sha, key count, keys
    n_start: int
    body: bytes  # the arguments after the head
    n_body: int


@dataclass(frozen=True)
class CommitLimits:
    """Sizes the commit bounds its writes to (settings)."""

    scores_maxlen: int
    deadletter_maxlen: int
    deadletter_max_value_bytes: int
    state_ttl_ms: int


def decimals(values: np.ndarray) -> list[str]:
    """Floats as decimal strings, 9 significant digits (float32 round-trips)."""
    return list(map("{:.9g}".format, values.tolist()))


def state_columns(c: Commit, score_text: list[str], lean: bool, write_items: bool) -> list:
    """The state rows' columns: h, score, last_id, last_ts, n, recent, event_ids
    (space-separated), rules (when rules are set), items (when the model declares item
    inputs); in the lean layout score and s (compute/lean_state.py) instead; then shadow_h,
    shadow_score (and shadow_rules) when a shadow model runs. The h columns are float
    arrays (one row per state), last_ts and n int64 arrays, s values end to end, the others
    lists (adapters/resp.py frames each kind). `score_text`: the scores' decimals;
    `write_items`: whether the full layout's rows carry `items` (CommitScript.writes_items)."""
    if not c.users:
        return []
    scores = [score_text[i] for i in c.last_scored.tolist()]  # each user's last score
    if lean:
        k = len(c.users)
        rules = c.rules if c.rules is not None else [b""] * k
        items = c.items if c.items is not None else [b""] * k
        packed = packed_states(c.h, c.last_ts, c.n,
                               [c.last_ids, c.event_ids, c.recent, rules, items])  # fmt: skip
        columns = [scores, Joined(*packed)]
    else:
        columns = [c.h, scores, c.last_ids, c.last_ts, c.n, c.recent, c.event_ids]
        if c.rules is not None:
            columns.append(c.rules)
        if write_items:
            columns.append(c.items)
    if c.shadow_h is not None:
        columns += [c.shadow_h, decimals(c.shadow_user_scores)]
        if c.rules is not None:
            columns.append(c.shadow_rules)
    return columns


def action_columns(c: Commit) -> list[list]:
    """The action entries' columns: user_id, rule, score, event_id, ts, reasons."""
    if not c.actions:
        return []
    a = c.actions
    return [
        [x.user_id for x in a], [x.rule for x in a],
        decimals(np.asarray([x.score for x in a], np.float32)), [x.event_id for x in a],
        [x.ts for x in a], [x.reasons for x in a],
    ]  # fmt: skip


def score_columns(c: Commit, score_text: list[str], lean: bool) -> list:
    """The score entries' columns: user_id, score, event_id, type, ts[, shadow_score]; in
    the lean layout without type and ts."""
    if not len(c.scores):
        return []
    users = [c.users[i] for i in c.score_user.tolist()]
    columns = [users, score_text, c.score_event_ids]
    if not lean:
        columns += [c.score_types, c.score_ts]
    if c.shadow_scores is not None:
        columns.append(decimals(c.shadow_scores))
    return columns


def cut(value: bytes, limit: int) -> bytes:
    """A value cut to `limit` bytes."""
    return value if len(value) <= limit else value[:limit]


def dead_letter_items(dead: DeadLetter, max_value_bytes: int) -> list[bytes]:
    """One dead letter as the script reads it: pair count, source_id, error, pairs.

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
    head = [str(len(flat) // 2).encode(), dead.source_id, cut(error.encode(), max_value_bytes)]
    return [*head, *flat]


def token_of(holder: str, commit: Commit) -> bytes:
    """What the commit records as the partition's last commit: who, and up to which entry."""
    return holder.encode() + b" " + commit.ack_ids[-1]


class CommitScript:
    """Packs Commits for one worker process and runs them."""

    def __init__(
        self, client: redis.Redis, keys: Keys, group: str, consumer: str, holder: str,
        limits: CommitLimits, layout: str = "full",
    ) -> None:  # fmt: skip
        self.client = client
        self.lean = layout == "lean"  # docs/contract.md, The lean layout
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
        """KEYS and ARGV of the script for a Commit: plain values, one argument each."""
        return self._keys(c), [
            *self._head(c),
            *(x for column in self._body(c) for x in as_arguments(column)),
        ]

    def _keys(self, c: Commit) -> list[str]:
        p, keys = c.partition, self.keys
        return [
            keys.events(p), keys.scores(p), keys.deadletter(p), keys.lease(p),
            keys.commit_seq(p), keys.acked(p), keys.last_commit(p), keys.actions(p),
            *map(keys.state_prefix(p).__add__, c.users),  # keys.state(p, u) of each user
        ]  # fmt: skip

    def _head(self, c: Commit) -> list:
        lim = self.limits
        return [
            self.group, self.consumer, self.holder, self.token(c), c.seq, c.model,
            lim.scores_maxlen, lim.deadletter_maxlen, lim.state_ttl_ms,
            len(c.ack_ids), len(c.scores), c.shadow_model, int(c.rules is not None),
            len(c.actions), int(self.writes_items(c)), int(self.lean), len(c.rewrite),
        ]  # fmt: skip

    def writes_items(self, c: Commit) -> bool:
        """Whether the full layout's states of this commit carry `items`: when the model
        declares item inputs, and when a state is rewritten whole (its memories, carried
        as read, would go with the key)."""
        return c.write_items or (not self.lean and bool(c.rewrite) and c.items is not None)

    def _body(self, c: Commit) -> list:
        """The arguments after the head, as columns: ack ids, the state columns, the score
        columns, the action columns, the state rows to rewrite whole (1-based), the dead
        letters."""
        limit = self.limits.deadletter_max_value_bytes
        dead = [x for d in c.dead for x in dead_letter_items(d, limit)]
        text = decimals(c.scores)
        rewrite = np.asarray(c.rewrite, np.int64) + 1
        return [c.ack_ids, *state_columns(c, text, self.lean, self.writes_items(c)),
                *score_columns(c, text, self.lean), *action_columns(c), rewrite,
                dead]  # fmt: skip

    def prepare(self, c: Commit) -> PreparedCommit:
        """The EVALSHA of a Commit packed but for its head (which holds the read sequence,
        known only once the commit before it replied)."""
        keys, body = self._keys(c), self._body(c)
        return PreparedCommit(
            resp_args(("EVALSHA", self.sha, len(keys))) + resp_column(keys), len(keys) + 3,
            b"".join(map(resp_column, body)), sum(map(len, body)),
        )  # fmt: skip

    def command(self, c: Commit, prepared: PreparedCommit | None = None) -> bytes:
        """The EVALSHA of a Commit as RESP bytes, from its prepared parts when given."""
        prepared = prepared or self.prepare(c)
        head = self._head(c)
        count = prepared.n_start + len(head) + prepared.n_body
        return b"*%d\r\n" % count + prepared.start + resp_args(head) + prepared.body

    def run(self, commit: Commit, node: redis.Redis | None = None) -> CommitResult:
        """Apply a Commit; CommitRefusedError when it applied nothing. The EVALSHA goes as
        `command` packs it, on a pooled connection of the one Redis, or of `node` on a
        cluster (the partition's, adapters/nodes.py); without a node, or when the node no
        longer serves the slot (the command did not run), through the cluster client, which
        packs it with redis-py and follows the redirects."""
        if not is_cluster(self.client):
            return self._packed(self.client, commit)
        if node is not None:
            try:
                return self._packed(node, commit)
            except REDIRECTS:
                pass
        keys, args = self.pack(commit)
        return settle(self.script(keys=keys, args=args))

    def _packed(self, client: redis.Redis, commit: Commit) -> CommitResult:
        """The commit sent as `command` packs it on a connection of `client`."""
        try:
            return settle(call_packed(client, self.command(commit)))
        except redis.exceptions.NoScriptError:  # Redis lost it (a restart, SCRIPT FLUSH)
            client.script_load(COMMIT_SCRIPT)
            return settle(call_packed(client, self.command(commit)))


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
