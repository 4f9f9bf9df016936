-- ackwise dead_letter: move an in-flight message to its queue's dead-letter store.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight   ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[3] dead       ZSET  <seq> -> dead_at (oldest first)
--   KEYS[4] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[5] dead_ids   HASH  <message id> -> "<seq> <seq> ..." (ids repeat across retries)
-- ARGV[1] receipt (in-flight member), ARGV[2] message id, ARGV[3] reason,
-- ARGV[4] replacement packed message (the envelope annotated with its history, or a corrupt
-- record framed under its stand-in id) or "" (keep the data as it is)
--
-- Returns 1, or 0 for a stale receipt (nothing changed).  Reads (and so every key's type)
-- first; the dead-letter index is the first write, the only one that can still fail.
local receipt, id, reason, replacement = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not (id and reason and replacement) then
  return redis.error_reply('ERR ackwise dead_letter: bad arguments')
end
local seq, n = string.match(receipt, '^([^#]+)#(%d+)#')
if not seq or not redis.call('ZSCORE', KEYS[1], receipt) then return 0 end
local others = redis.call('HGET', KEYS[5], id)
redis.call('HEXISTS', KEYS[4], seq)
if replacement ~= '' then redis.call('HEXISTS', KEYS[2], seq) end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[3], tonumber(t[1]) + tonumber(t[2]) / 1000000, seq)
redis.call('HSET', KEYS[4], seq, n .. '|' .. reason)
if replacement ~= '' then redis.call('HSET', KEYS[2], seq, replacement) end
if others then redis.call('HSET', KEYS[5], id, others .. ' ' .. seq)
else redis.call('HSET', KEYS[5], id, seq) end
redis.call('ZREM', KEYS[1], receipt)
return 1
