-- ackwise extend: move the lease deadline of deliveries whose receipt still owns them.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
-- ARGV[1] lease (seconds from now, server clock), ARGV[2..] receipts (in-flight members)
--
-- One write, after every check.
-- Returns the 1-based positions (among the receipts) of the stale ones; they change nothing.
local lease = tonumber(ARGV[1])
if not lease or lease ~= lease then return redis.error_reply('ERR ackwise extend: bad lease') end
if #ARGV < 2 then return {} end
local t = redis.call('TIME')
local deadline = tonumber(t[1]) + tonumber(t[2]) / 1000000 + lease
local members = {}
for i = 2, #ARGV do members[i - 1] = ARGV[i] end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(members))
local zargs, stale = {}, {}
for i = 1, #members do
  if scores[i] then
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = members[i]
  else
    stale[#stale + 1] = i
  end
end
if #zargs > 0 then redis.call('ZADD', KEYS[1], 'XX', unpack(zargs)) end
return stale
