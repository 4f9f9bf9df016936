-- ackwise dead_letter: move an in-flight message to its queue's dead-letter store.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight   ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[3] dead       ZSET  <seq> -> dead_at (oldest first)
--   KEYS[4] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[5] dead_ids   HASH  <message id> -> "<seq> <seq> ..." (ids repeat across retries)
-- ARGV[1] receipt (in-flight member), ARGV[2] message id, ARGV[3] reason,
-- ARGV[4] replacement packed message (the envelope annotated with its history) or ""
--
-- Returns 1, or 0 for a stale receipt (nothing changed).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local seq, n = string.match(ARGV[1], '^([^#]*)#(%d+)#')
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], seq, ARGV[4]) end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], tonumber(t[1]) + tonumber(t[2]) / 1000000, seq)
redis.call('HSET', KEYS[4], seq, n .. '|' .. ARGV[3])
local others = redis.call('HGET', KEYS[5], ARGV[2])
if others then seq = others .. ' ' .. seq end
redis.call('HSET', KEYS[5], ARGV[2], seq)
return 1
