-- ackwise receive: move up to ARGV[1] messages to in flight, in one atomic step.
--
-- Key schema (one queue; every key shares the hash tag {<prefix>:<queue>}, so a queue lives in
-- one Redis Cluster slot):
--   KEYS[1] ready     LIST  "<seq>#<n>"                  ready now, FIFO; n = deliveries so far
--   KEYS[2] delayed   ZSET  "<seq>#<n>" -> due time      not receivable before its due time
--   KEYS[3] inflight  ZSET  "<seq>#<n>#<token>" -> lease deadline
--   KEYS[4] data      HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[5] notify    LIST  wake-up tokens; idle receivers BLPOP it between calls
--   KEYS[6] urgent    ZSET  "<seq>#<n>" -> urgent_score   ready, priority > 0 (lib.lua)
-- ARGV[1] max messages, ARGV[2] lease (seconds), ARGV[3] this call's lease token,
-- ARGV[4] sweep limit (due / expired entries looked at per call)
--
-- Taking a message and recording it in flight happen in this one script, so no crash of the
-- caller falls between the pop and the record (dramatiq's dispatch.lua; unlike kombu's
-- pop-then-record).  Expired leases and due delayed messages are receivable too, so a dead
-- worker's messages come back without a separate sweeper; the delivery count n goes up by one
-- on every delivery.  Times come from the server's clock (TIME), the one clock all workers share.
--
-- Order: entries of priority > 0 first (the urgent set, and expired or due ones whose seq
-- carries a priority), highest first; then expired leases (earliest deadline first), then
-- ready, then due delayed entries: the queue as if the expired ones had gone back to its head
-- and the due ones to its tail.  Swept entries that are not taken do go there, or to the
-- urgent set (the token of an expired one is dropped).
--
-- Redis keeps the writes of a script that fails halfway, so everything is read and parsed
-- first and written after; no error can come after the first write (a wrong-typed key fails a
-- read).  An entry that does not parse ("<seq>#<n>"; in flight "<seq>#<n>#<token>"), or whose
-- data record is missing, is taken like a message under a stand-in seq
-- "<ms hex>-<ready|delayed|inflight|nodata>.<token>.<i>" whose data is "0:" .. the raw entry:
-- an empty message id, which ackwise never writes, so the adapter hands it over as corrupt (and
-- again if it comes back after a crash) and the worker dead-letters it with those bytes.  No
-- counter is needed for that seq, so a corrupt seq counter cannot stop a receive.  A malformed
-- swept entry that is not taken stays where it is until a later call takes it.
--
-- Returns {deadline, member1, data1, member2, data2, ...}; when nothing was receivable,
-- {"", seconds until the next delayed message is due or lease expires ("" when none)}.
local max, lease, sweep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local token = ARGV[3]
if not (max and max >= 1 and lease and lease == lease and sweep and sweep >= 0 and token)
    or token == '' or string.find(token, '#', 1, true) then
  return redis.error_reply('ERR ackwise receive: bad arguments')
end
-- unpack() takes a few thousand values at most: bound what one call may take and look at.
max = math.min(math.floor(max), 1000)
sweep = math.min(math.floor(sweep), 1000)

local READY = '^([^#%s]+)#(%d+)$'
local IN_FLIGHT = '^([^#%s]+)#(%d+)#[^#]+$'
-- seq and delivery count of an entry, or nil when it is not one ackwise writes
local function parse(entry, pattern)
  local seq, n = string.match(entry, pattern)
  if seq and #n <= 9 then return seq, tonumber(n) end
  return nil
end

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- 1. Read and parse.
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, sweep)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, sweep)
-- one entry more than wanted: is more waiting after this call?
local urgent = redis.call('ZRANGE', KEYS[6], 0, max, 'WITHSCORES')

