-- ackwise stats: count a queue's messages in each state, from Redis' own structures.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[4] dead      ZSET  <seq> -> dead_at
--   KEYS[5] urgent    ZSET  "<seq>#<n>" -> urgent_score   ready, priority > 0 (lib.lua)
--
-- Due delayed messages and expired leases are receivable, so they count as ready (the next
-- receive moves them).  Returns {ready, delayed, in flight, dead, now, and the head entries
-- of ready, of the due delayed, of the expired in-flight ones ("" when none) and of each
-- priority's part of the urgent set}; the
-- caller reads the oldest enqueue time from their seqs.  Read-only; entries of any form are
-- counted, and only the first 32 bytes of a head entry are returned (all a seq needs).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local urgent = redis.call('ZCARD', KEYS[5])
local ready = redis.call('LLEN', KEYS[1]) + urgent
local due = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local expired = redis.call('ZCOUNT', KEYS[3], '-inf', now)
local delayed = redis.call('ZCARD', KEYS[2]) - due
local in_flight = redis.call('ZCARD', KEYS[3]) - expired
local dead = redis.call('ZCARD', KEYS[4])
local head = redis.call('LINDEX', KEYS[1], 0) or ''
local head_due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)[1] or ''
local head_expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1)[1] or ''
local out = {ready + due + expired, delayed, in_flight, dead, string.format('%.6f', now),
             string.sub(head, 1, 32), string.sub(head_due, 1, 32), string.sub(head_expired, 1, 32)}
if urgent > 0 then  -- the urgent set orders by priority first: the oldest of each priority
  local band = 4398046511104  -- URGENT_BAND of lib.lua
  for p = 1, 9 do
    local low = (10 - p) * band
    local first = redis.call('ZRANGEBYSCORE', KEYS[5], low, '(' .. (low + band), 'LIMIT', 0, 1)
    if first[1] then out[#out + 1] = string.sub(first[1], 1, 32) end
  end
end
return out
