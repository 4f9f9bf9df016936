-- ackwise nack: return a delivery's message to its queue, now or after a delay.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] ready     LIST  "<seq>#<n>"
--   KEYS[3] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[4] notify    LIST  wake-up tokens for idle receivers
--   KEYS[5] urgent    ZSET  "<seq>#<n>" -> urgent_score   ready, priority > 0 (lib.lua)
-- ARGV[1] receipt (in-flight member), ARGV[2] delay (seconds)
--
-- Returns 1, or 0 for a stale receipt (nothing changed; a receipt ackwise did not make is
-- stale).  The delivery count is kept: the next delivery is n + 1.  Without delay the message
-- goes to the head of the queue (of priority > 0: back to its place in the urgent set).  Reads first; the destination is the first write (the one
-- that can still fail, on a wrong-typed key), the in-flight member is removed after it.
local delay = tonumber(ARGV[2])
if not delay or delay ~= delay then return redis.error_reply('ERR ackwise nack: bad delay') end
local entry = string.match(ARGV[1], '^([^#]+#%d+)#[^#]*$')
if not entry or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local wake = redis.call('LLEN', KEYS[4]) == 0
local priority = seq_priority(string.match(entry, '^[^#]*'))
if delay > 0 then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[3], tonumber(t[1]) + tonumber(t[2]) / 1000000 + delay, entry)
elseif priority > 0 then
  redis.call('ZADD', KEYS[5], urgent_score(entry, priority), entry)
else
  redis.call('LPUSH', KEYS[2], entry)
end
redis.call('ZREM', KEYS[1], ARGV[1])
if wake then redis.call('RPUSH', KEYS[4], '1') end
return 1