-- taken messages as parallel arrays: raw entry, seq and count (nil: malformed), where a
-- malformed one was; `lookup` lists the seqs to read data for, in the same order
local raw, seqs, counts, from, lookup = {}, {}, {}, {}, {}
local function take(entry, where, seq, n)
  local i = #raw + 1
  raw[i], seqs[i], counts[i] = entry, seq, n
  if seq then lookup[#lookup + 1] = seq else from[i] = where end
end

-- Entries of priority > 0 come first, by their urgent score: the urgent set's head, and the
-- swept entries that carry a priority.  The others keep the order above.
local cands, plain_expired, plain_due = {}, {}, {}
local function candidate(score, entry, where, seq, n)
  cands[#cands + 1] = {score = score, order = #cands, raw = entry, from = where, seq = seq, n = n}
end
for i = 1, #urgent, 2 do
  local seq, n = parse(urgent[i], READY)
  candidate(tonumber(urgent[i + 1]) or 0, urgent[i], 'urgent', seq, n)
end
for i = 1, #expired do
  local seq, n = parse(expired[i], IN_FLIGHT)
  local p = seq and seq_priority(seq) or 0
  if p > 0 then
    candidate(urgent_score(seq, p), expired[i], 'inflight', seq, n)
  else
    plain_expired[#plain_expired + 1] = expired[i]
  end
end
for i = 1, #due do
  local seq, n = parse(due[i], READY)
  local p = seq and seq_priority(seq) or 0
  if p > 0 then
    candidate(urgent_score(seq, p), due[i], 'delayed', seq, n)
  else
    plain_due[#plain_due + 1] = due[i]
  end
end
if #cands > 1 then
  table.sort(cands, function(a, b)
    if a.score ~= b.score then return a.score < b.score end
    return a.order < b.order
  end)
end

-- swept entries: taken ones leave their set; valid ones not taken go to ready; the rest stay
local unlease, undelay, unurgent, to_head, to_tail, to_urgent = {}, {}, {}, {}, {}, {}
local urgent_left = false
for _, c in ipairs(cands) do
  if #raw < max then
    take(c.raw, c.from, c.seq, c.n)
    if c.from == 'urgent' then
      unurgent[#unurgent + 1] = c.raw
    elseif c.from == 'inflight' then
      unlease[#unlease + 1] = c.raw
    else
      undelay[#undelay + 1] = c.raw
    end
  elseif c.from == 'urgent' then
    urgent_left = true
  else  -- a swept candidate parsed: it goes to the urgent set
    to_urgent[#to_urgent + 1] = c.seq .. '#' .. c.n
    if c.from == 'inflight' then
      unlease[#unlease + 1] = c.raw
    else
      undelay[#undelay + 1] = c.raw
    end
  end
end
for i = 1, #plain_expired do
  local e = plain_expired[i]
  local seq, n = parse(e, IN_FLIGHT)
  if #raw < max then
    take(e, 'inflight', seq, n)
    unlease[#unlease + 1] = e
  elseif seq then
    to_head[#to_head + 1] = seq .. '#' .. n
    unlease[#unlease + 1] = e
  end
end
local want = max - #raw
local head = redis.call('LRANGE', KEYS[1], 0, want)
local from_ready = math.min(#head, want)
for i = 1, from_ready do
  local seq, n = parse(head[i], READY)
  take(head[i], 'ready', seq, n)
end
for i = 1, #plain_due do
  local e = plain_due[i]
  local seq, n = parse(e, READY)
  if #raw < max then
    take(e, 'delayed', seq, n)
    undelay[#undelay + 1] = e
  elseif seq then
    to_tail[#to_tail + 1] = e
    undelay[#undelay + 1] = e
  end
end

if #raw == 0 then
  local next_due = nil
  local d = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if d[2] then next_due = tonumber(d[2]) end
  local l = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if l[2] and (next_due == nil or tonumber(l[2]) < next_due) then next_due = tonumber(l[2]) end
  if next_due == nil then return {'', ''} end
  return {'', string.format('%.6f', next_due - now)}
end

local found = {}
if #lookup > 0 then
  found = redis.call('HMGET', KEYS[4], unpack(lookup))
else
  redis.call('HLEN', KEYS[4])  -- the data hash's type, checked before stand-ins are stored
end

local deadline = now + lease
local out = {string.format('%.6f', deadline)}
local zargs, stand_ins = {}, {}
local j = 0  -- position in found
for i = 1, #raw do
  local member, data = nil, nil
  if seqs[i] then
    j = j + 1
    data = found[j]
  end
  if data then
    member = seqs[i] .. '#' .. (counts[i] + 1) .. '#' .. token
  else
    local seq = string.format('%x-', ms) .. (from[i] or 'nodata') .. '.' .. token .. '.' .. i
    member = seq .. '#1#' .. token
    data = '0:' .. raw[i]
    stand_ins[#stand_ins + 1] = seq
    stand_ins[#stand_ins + 1] = data
  end
  zargs[#zargs + 1] = deadline
  zargs[#zargs + 1] = member
  out[#out + 1] = member
  out[#out + 1] = data
end
-- More is ready after this call: pass the baton to another idle receiver.
local wake = false
if #head > from_ready or #to_head + #to_tail + #to_urgent > 0 or urgent_left then
  wake = redis.call('LLEN', KEYS[5]) == 0
end

-- 2. Write (every key's type was checked by a read above).
if from_ready > 0 then redis.call('LPOP', KEYS[1], from_ready) end  -- those just read
if #unlease > 0 then redis.call('ZREM', KEYS[3], unpack(unlease)) end
if #undelay > 0 then redis.call('ZREM', KEYS[2], unpack(undelay)) end
if #unurgent > 0 then redis.call('ZREM', KEYS[6], unpack(unurgent)) end
if #to_head > 0 then
  local reversed = {}  -- LPUSH puts its last argument first: earliest deadline at the head
  for i = #to_head, 1, -1 do reversed[#reversed + 1] = to_head[i] end
  redis.call('LPUSH', KEYS[1], unpack(reversed))
end
if #to_tail > 0 then redis.call('RPUSH', KEYS[1], unpack(to_tail)) end
if #to_urgent > 0 then make_ready(KEYS[1], KEYS[6], 'RPUSH', to_urgent) end
if #stand_ins > 0 then redis.call('HSET', KEYS[4], unpack(stand_ins)) end
zadd_indexed(KEYS[3], zargs)
if wake then redis.call('RPUSH', KEYS[5], '1') end
return out
