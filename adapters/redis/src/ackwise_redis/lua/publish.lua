-- ackwise publish: store a batch of messages, ready now or delayed, and wake a receiver.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"                  ready now, FIFO; n = deliveries so far
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[4] seq       STRING counter; a message's seq is "<enqueue ms, hex>-<counter, hex>"
--   KEYS[5] notify    LIST  wake-up tokens for idle receivers
-- ARGV[1] "0": every message is ready now, ARGV[2..] are packed messages;
--         "1": ARGV[2..] are pairs (packed message, delay in seconds)
--
-- The seq is unique per queue (ids are not: a retry is published with its message's id) and
-- carries the server's enqueue time, from which stats() computes the oldest message's age.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local step = 1
if ARGV[1] == '1' then step = 2 end
local n = (#ARGV - 1) / step
local last = redis.call('INCRBY', KEYS[4], n)
local prefix = string.format('%x-', ms)
local fields, ready, delayed = {}, {}, {}
for i = 1, n do
  local seq = prefix .. string.format('%x', last - n + i)
  local j = 2 + (i - 1) * step
  fields[#fields + 1] = seq
  fields[#fields + 1] = ARGV[j]
  local delay = 0
  if step == 2 then delay = tonumber(ARGV[j + 1]) end
  if delay > 0 then
    delayed[#delayed + 1] = now + delay
    delayed[#delayed + 1] = seq .. '#0'
  else
    ready[#ready + 1] = seq .. '#0'
  end
end
redis.call('HSET', KEYS[3], unpack(fields))
if #ready > 0 then redis.call('RPUSH', KEYS[1], unpack(ready)) end
if #delayed > 0 then redis.call('ZADD', KEYS[2], unpack(delayed)) end
-- A delayed message may be due before an idle receiver's timeout: wake one to look.
if redis.call('LLEN', KEYS[5]) == 0 then redis.call('RPUSH', KEYS[5], '1') end
return n
