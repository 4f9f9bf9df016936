-- ackwise requeue_dead: move dead letters back to ready as new messages (count reset).
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] dead       ZSET  <seq> -> dead_at
--   KEYS[2] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[3] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[4] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[5] ready      LIST  "<seq>#<n>"
--   KEYS[6] seq        STRING counter (see publish.lua)
--   KEYS[7] notify     LIST  wake-up tokens for idle receivers
--   KEYS[8] urgent     ZSET  "<seq>#<n>" -> urgent_score   ready, priority > 0 (lib.lua)
-- ARGV[1..] message ids; "corrupt-<seq>" that dead_ids does not know names the dead letter
-- <seq> itself (the stand-in id under which a record without a readable id is listed)
--
-- Atomic: each dead letter leaves the store and enters the queue in the same step, under a
-- new seq (fresh enqueue time, delivery count 0, the same priority), so a replay run twice
-- replays it once.  A
-- dead letter without data leaves the store and is not counted.  Reads and checks first; the
-- first write (dead_ids) is the one that can still fail.
-- Returns how many messages moved.
local named, dead = named_dead(KEYS[1], KEYS[3], 1)
local bodies = chunked('HMGET', KEYS[4], dead)
redis.call('HLEN', KEYS[2])
local moved = 0
for i = 1, #dead do if bodies[i] then moved = moved + 1 end end
local last, wake = 0, false
if moved > 0 then
  last = seq_counter(KEYS[6])
  if not last then return redis.error_reply(CORRUPT_COUNTER) end
  redis.call('LLEN', KEYS[5])
  redis.call('ZCARD', KEYS[8])
  wake = redis.call('LLEN', KEYS[7]) == 0
end
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = string.format('%x-', ms)
local fields, entries = {}, {}
for i = 1, #dead do
  if bodies[i] then
    local p = seq_priority(dead[i])
    local new = prefix .. string.format('%x', last + #entries + 1) .. (p > 0 and '!' .. p or '')
    fields[#fields + 1] = new
    fields[#fields + 1] = bodies[i]
    entries[#entries + 1] = new .. '#0'
  end
end

if #named > 0 then chunked('HDEL', KEYS[3], named) end
if #dead > 0 then
  chunked('ZREM', KEYS[1], dead)
  chunked('HDEL', KEYS[2], dead)
  chunked('HDEL', KEYS[4], dead)
end
if moved > 0 then
  chunked('HSET', KEYS[4], fields)
  for i = 1, #entries, 1000 do
    make_ready(KEYS[5], KEYS[8], 'RPUSH', {unpack(entries, i, math.min(i + 999, #entries))})
  end
  redis.call('SET', KEYS[6], string.format('%d', last + moved))
  if wake then redis.call('RPUSH', KEYS[7], '1') end
end
return moved
