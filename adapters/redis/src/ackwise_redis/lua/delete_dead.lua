-- ackwise delete_dead: delete the named dead letters, or all of a queue's.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] dead       ZSET  <seq> -> dead_at
--   KEYS[2] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[3] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[4] data       HASH  <seq> -> "<len(id)>:<id><body>"
-- ARGV[1] "*": every dead letter; "=": the message ids in ARGV[2..] ("corrupt-<seq>" that
-- dead_ids does not know names the dead letter <seq> itself, as in requeue_dead.lua)
--
-- Reads and checks first; the first write is the one that can still fail.
-- Returns how many dead letters were deleted.
if ARGV[1] == '*' then
  local seqs = redis.call('ZRANGE', KEYS[1], 0, -1)
  chunked('HDEL', KEYS[4], seqs)  -- the first write; DEL cannot fail
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return #seqs
end
if ARGV[1] ~= '=' then return redis.error_reply('ERR ackwise delete_dead: bad mode') end
local named, dead = named_dead(KEYS[1], KEYS[3], 2)
if #dead > 0 then
  redis.call('HLEN', KEYS[2])
  redis.call('HLEN', KEYS[4])
end

if #named > 0 then chunked('HDEL', KEYS[3], named) end
if #dead > 0 then
  chunked('ZREM', KEYS[1], dead)
  chunked('HDEL', KEYS[2], dead)
  chunked('HDEL', KEYS[4], dead)
end
return #dead
