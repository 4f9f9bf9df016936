-- ackwise stats: count a queue's messages in each state, from Redis' own structures.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[4] dead      ZSET  <seq> -> dead_at
--
-- Due delayed messages and expired leases are receivable, so they count as ready (the next
-- receive moves them).  Returns {ready, delayed, in flight, dead, now, and the head entries
-- of ready, of the due delayed and of the expired in-flight ones ("" when none)}; the
-- caller reads the oldest enqueue time from their seqs.  Read-only; entries of any form are
-- counted, and only the first 32 bytes of a head entry are returned (all a seq needs).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ready = redis.call('LLEN', KEYS[1])
local due = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local expired = redis.call('ZCOUNT', KEYS[3], '-inf', now)
local delayed = redis.call('ZCARD', KEYS[2]) - due
local in_flight = redis.call('ZCARD', KEYS[3]) - expired
local dead = redis.call('ZCARD', KEYS[4])
local head = redis.call('LINDEX', KEYS[1], 0) or ''
local head_due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)[1] or ''
local head_expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1)[1] or ''
return {ready + due + expired, delayed, in_flight, dead, string.format('%.6f', now),
        string.sub(head, 1, 32), string.sub(head_due, 1, 32), string.sub(head_expired, 1, 32)}
