"""The producers' server-side entry point: a Redis Function library (Redis >= 7.0).

`FCALL intentstream_append_v1 2 <events of p> <route of p> <count> <events...>` appends
events to partition p's stream with ids Redis assigns (`*`), never trims, and refuses the
whole call when the producer routed with another partition count than the one in force
(the partition's route key, written by workers at start and by a resize), so a producer
learns of a resize on its next write instead of putting events where no worker reads them.

The route key holds the count in force, or `resizing` while `partitions resize` moves the
partitions (producers then wait), and is absent before the first worker ran (any count is
taken then: the first worker checks it). Each partition has its own route key, in the
partition's hash tag, so one call touches one Redis Cluster slot.

`FCALL intentstream_append_many_v1 2k <events of p1> <route of p1> ... <count> <m1> <events...>
<m2> <events...> ...` does the same for k partitions in one call, on one Redis (a cluster's
call holds one slot's keys): every route is checked before any entry is written, so the call
is refused whole or applied whole, and it answers each partition's entry ids in turn. Why: a
call per partition cost a producer's pipeline a Lua call and a reply each in Redis, and
their packing in Python, which grew with the partitions its events fall on.

Redis runs a function's commands under the caller's ACL: the producer user still needs XADD
on the event streams (docs/deploy.md, What a producer credential can still do).
"""

from __future__ import annotations

import logging

import redis

from worker.common.connection import Client
from worker.common.keys import Keys

log = logging.getLogger("intentstream.worker")

LIBRARY = "intentstream_v1"
FUNCTION = "intentstream_append_v1"
MANY = "intentstream_append_many_v1"
RESIZING = "resizing"

# ARGV: 1 the producer's partition count, then per event: its field count n, n pairs.
CODE = """#!lua name=intentstream_v1
local function refusal(route_key, routed)
  local route = redis.call('GET', route_key)
  if route == 'resizing' then
    return redis.error_reply('RESIZING the partition count is changing; retry shortly')
  end
  if route and route ~= routed then
    return redis.error_reply('STALE ' .. route .. ' partitions are in force, not ' .. routed)
  end
  return nil
end
local function append(keys, args)
  local stream, routed = keys[1], args[1]
  local refused = refusal(keys[2], routed)
  if refused then
    return refused
  end
  local ids = {}
  local i = 2
  while i <= #args do
    local pairs = tonumber(args[i])
    ids[#ids + 1] = redis.call('XADD', stream, '*', unpack(args, i + 1, i + 2 * pairs))
    i = i + 1 + 2 * pairs
  end
  return ids
end
local function append_many(keys, args)
  local routed = args[1]
  for k = 2, #keys, 2 do
    local refused = refusal(keys[k], routed)
    if refused then
      return refused
    end
  end
  local out = {}
  local i = 2
  for k = 1, #keys, 2 do
    local ids = {}
    local m = tonumber(args[i])
    i = i + 1
    for _ = 1, m do
      local pairs = tonumber(args[i])
      ids[#ids + 1] = redis.call('XADD', keys[k], '*', unpack(args, i + 1, i + 2 * pairs))
      i = i + 1 + 2 * pairs
    end
    out[#out + 1] = ids
  end
  return out
end
redis.register_function('intentstream_append_v1', append)
redis.register_function('intentstream_append_many_v1', append_many)
"""


def install(client: Client) -> bool:
    """Load (or replace) the library on every primary; False, with a warning, when this
    user may not (an admin then runs `intentstream partitions resize` or loads it) or
    Redis is older than 7.0 (no functions: producers then XADD)."""
    try:
        client.function_load(CODE, replace=True)
    except redis.ResponseError as exc:
        if not unavailable(exc) and "no permissions" not in str(exc):
            raise
        log.warning("cannot install the producers' function; producers fall back to XADD",
                    extra={"error": str(exc)})  # fmt: skip
        return False
    return True


def unavailable(exc: redis.ResponseError) -> bool:
    """The reply of a server without the function: not loaded yet, or Redis before 7.0."""
    return "Function not found" in str(exc) or "unknown command" in str(exc)


# KEYS[1] a route key, ARGV[1] the count: a worker taking a partition over records the count
# it checked, unless a resize has begun (its `resizing` must hold the producers back).
ROUTE_SCRIPT = """
local route_key, count = KEYS[1], ARGV[1]
if redis.call('GET', route_key) == 'resizing' then return 0 end
redis.call('SET', route_key, count)
return 1
"""


def set_routes(client: Client, keys: Keys, partitions: int, value: str | int) -> None:
    """Write the route key of partitions 0..partitions-1."""
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.set(keys.route(p), value)
    pipe.execute()


def call_args(keys: Keys, p: int, partitions: int, events: list[dict]) -> list:
    """The FCALL's arguments after the command name: appending `events` (field dicts) to
    partition p, routed with `partitions`."""
    args: list = [FUNCTION, 2, keys.events(p), keys.route(p), partitions]
    _add_events(args, events)
    return args


def many_args(keys: Keys, partitions: int, events: dict[int, list[dict]]) -> list:
    """The FCALL's arguments after the command name: appending each partition's `events`
    (field dicts, by partition, in that order) in one call, routed with `partitions`."""
    args: list = [MANY, 2 * len(events)]
    for p in events:
        args += (keys.events(p), keys.route(p))
    args.append(partitions)
    for mine in events.values():
        args.append(len(mine))
        _add_events(args, mine)
    return args


def _add_events(args: list, events: list[dict]) -> None:
    """Each event as its field count and its name, value pairs."""
    for fields in events:
        args.append(len(fields))
        for name, value in fields.items():
            args += (name, value)
