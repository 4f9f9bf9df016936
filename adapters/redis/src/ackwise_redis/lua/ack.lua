-- ackwise ack: remove messages for good, where the receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[3] early     ZSET  "<seq>#<n>#<token>" -> lease deadline: receipts acked early
-- ARGV[1] "early" (the ack before a task starts) or "late", ARGV[2..] receipts
--
-- A receipt whose member is gone (the lease expired and the message was taken again, or it
-- was settled already, or earlier in this call) changes nothing and is reported by its
-- position.  An early ack's receipt is remembered until its lease would have ended: when a cut
-- connection swallowed the answer, the worker asks again after reconnecting and learns that
-- this very delivery was acked (its task runs) instead of "stale" (it would be lost unrun).
-- Reads first, then writes: the data hash first, the one write that can still fail (on a
-- wrong-typed key) before anything is written.
-- Returns the 1-based positions of the stale receipts.
local mode = ARGV[1]
if mode ~= 'early' and mode ~= 'late' then
  return redis.error_reply('ERR ackwise ack: bad mode')
end
if #ARGV < 2 then return {} end
local receipts = {}
for i = 2, #ARGV do receipts[i - 1] = ARGV[i] end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(receipts))
local remembered = {}
if mode == 'early' then remembered = redis.call('ZMSCORE', KEYS[3], unpack(receipts)) end
local stale, members, seqs, zargs, seen = {}, {}, {}, {}, {}
for i = 1, #receipts do
  local m = receipts[i]
  local seq = string.match(m, '^([^#]+)#')
  if scores[i] and seq and not seen[m] then
    seen[m] = true
    members[#members + 1] = m
    seqs[#seqs + 1] = seq
    zargs[#zargs + 1] = scores[i]
    zargs[#zargs + 1] = m
  elseif not remembered[i] then
    stale[#stale + 1] = i
  end
end
if #members > 0 then
  redis.call('HDEL', KEYS[2], unpack(seqs))
  redis.call('ZREM', KEYS[1], unpack(members))
end
if mode == 'early' then
  local t = redis.call('TIME')
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(t[1]) + tonumber(t[2]) / 1000000)
  if #zargs > 0 then redis.call('ZADD', KEYS[3], unpack(zargs)) end
end
return stale
