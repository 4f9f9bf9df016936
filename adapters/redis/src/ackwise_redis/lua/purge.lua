-- ackwise purge: delete up to ARGV[1] ready and ARGV[1] delayed messages (in-flight stay).
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[4] urgent    ZSET  "<seq>#<n>" -> score   ready, priority > 0 (see lib.lua)
-- ARGV[1] limit per call, at most 1000 (the caller repeats while a chunk came back full, so
-- one call never blocks Redis for long)
--
-- Entries of any form go (a malformed one's seq is whatever precedes its first '#').  Reads
-- first; the data hash is the first write, the one that can still fail.
-- Returns {ready deleted (of the list and of the urgent set), delayed deleted}.
local limit = tonumber(ARGV[1])
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('ERR ackwise purge: bad limit')
end
limit = math.floor(limit)
local ready = redis.call('LRANGE', KEYS[1], 0, limit - 1)
local delayed = redis.call('ZRANGE', KEYS[2], 0, limit - 1)
local urgent = redis.call('ZRANGE', KEYS[4], 0, limit - 1)
local seqs = {}
for i = 1, #ready do seqs[#seqs + 1] = string.match(ready[i], '^[^#]*') end
for i = 1, #delayed do seqs[#seqs + 1] = string.match(delayed[i], '^[^#]*') end
for i = 1, #urgent do seqs[#seqs + 1] = string.match(urgent[i], '^[^#]*') end
if #seqs > 0 then redis.call('HDEL', KEYS[3], unpack(seqs)) end
if #ready > 0 then redis.call('LTRIM', KEYS[1], #ready, -1) end
if #delayed > 0 then redis.call('ZREM', KEYS[2], unpack(delayed)) end
if #urgent > 0 then redis.call('ZREM', KEYS[4], unpack(urgent)) end
return {#ready, #delayed, #urgent}
