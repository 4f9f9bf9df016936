-- ackwise nack: return a delivery's message to its queue, now or after a delay.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] ready     LIST  "<seq>#<n>"
--   KEYS[3] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[4] notify    LIST  wake-up tokens for idle receivers
-- ARGV[1] receipt (in-flight member), ARGV[2] delay (seconds)
--
-- Returns 1, or 0 for a stale receipt (nothing changed).  The delivery count is kept: the
-- next delivery is n + 1.  Without delay the message goes to the head of the queue.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local entry = string.match(ARGV[1], '^(.*)#[^#]*$')
local delay = tonumber(ARGV[2])
if delay > 0 then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[3], tonumber(t[1]) + tonumber(t[2]) / 1000000 + delay, entry)
else
  redis.call('LPUSH', KEYS[2], entry)
end
if redis.call('LLEN', KEYS[4]) == 0 then redis.call('RPUSH', KEYS[4], '1') end
return 1
