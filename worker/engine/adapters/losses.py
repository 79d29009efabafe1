"""Unread entries removed before they were applied, counted exactly from Redis's stream
counters (docs/operators.md, Entries removed unread): `intentstream_events_lost_total`.

Every entry ever added to a partition's stream (XINFO STREAM's `entries-added`, A) is, at any
instant, either committed (the partition's count of entries its commits covered, K, written
by every commit: adapters/commit.py), still in the stream after the position (U), or removed
before it was applied (lost). So lost = A - K - U, with nothing to remember between ticks but
what was counted already. U is exact from the counters: 0 when the position is at or past the
stream's last entry, the stream's length when it is before its first, else the group's lag
(entries added after its last-delivered id, exact while no XDEL lies after it; counted up to
WALK_CAP when one does) plus the entries between the position and the group's last-delivered
id (delivered, in flight: a few batches, counted up to WALK_CAP); unknown otherwise (the tick
counts nothing then; the count is cumulative, so the first tick that knows U counts it all).

The first look at a partition takes what is missing then as its base (a stream from before
this count, entries trimmed long ago); whatever goes missing after is counted once, by
whichever worker holds the partition (the counted total lives in Redis, `Keys.losses`). A
total that went down (the stream deleted and recreated, a repair that moved the position
back), a count that went back (the committed count deleted), or commits that left the
count as it was (a worker of an earlier release, during a rolling upgrade), moves the base,
never the counter. The cause is `deleted` when the stream's
max-deleted-entry-id moved past the position since the last look (an XDEL of an unread
entry), else `trimmed` (XTRIM, XADD MAXLEN/MINID: entries removed from the stream's head);
both in one tick count under `deleted`.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.engine.adapters.streams import POSITION_LUA

WALK_CAP = 1_024  # entries each of its two walks counts at most (about 1 µs each)

# KEYS: the stream, acked, the last commit token, the committed count, the losses hash, the
# commit sequence.
# ARGV: the group. Returns nil (nothing to say: no stream, an impossible position, U unknown)
# or {new lost, cause, the position at the previous look, the stream's first entry id (or
# its last id when empty), the max-deleted-entry-id}.
LOSSES_SCRIPT = (
    POSITION_LUA
    + """
local stream, acked_key, token_key = KEYS[1], KEYS[2], KEYS[3]
local count_key, losses_key, seq_key = KEYS[4], KEYS[5], KEYS[6]
if redis.call('TYPE', stream)['ok'] ~= 'stream' then return nil end
local kind = redis.call('TYPE', acked_key)['ok']
if kind ~= 'string' and kind ~= 'none' then return nil end
local at = position(acked_key, token_key)
local pos = parse(at)
if not pos then return nil end
local info = {}
local flat = redis.call('XINFO', 'STREAM', stream)
for i = 1, #flat, 2 do info[flat[i]] = flat[i + 1] end
local added, length = info['entries-added'], info['length']
local first = info['first-entry'] and info['first-entry'][1]
local last = info['last-entry'] and info['last-entry'][1]
local unread
if length == 0 or cmp(pos, parse(last)) >= 0 then
  unread = 0
elseif cmp(pos, parse(first)) < 0 then
  unread = length
else
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local gi = {}
    for i = 1, #g, 2 do gi[g[i]] = g[i + 1] end
    if gi['name'] == ARGV[1] then
      local delivered = parse(gi['last-delivered-id'])
      if cmp(delivered, pos) >= 0 then
        local after
        if cmp(delivered, parse(last)) >= 0 then
          after = 0
        elseif gi['lag'] and gi['lag'] > 0 and gi['lag'] < length then
          after = gi['lag']
        else  -- an XDEL after it (Redis's lag is nil): counted, up to the cap
          local n = #redis.call('XRANGE', stream, '(' .. gi['last-delivered-id'], '+',
            'COUNT', ARGV[2] + 1)
          if n <= tonumber(ARGV[2]) then after = n end
        end
        if after then  -- the in-flight walk only when the rest is known (2 walks, each capped)
          local between = #redis.call('XRANGE', stream, '(' .. at, gi['last-delivered-id'],
            'COUNT', ARGV[2] + 1)
          if between <= tonumber(ARGV[2]) then unread = after + between end
        end
      end
    end
  end
end
if not unread then return nil end
local committed = 0
if redis.call('TYPE', count_key)['ok'] == 'string' then
  committed = tonumber(redis.call('GET', count_key)) or 0
end
local total = added - committed - unread
local seq = ''
if redis.call('TYPE', seq_key)['ok'] == 'string' then seq = redis.call('GET', seq_key) end
local maxdel = info['max-deleted-entry-id']
if redis.call('TYPE', losses_key)['ok'] ~= 'hash' then
  redis.call('DEL', losses_key)
  redis.call('HSET', losses_key, 'base', total, 'counted', 0, 'deleted', maxdel, 'at', at,
    'committed', committed, 'added', added, 'seq', seq)
  return {0, '', at, first or info['last-generated-id'], maxdel}
end
local state = {}
local sflat = redis.call('HGETALL', losses_key)
for i = 1, #sflat, 2 do state[sflat[i]] = sflat[i + 1] end
local base, counted = tonumber(state['base']) or total, tonumber(state['counted']) or 0
local before = state['at'] or at
local lost = total - base
local new = lost - counted
-- a count that went back (the committed count deleted, the stream deleted and recreated)
-- or a total that did: a new base, nothing counted
-- or commits that left the count as it was (a worker of a release before this count)
local older = state['seq'] ~= nil and state['seq'] ~= seq
  and committed == (tonumber(state['committed']) or 0)
if new < 0 or older or committed < (tonumber(state['committed']) or 0)
    or added < (tonumber(state['added']) or 0) then
  redis.call('HSET', losses_key, 'base', total - counted, 'deleted', maxdel, 'at', at,
    'committed', committed, 'added', added, 'seq', seq)
  return {0, '', before, first or info['last-generated-id'], maxdel}
end
local cause = 'trimmed'
local before_pos = parse(before) or pos
if new > 0 and state['deleted'] ~= maxdel and cmp(parse(maxdel), before_pos) > 0 then
  cause = 'deleted'
end
redis.call('HSET', losses_key, 'counted', lost, 'deleted', maxdel, 'at', at,
  'committed', committed, 'added', added, 'seq', seq)
return {new, cause, before, first or info['last-generated-id'], maxdel}
"""
)


@dataclass(frozen=True)
class Loss:
    """Entries of a partition removed before they were applied, found by one look."""

    count: int
    cause: str  # trimmed, deleted
    after: str  # the partition's position at the previous look: the lost lay after it
    first: str  # the stream's first entry id now (its last id when empty)
    max_deleted: str  # the stream's max-deleted-entry-id


class Losses:
    """Looks at each held partition's counters (the maintenance tick)."""

    def __init__(self, client: Client, keys: Keys, group: str) -> None:
        self.keys = keys
        self.group = group
        self._script = client.register_script(LOSSES_SCRIPT)

    def look(self, p: int) -> Loss | None:
        """What went missing of partition p since the last look, if anything."""
        k = self.keys
        keys = [
            k.events(p),
            k.acked(p),
            k.last_commit(p),
            k.committed(p),
            k.losses(p),
            k.commit_seq(p),
        ]
        reply = self._script(keys=keys, args=[self.group, WALK_CAP])
        if not reply or not int(reply[0]):
            return None
        count, cause, after, first, max_deleted = reply
        text = [x.decode() if isinstance(x, bytes) else str(x)
                for x in (cause, after, first, max_deleted)]  # fmt: skip
        return Loss(int(count), *text)
