-- ackwise dead_letters: list the oldest dead letters of a queue.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] dead       ZSET  <seq> -> dead_at (oldest first)
--   KEYS[2] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[3] dead_info  HASH  <seq> -> "<attempt>|<reason>"
-- ARGV[1] limit
--
-- Read-only.  Returns {seq, dead_at, packed message, info, ...} oldest first, as stored (nil
-- where the data or the info is missing); the adapter reads them, whatever they hold.
local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return {} end
local dead = redis.call('ZRANGE', KEYS[1], 0, math.floor(limit) - 1, 'WITHSCORES')
local out = {}
for i = 1, #dead, 2 do
  local seq = dead[i]
  out[#out + 1] = seq
  out[#out + 1] = dead[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], seq)
  out[#out + 1] = redis.call('HGET', KEYS[3], seq)
end
return out
