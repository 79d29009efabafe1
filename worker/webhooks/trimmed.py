"""Actions the worker trimmed from an actions stream (`--scores-maxlen`) before an endpoint's
group read them: found from the group's read counter and counted once, as lost deliveries.

Redis counts what a group read (`entries-read`) and what the stream was ever given
(`entries-added`), so `lag` = added - read = the unread entries still in the stream plus those
trimmed unread. When the group is at the stream's end (none unread) or behind its first entry
(all of it unread), the unread ones are known cheaply and the rest was lost; the script then
sets the group's read counter past them (its position unchanged), atomically, so that no
deliverer counts them twice. In between (unread entries in the stream, a trim passed earlier)
they are counted once the group reaches one of those two states."""

from __future__ import annotations

from worker.common.connection import Client
from worker.common.keys import Keys

# KEYS[1] the actions stream, ARGV[1] the group; returns the entries newly found lost
_COUNT_LOST = """
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
end
local function before(a, b)  -- entry id a < b
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local group
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  if field(g, 'name') == ARGV[1] then group = g end
end
if not group then return 0 end
local read, lag = field(group, 'entries-read'), field(group, 'lag')
if type(read) ~= 'number' or type(lag) ~= 'number' then return 0 end
local last = field(group, 'last-delivered-id')
local stream = redis.call('XINFO', 'STREAM', KEYS[1])
local length = field(stream, 'length')
local unread
if length == 0 or not before(last, field(stream, 'last-entry')[1]) then
  unread = 0
elseif before(last, field(stream, 'first-entry')[1]) then
  unread = length
else
  return 0
end
local lost = lag - unread
if lost <= 0 then return 0 end
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], last, 'ENTRIESREAD', read + lost)
return lost
"""


class TrimmedCount:
    """Counts an endpoint group's actions trimmed unread, over partitions 0..P-1."""

    def __init__(self, client: Client, keys: Keys, group: str, partitions: int) -> None:
        self.streams = [keys.actions(p) for p in range(partitions)]
        self.group = group
        self.script = client.register_script(_COUNT_LOST)

    def new_losses(self) -> dict[int, int]:
        """Partition -> the actions newly found trimmed before the group read them."""
        found = {}
        for p, stream in enumerate(self.streams):
            lost = int(self.script(keys=[stream], args=[self.group]))
            if lost > 0:
                found[p] = lost
        return found
