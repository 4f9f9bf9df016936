-- ackwise purge: delete up to ARGV[1] ready and ARGV[1] delayed messages (in-flight stay).
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] data      HASH  <seq> -> "<len(id)>:<id><body>"
-- ARGV[1] limit per call (the caller repeats while a chunk came back full, so one call never
-- blocks Redis for long)
--
-- Returns {ready deleted, delayed deleted}.
local limit = tonumber(ARGV[1])
local ready = redis.call('LPOP', KEYS[1], limit) or {}
local delayed = redis.call('ZRANGE', KEYS[2], 0, limit - 1)
if #delayed > 0 then redis.call('ZREM', KEYS[2], unpack(delayed)) end
local seqs = {}
for i = 1, #ready do seqs[#seqs + 1] = string.match(ready[i], '^[^#]*') end
for i = 1, #delayed do seqs[#seqs + 1] = string.match(delayed[i], '^[^#]*') end
if #seqs > 0 then redis.call('HDEL', KEYS[3], unpack(seqs)) end
return {#ready, #delayed}
