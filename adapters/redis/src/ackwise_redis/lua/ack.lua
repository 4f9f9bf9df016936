-- ackwise ack: remove messages for good, where the receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data      HASH  <seq> -> "<len(id)>:<id><body>"
-- ARGV[1..] receipts (in-flight members)
--
-- A receipt whose member is gone (the lease expired and the message was taken again, or it
-- was settled already, or earlier in this call) changes nothing and is reported by its
-- position.  Reads first, then writes: the data hash first, the one write that can still fail
-- (on a wrong-typed key) before anything is written.
-- Returns the 1-based positions of the stale receipts.
if #ARGV == 0 then return {} end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
local stale, members, seqs, seen = {}, {}, {}, {}
for i = 1, #ARGV do
  local m = ARGV[i]
  local seq = string.match(m, '^([^#]+)#')
  if scores[i] and seq and not seen[m] then
    seen[m] = true
    members[#members + 1] = m
    seqs[#seqs + 1] = seq
  else
    stale[#stale + 1] = i
  end
end
if #members > 0 then
  redis.call('HDEL', KEYS[2], unpack(seqs))
  redis.call('ZREM', KEYS[1], unpack(members))
end
return stale
