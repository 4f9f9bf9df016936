-- ackwise ack: remove messages for good, where the receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[3] early     ZSET  "<seq>#<n>#<token>" -> when forgotten: receipts acked early
-- ARGV[1] "late", ARGV[2..] receipts; or
-- ARGV[1] "early", ARGV[2] memory (seconds), ARGV[3] k, ARGV[4..3+k] receipts whose early ack
-- the caller has had the answer of (forgotten now), ARGV[4+k..] receipts
--
-- A receipt whose member is gone (the lease expired and the message was taken again, or it
-- was settled already, or earlier in this call) changes nothing and is reported by its
-- position.  An early ack's receipt is remembered until ``memory`` seconds after its lease
-- would have ended, or until the caller says it had the answer: when a cut connection (or a
-- broker restart) swallowed the answer, the worker asks again after reconnecting and learns
-- that this very delivery was acked (its task runs) instead of "stale" (it would be lost
-- unrun).  Reads first, then writes: the data hash first, the one write that can still fail
-- (on a wrong-typed key) before anything is written.
-- Returns the 1-based positions of the stale receipts.
local mode = ARGV[1]
local first, memory, forget = 2, 0, {}
if mode == 'early' then
  memory = tonumber(ARGV[2])
  local k = tonumber(ARGV[3])
  if not memory or memory ~= memory or memory < 0 or not k or k < 0 or k % 1 ~= 0
      or 3 + k > #ARGV then
    return redis.error_reply('ERR ackwise ack: bad memory or forget count')
  end
  for i = 1, k do forget[i] = ARGV[3 + i] end
  first = 4 + k
elseif mode ~= 'late' then
  return redis.error_reply('ERR ackwise ack: bad mode')
end
local receipts = {}
for i = first, #ARGV do receipts[#receipts + 1] = ARGV[i] end
local scores, remembered = {}, {}
if #receipts > 0 then
  scores = redis.call('ZMSCORE', KEYS[1], unpack(receipts))
  if mode == 'early' then remembered = redis.call('ZMSCORE', KEYS[3], unpack(receipts)) end
end
local stale, members, seqs, zargs, seen = {}, {}, {}, {}, {}
for i = 1, #receipts do
  local m = receipts[i]
  local seq = string.match(m, '^([^#]+)#')
  if scores[i] and seq and not seen[m] then
    seen[m] = true
    members[#members + 1] = m
    seqs[#seqs + 1] = seq
    zargs[#zargs + 1] = tonumber(scores[i]) + memory
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
  if #forget > 0 then redis.call('ZREM', KEYS[3], unpack(forget)) end
  if #zargs > 0 then zadd_indexed(KEYS[3], zargs) end
end
return stale
