"""The worker's Lua scripts: one packed read of states, one atomic conditional commit.

Why Lua: redis-py spends ~40 µs of Python per command per event; one script call per batch
with a packed payload (numpy arrays as bytes, ids joined by spaces) moves that work into
Redis, and makes the commit of a batch atomic and conditional (SPEC §4).
"""

from __future__ import annotations

# KEYS: 1 the partition's commit sequence, 2.. state keys.
# Returns the sequence (nil before the first commit), then h, last_id, last_ts, model, n for
# each state key (nil when absent).
READ_STATES = """
local out = {redis.call('GET', KEYS[1])}
for i = 2, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 'h', 'last_id', 'last_ts', 'model', 'n')
  for j = 1, 5 do out[#out + 1] = v[j] end
end
return out
"""

# Renew the partition leases this process holds and take free ones, at most ARGV[3] new.
# KEYS: lease keys. ARGV: holder token, ttl ms, how many free leases it may take.
# Returns 1 per key the holder now holds, else 0.
ACQUIRE_LEASES = """
local out, taken = {}, 0
for i = 1, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if owner == ARGV[1] or (owner == false and taken < tonumber(ARGV[3])) then
    if owner == false then taken = taken + 1 end
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

# Release leases this consumer holds. KEYS: lease keys. ARGV: consumer.
RELEASE_LEASES = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""

# The commit of one partition's batch. Applies everything or nothing.
#
# KEYS: 1 events stream, 2 scores stream, 3 dead-letter stream, 4 lease, 5 commit sequence,
#       6 acknowledged high-water mark, 7.. state keys (U).
# ARGV:
#  1 group         2 consumer       3 scores maxlen   4 state ttl ms (0 = none)
#  5 model version 6 length of the state key prefix (the user id follows it)
#  7 entry ids of the batch, in stream order, space-separated (all are acknowledged)
#  8 the commit sequence the states were read at ("" = none yet)
#  9 new last_id per state key, space-separated
# 10 h per state key: U blocks of equal size (little-endian float32)
# 11 per state key: '<fdd' (score, last_ts ms, n)
# 12 per score entry: '<iifd' (state key index 1..U, type index 1..T, score, ts ms)
# 13 event id per score entry, space-separated
# 14 type names: length-prefixed strings ('<I4' then bytes)
# 15 dead letters: length-prefixed strings: source_id, error, pair count, field, value, ...
# 16 the lease holder token of this worker process
# 17 score per score entry, formatted, space-separated (formatting in Lua costs ~1 µs each)
# 18 score per state key, formatted, space-separated
#
# Returns {'ok', n_scores, new sequence} or, having applied nothing,
#   {'not_owned', ''}        the lease is another process's (or gone),
#   {'not_pending', id}      an entry is no longer pending for this consumer (already
#                            committed by an earlier send of this very call, or claimed),
#   {'behind', id}           an older entry of the partition is still pending (read but not
#                            committed): it must be applied first, or a user's later event
#                            would make it look applied (the last_id rule),
#   {'conflict', seq}        a commit of this partition landed since the states were read,
#   {'bad_key', key}         a scores or dead-letter key holds another type.
#
# Every write to a partition's states goes through this script and bumps the partition's
# commit sequence, so one GET checks that none of the batch's states moved. The sequence
# starts from the server's clock, so a flushed database never hands out an old value again.
# All checks come before the first write, and the writes that could fail on data (XADD)
# come before the state writes: a script is not rolled back when a command in it fails.
COMMIT = """
local group, consumer = ARGV[1], ARGV[2]
if redis.call('GET', KEYS[4]) ~= ARGV[16] then
  return {'not_owned', ''}
end

-- The batch's first and last entries must still be pending for us. Checking every id
-- costs a table of four values per entry; the ends suffice, because under a held lease
-- nobody else claims our entries, and an earlier send of this call acknowledged them all.
local ids = {}
for id in string.gmatch(ARGV[7], '%S+') do ids[#ids + 1] = id end
for _, id in ipairs({ids[1], ids[#ids]}) do
  if #redis.call('XPENDING', KEYS[1], group, id, id, 1, consumer) == 0 then
    return {'not_pending', id}
  end
end
local oldest = redis.call('XPENDING', KEYS[1], group)[2]
if oldest and oldest ~= ids[1] then return {'behind', oldest} end

local seq = redis.call('GET', KEYS[5]) or ''
if seq ~= ARGV[8] then return {'conflict', seq} end
for k = 2, 3 do
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'stream' and t ~= 'none' then return {'bad_key', KEYS[k]} end
end

local U = #KEYS - 6
local model, ttl = ARGV[5], tonumber(ARGV[4])
local types, pos = {}, 1
while pos <= #ARGV[14] do
  local name
  name, pos = struct.unpack('<I4c0', ARGV[14], pos)
  types[#types + 1] = name
end

local plen, maxlen = tonumber(ARGV[6]), ARGV[3]
local n_scores = 0
local next_score = string.gmatch(ARGV[17], '%S+')
for event_id in string.gmatch(ARGV[13], '%S+') do
  local u, t, _, ts = struct.unpack('<iifd', ARGV[12], n_scores * 20 + 1)
  n_scores = n_scores + 1
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*',
             'user_id', string.sub(KEYS[6 + u], plen + 1),
             'score', next_score(), 'event_id', event_id,
             'type', types[t], 'ts', string.format('%d', ts), 'model', model)
end

pos = 1
while pos <= #ARGV[15] do
  local source_id, err, pairs
  source_id, err, pairs, pos = struct.unpack('<I4c0I4c0I4', ARGV[15], pos)
  local args = {}
  for j = 1, pairs * 2 do
    args[j], pos = struct.unpack('<I4c0', ARGV[15], pos)
  end
  args[#args + 1] = 'source_id'
  args[#args + 1] = source_id
  args[#args + 1] = 'error'
  args[#args + 1] = err
  redis.call('XADD', KEYS[3], '*', unpack(args))
end

for i = 1, #ids, 1000 do
  redis.call('XACK', KEYS[1], group, unpack(ids, i, math.min(i + 999, #ids)))
end
if #ids > 0 then redis.call('SET', KEYS[6], ids[#ids]) end

if seq == '' then
  local now = redis.call('TIME')
  redis.call('SET', KEYS[5], now[1] .. string.format('%06d', tonumber(now[2])))
end
local new_seq = redis.call('INCR', KEYS[5])
local last_ids = {}
for v in string.gmatch(ARGV[9], '%S+') do last_ids[#last_ids + 1] = v end
local hsize = U > 0 and (#ARGV[10] / U) or 0
local next_user_score = string.gmatch(ARGV[18], '%S+')
for i = 1, U do
  local _, last_ts, n = struct.unpack('<fdd', ARGV[11], (i - 1) * 20 + 1)
  local key = KEYS[6 + i]
  redis.call('HSET', key, 'h', string.sub(ARGV[10], (i - 1) * hsize + 1, i * hsize),
             'score', next_user_score(), 'last_id', last_ids[i],
             'last_ts', string.format('%d', last_ts), 'model', model,
             'n', string.format('%d', n))
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end
return {'ok', n_scores, new_seq}
"""
