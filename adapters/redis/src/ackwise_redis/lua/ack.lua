-- ackwise ack: remove messages for good, where the receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data      HASH  <seq> -> "<len(id)>:<id><body>"
-- ARGV[1..] receipts (in-flight members)
--
-- A receipt whose member is gone (the lease expired and the message was taken again, or it
-- was settled already) changes nothing and is reported by its position.
-- Returns the 1-based positions of the stale receipts.
local stale, seqs = {}, {}
for i = 1, #ARGV do
  local m = ARGV[i]
  if redis.call('ZREM', KEYS[1], m) == 1 then
    seqs[#seqs + 1] = string.sub(m, 1, string.find(m, '#', 1, true) - 1)
  else
    stale[#stale + 1] = i
  end
end
if #seqs > 0 then redis.call('HDEL', KEYS[2], unpack(seqs)) end
return stale
