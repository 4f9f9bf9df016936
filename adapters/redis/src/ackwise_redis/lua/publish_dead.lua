-- ackwise publish_dead: store messages directly in a queue's dead-letter store.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[2] dead       ZSET  <seq> -> dead_at (oldest first)
--   KEYS[3] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[4] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[5] seq        STRING counter (see publish.lua)
-- ARGV[1] reason, then triples (message id, packed message, priority 0-9: kept in the seq, so
-- a replay keeps it)
--
-- Messages of one call get dead_at one microsecond apart, so they list in call order.
-- Reads and checks first; the data hash is the first write, the one that can still fail.
local n = (#ARGV - 1) / 3
if n ~= math.floor(n) then return redis.error_reply('ERR ackwise publish_dead: bad arguments') end
if n == 0 then return 0 end
local last = seq_counter(KEYS[5])
if not last then return redis.error_reply(CORRUPT_COUNTER) end
local ids, order = {}, {}  -- message id -> its seqs so far, in first-seen order
for i = 1, n do
  local id = ARGV[3 * i - 1]
  if not string.match(ARGV[3 * i + 1], '^%d$') then
    return redis.error_reply('ERR ackwise publish_dead: bad priority')
  end
  if ids[id] == nil then
    ids[id] = redis.call('HGET', KEYS[4], id) or ''
    order[#order + 1] = id
  end
end
redis.call('ZCARD', KEYS[2])
redis.call('HLEN', KEYS[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = string.format('%x-', ms)
local fields, dead, info = {}, {}, {}
for i = 1, n do
  local p = ARGV[3 * i + 1]
  local seq = prefix .. string.format('%x', last + i) .. (p ~= '0' and '!' .. p or '')
  local id = ARGV[3 * i - 1]
  fields[#fields + 1] = seq
  fields[#fields + 1] = ARGV[3 * i]
  dead[#dead + 1] = now + (i - 1) / 1000000
  dead[#dead + 1] = seq
  info[#info + 1] = seq
  info[#info + 1] = '0|' .. ARGV[1]
  if ids[id] == '' then ids[id] = seq else ids[id] = ids[id] .. ' ' .. seq end
end
local mapping = {}
for _, id in ipairs(order) do
  mapping[#mapping + 1] = id
  mapping[#mapping + 1] = ids[id]
end

redis.call('HSET', KEYS[1], unpack(fields))
redis.call('ZADD', KEYS[2], unpack(dead))
redis.call('HSET', KEYS[3], unpack(info))
redis.call('HSET', KEYS[4], unpack(mapping))
redis.call('SET', KEYS[5], string.format('%d', last + n))
return n
