-- ackwise publish: store a batch of messages, ready now or delayed, and wake a receiver.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] ready     LIST  "<seq>#<n>"                  ready now, FIFO; n = deliveries so far
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time
--   KEYS[3] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[4] seq       STRING counter (decimal, below 2^52); a message's seq is
--                     "<enqueue ms, hex>-<counter, hex>"
--   KEYS[5] notify    LIST  wake-up tokens for idle receivers
--   KEYS[6] urgent    ZSET  "<seq>#<n>" -> urgent_score   ready now, priority > 0 (lib.lua)
-- ARGV[1] "0": every message is ready now, ARGV[2..] are packed messages;
--         "1": ARGV[2..] are pairs (packed message, delay in seconds);
--         "2": ARGV[2..] are triples (packed message, delay in seconds, priority 0-9)
--
-- The seq is unique per queue (ids are not: a retry is published with its message's id) and
-- carries the server's enqueue time, from which stats() computes the oldest message's age, and
-- "!<priority>" after it when the priority is above 0.
-- Everything is read and checked first; the data hash is the first write (the one that can
-- still fail), the counter is SET last.  A counter that holds no count is refused with
-- ACKWISE_CORRUPT before anything is written (the adapter quarantines it and calls again).
local step = 1
if ARGV[1] == '1' then step = 2 elseif ARGV[1] == '2' then step = 3 elseif ARGV[1] ~= '0' then
  return redis.error_reply('ERR ackwise publish: bad mode')
end
local n = (#ARGV - 1) / step
if n ~= math.floor(n) then return redis.error_reply('ERR ackwise publish: bad arguments') end
if n == 0 then return 0 end
local delays, suffixes = {}, {}
for i = 1, n do
  local delay, suffix = 0, ''
  if step >= 2 then delay = tonumber(ARGV[2 + (i - 1) * step + 1]) end
  if not delay or delay ~= delay then return redis.error_reply('ERR ackwise publish: bad delay') end
  if step == 3 then
    local p = ARGV[2 + (i - 1) * step + 2]
    if not string.match(p, '^%d$') then
      return redis.error_reply('ERR ackwise publish: bad priority')
    end
    if p ~= '0' then suffix = '!' .. p end
  end
  delays[i], suffixes[i] = delay, suffix
end
local last = seq_counter(KEYS[4])
if not last then return redis.error_reply(CORRUPT_COUNTER) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = string.format('%x-', ms)
local fields, ready, delayed = {}, {}, {}
for i = 1, n do
  local seq = prefix .. string.format('%x', last + i) .. suffixes[i]
  fields[#fields + 1] = seq
  fields[#fields + 1] = ARGV[2 + (i - 1) * step]
  if delays[i] > 0 then
    delayed[#delayed + 1] = now + delays[i]
    delayed[#delayed + 1] = seq .. '#0'
  else
    ready[#ready + 1] = seq .. '#0'
  end
end
if #ready > 0 then
  redis.call('LLEN', KEYS[1])
  if step == 3 then redis.call('ZCARD', KEYS[6]) end
end
if #delayed > 0 then redis.call('ZCARD', KEYS[2]) end
-- A delayed message may be due before an idle receiver's timeout: wake one to look.
local wake = redis.call('LLEN', KEYS[5]) == 0

redis.call('HSET', KEYS[3], unpack(fields))
if #ready > 0 and step == 3 then
  make_ready(KEYS[1], KEYS[6], 'RPUSH', ready)
elseif #ready > 0 then
  redis.call('RPUSH', KEYS[1], unpack(ready))
end
if #delayed > 0 then redis.call('ZADD', KEYS[2], unpack(delayed)) end
redis.call('SET', KEYS[4], string.format('%d', last + n))
if wake then redis.call('RPUSH', KEYS[5], '1') end
return n
