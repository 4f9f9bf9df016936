-- ackwise extend: move the lease deadline of deliveries whose receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[2] early     ZSET  "<seq>#<n>#<token>" -> when forgotten: receipts acked early
-- ARGV[1] lease (seconds from now, server clock), ARGV[2..] receipts (in-flight members)
--
-- A receipt acked early (see ack.lua) is not stale: its memory is kept at least as long as the
-- worker holds the delivery, which it does while it asks again for an ack whose answer it
-- lost (GT: a renewal never shortens it).
-- Writes after every check.
-- Returns the 1-based positions (among the receipts) of the stale ones; they change nothing.
local lease = tonumber(ARGV[1])
if not lease or lease ~= lease then return redis.error_reply('ERR ackwise extend: bad lease') end
if #ARGV < 2 then return {} end
local t = redis.call('TIME')
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease
local members = {}
for i = 2, #ARGV do members[i - 1] = ARGV[i] end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(members))
local missing = {}
for i = 1, #members do
  if not scores[i] then missing[#missing + 1] = i end
end
local remembered = {}
if #missing > 0 then
  local names = {}
  for j = 1, #missing do names[j] = members[missing[j]] end
  local found = redis.call('ZMSCORE', KEYS[2], unpack(names))
  for j = 1, #missing do remembered[missing[j]] = found[j] end
end
local zargs, early, stale = {}, {}, {}
for i = 1, #members do
  if scores[i] then
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = members[i]
  elseif remembered[i] then
    early[#early + 1] = deadline
    early[#early + 1] = members[i]
  else
    stale[#stale + 1] = i
  end
end
if #zargs > 0 then redis.call('ZADD', KEYS[1], 'XX', unpack(zargs)) end
if #early > 0 then redis.call('ZADD', KEYS[2], 'XX', 'GT', unpack(early)) end
return stale
