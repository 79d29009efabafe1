"""How many entries of a partition's stream are not yet delivered to a consumer group: the
`intentstream_lag_entries` gauge (maintenance).

XINFO GROUPS' `lag` is the stream's entries-added minus the group's entries-read. Redis gives
nil after deletions in the undelivered range, and it can be wrong: a replica promoted after
its master crashed may hold a stale entries-read while its entries-added is right, and the
error then stays (measured: a lag of 1,200 with nothing undelivered or pending);
`XGROUP SETID ... ENTRIESREAD n` sets any value too. So `undelivered` applies one rule:

1. the stream is empty, or last-delivered-id is at or past its last entry: 0;
2. last-delivered-id is before its first entry: every entry (XLEN);
3. otherwise Redis's lag, when entries-read is known and 0 < lag < XLEN (the first entry was
   delivered, the last was not);
4. otherwise the entries after last-delivered-id, counted (XRANGE pages, up to `cap`); more
   than `cap`: unknown (None; the gauge shows NaN, which no alert rule compares as true).

Rules 1 and 2 are exact whatever Redis's counter says; rule 3 trusts a counter that is not
contradicted, so a stale entries-read can overstate the lag while a backlog remains, until
the group reaches the end of the stream (rule 1) and `REPAIR_SCRIPT` corrects the counter.
"""

from __future__ import annotations

from worker.common.connection import Client
from worker.common.entry_ids import entry_id

COUNT_CAP = 100_000  # entries counted at most when Redis's lag cannot be used
PAGE = 10_000

# KEYS: the stream. ARGV: the group. When the group's last-delivered-id is the stream's
# last-generated-id, exactly entries-added entries have been read: set the group's
# entries-read to that if it says otherwise (so XINFO GROUPS' lag, which KEDA scales on, is
# 0 again). Atomic: the check and the SETID (to the group's own last id) see one state.
REPAIR_SCRIPT = """
local function fields(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end
local stream = fields(redis.call('XINFO', 'STREAM', KEYS[1]))
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local group = fields(g)
  if group['name'] == ARGV[1] then
    local last = group['last-delivered-id']
    if last ~= stream['last-generated-id'] or group['entries-read'] == stream['entries-added'] then
      return 0
    end
    redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], last, 'ENTRIESREAD', stream['entries-added'])
    return 1
  end
end
return 0
"""


def _field(info: dict, name: str):
    """A field of an XINFO reply, whose keys are str or bytes depending on redis-py's parser."""
    return info.get(name, info.get(name.encode()))


def _id(value) -> tuple[int, int]:
    return entry_id(value if isinstance(value, bytes) else str(value).encode())


def _entry_id(entry) -> tuple[int, int] | None:
    """The id of XINFO STREAM's first-entry / last-entry (id, fields), or None."""
    if not entry or entry[0] is None:
        return None
    return _id(entry[0])


def count_after(client: Client, stream: str, after, cap: int = COUNT_CAP) -> int:
    """Entries of a stream after an id, counted by XRANGE pages (stops once past `cap`)."""
    count = 0
    start = after.decode() if isinstance(after, bytes) else str(after)
    while count <= cap:
        entries = client.xrange(stream, f"({start}", "+", count=PAGE)
        if not entries:
            break
        count += len(entries)
        start = entries[-1][0].decode()
    return count


def count_between(
    client: Client, stream: str, after: bytes, last: tuple[int, int], cap: int = COUNT_CAP
) -> int | None:
    """Entries of a stream after the id `after` up to `last`, counted by XRANGE pages;
    None past `cap`."""
    count, start, end = 0, after.decode(), f"{last[0]}-{last[1]}"
    while count <= cap:
        entries = client.xrange(stream, f"({start}", end, count=PAGE)
        if not entries:
            break
        count += len(entries)
        start = entries[-1][0].decode()
    return count if count <= cap else None


def undelivered(client: Client, stream: str, group: dict, cap: int = COUNT_CAP) -> int | None:
    """Entries of `stream` after `group`'s last-delivered-id (`group`: its XINFO GROUPS
    entry), by the rule of the module docstring; None when unknown."""
    info = client.xinfo_stream(stream)
    length = int(_field(info, "length") or 0)
    last = _id(_field(group, "last-delivered-id") or b"0-0")
    newest = _entry_id(_field(info, "last-entry"))
    if length == 0 or newest is None or last >= newest:
        return 0
    oldest = _entry_id(_field(info, "first-entry"))
    if oldest is not None and last < oldest:
        return length
    lag, read = _field(group, "lag"), _field(group, "entries-read")
    if lag is not None and read is not None and 0 < int(lag) < length:
        return int(lag)
    counted = count_after(client, stream, _field(group, "last-delivered-id"), cap)
    return counted if counted <= cap else None


def uncommitted(client: Client, stream: str, acked: tuple[int, int], group: dict) -> int:
    """Entries of `stream` delivered to `group` (its XINFO GROUPS entry) and not yet
    committed: after the partition's position `acked`, up to the group's last-delivered-id
    (at most a few batches read ahead; counted up to a page)."""
    last = _id(_field(group, "last-delivered-id") or b"0-0")
    if last <= acked:
        return 0
    end = f"{last[0]}-{last[1]}"
    return len(client.xrange(stream, f"({acked[0]}-{acked[1]}", end, count=PAGE))
