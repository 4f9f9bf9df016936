-- ackwise receive: move up to ARGV[1] messages from ready to in flight, in one atomic step.
--
-- Key schema (one queue; every key shares the hash tag {<prefix>:<queue>}, so a queue lives in
-- one Redis Cluster slot):
--   KEYS[1] ready     LIST  "<seq>#<n>"                  ready now, FIFO; n = deliveries so far
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time      not receivable before its due time
--   KEYS[3] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[4] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[5] notify    LIST  wake-up tokens; idle receivers BLPOP it between calls
-- ARGV[1] max messages, ARGV[2] lease (seconds), ARGV[3] this call's lease token,
-- ARGV[4] sweep limit (due / expired entries moved per call)
--
-- Taking a message and recording it in flight happen in this one script: Redis runs it whole
-- or not at all, so no crash of the caller falls between the pop and the record (dramatiq's
-- dispatch.lua; unlike kombu's pop-then-record).  Due delayed messages and expired leases are
-- made ready first, so a dead worker's messages come back without a separate sweeper; the
-- delivery count n goes up by one on every delivery.  Times come from the server's clock
-- (TIME), the one clock all workers share.
--
-- Returns {deadline, member1, data1, member2, data2, ...}; when nothing was ready,
-- {"", seconds until the next delayed message is due or lease expires ("" when none)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local max = tonumber(ARGV[1])
local sweep = tonumber(ARGV[4])

local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, sweep)
if #expired > 0 then
  redis.call('ZREM', KEYS[3], unpack(expired))
  -- back to the head of the queue, earliest deadline first; the token is dropped
  for i = #expired, 1, -1 do
    redis.call('LPUSH', KEYS[1], string.match(expired[i], '^(.*)#[^#]*$'))
  end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, sweep)
if #due > 0 then
  redis.call('ZREM', KEYS[2], unpack(due))
  redis.call('RPUSH', KEYS[1], unpack(due))
end

local taken = redis.call('LPOP', KEYS[1], max)
if not taken then
  local next_due = nil
  local d = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if d[2] then next_due = tonumber(d[2]) end
  local l = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if l[2] and (next_due == nil or tonumber(l[2]) < next_due) then next_due = tonumber(l[2]) end
  if next_due == nil then return {'', ''} end
  return {'', string.format('%.6f', next_due - now)}
end

local deadline = now + tonumber(ARGV[2])
local token = ARGV[3]
local seqs, members = {}, {}
for i = 1, #taken do
  local e = taken[i]
  local p = string.find(e, '#', 1, true)
  local seq = string.sub(e, 1, p - 1)
  seqs[i] = seq
  members[i] = seq .. '#' .. (tonumber(string.sub(e, p + 1)) + 1) .. '#' .. token
end
local datas = redis.call('HMGET', KEYS[4], unpack(seqs))
local out = {string.format('%.6f', deadline)}
local zargs = {}
for i = 1, #taken do
  if datas[i] then
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = members[i]
    out[#out + 1] = members[i]
    out[#out + 1] = datas[i]
  end
end
if #zargs > 0 then
  redis.call('ZADD', KEYS[3], unpack(zargs))
end
-- More is ready: pass the baton to another idle receiver.
if redis.call('LLEN', KEYS[1]) > 0 and redis.call('LLEN', KEYS[5]) == 0 then
  redis.call('RPUSH', KEYS[5], '1')
end
if #out == 1 then return {'', '0'} end
return out
