-- ackwise publish_dead: store messages directly in a queue's dead-letter store.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[2] dead       ZSET  <seq> -> dead_at (oldest first)
--   KEYS[3] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[4] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[5] seq        STRING counter
-- ARGV[1] reason, then pairs (message id, packed message)
--
-- Messages of one call get dead_at one microsecond apart, so they list in call order.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = (#ARGV - 1) / 2
local last = redis.call('INCRBY', KEYS[5], n)
local prefix = string.format('%x-', ms)
for i = 1, n do
  local seq = prefix .. string.format('%x', last - n + i)
  local id = ARGV[2 * i]
  redis.call('HSET', KEYS[1], seq, ARGV[2 * i + 1])
  redis.call('ZADD', KEYS[2], now + (i - 1) / 1000000, seq)
  redis.call('HSET', KEYS[3], seq, '0|' .. ARGV[1])
  local others = redis.call('HGET', KEYS[4], id)
  if others then redis.call('HSET', KEYS[4], id, others .. ' ' .. seq)
  else redis.call('HSET', KEYS[4], id, seq) end
end
return n
