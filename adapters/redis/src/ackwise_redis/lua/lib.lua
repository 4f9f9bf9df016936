-- ackwise lib: helpers of the scripts that load it (the adapter puts this file before them:
-- a Redis script cannot include another).  Reads only, but for what `command` does,
-- make_ready and zadd_indexed.

-- redis.call(command, key, ...list), 1000 arguments per call (unpack()'s limits); the replies
-- joined.
local function chunked(command, key, list)
  local out = {}
  for i = 1, #list, 1000 do
    local part = redis.call(command, key, unpack(list, i, math.min(i + 999, #list)))
    if type(part) == 'table' then for j = 1, #part do out[#out + 1] = part[j] end end
  end
  return out
end

-- The seq counter STRING at `key` (0 when unset), or nil when it holds no count ackwise wrote
-- (the caller refuses with CORRUPT_COUNTER, which makes the adapter set the key aside).
local CORRUPT_COUNTER = 'ACKWISE_CORRUPT the seq counter holds no count'
local function seq_counter(key)
  local stored = redis.call('GET', key)
  if not stored then return 0 end
  local last = #stored <= 16 and string.match(stored, '^%d+$') and tonumber(stored)
  if not last or last >= 4503599627370496 then return nil end
  return last
end

-- The dead letters named by the message ids ARGV[first..]: the ids `dead_ids` (HASH: message
-- id -> "<seq> <seq> ...") lists, and the seqs among them still in `dead` (ZSET).  An id
-- "corrupt-<seq>" that dead_ids does not know names the dead letter <seq> itself: the stand-in
-- id under which a record without a readable id is listed.
local function named_dead(dead, dead_ids, first)
  local named, candidates, seen = {}, {}, {}
  local function consider(seq)
    if not seen[seq] then
      seen[seq] = true
      candidates[#candidates + 1] = seq
    end
  end
  for i = first, #ARGV do
    local id = ARGV[i]
    local listed = redis.call('HGET', dead_ids, id)
    if listed then
      named[#named + 1] = id
      for seq in string.gmatch(listed, '%S+') do consider(seq) end
    elseif #id > 8 and string.sub(id, 1, 8) == 'corrupt-' then
      consider(string.sub(id, 9))
    end
  end
  local found = {}
  local scores = chunked('ZMSCORE', dead, candidates)
  for i = 1, #candidates do
    if scores[i] then found[#found + 1] = candidates[i] end
  end
  return named, found
end


-- Priorities.  A message of priority p (1..9) has a seq ending in "!<p>"; its ready entry
-- waits in the `urgent` ZSET (not the ready LIST) under urgent_score: higher priorities
-- first, then the enqueue time its seq carries (a nacked or redelivered entry regains its
-- place).  Priority 0 (no suffix) is the ready LIST, taken after every urgent entry.
local function seq_priority(seq)
  local p = string.match(seq, '!([1-9])$')
  if p then return tonumber(p) end
  return 0
end
local URGENT_BAND = 4398046511104  -- 2^42 ms: beyond the year 2100
local function urgent_score(seq, p)
  local ms = tonumber(string.match(seq, '^(%x+)-') or '', 16) or 0
  return (10 - p) * URGENT_BAND + math.min(ms, URGENT_BAND - 1)
end
-- Put ready entries back: `entries` of priority > 0 to the urgent ZSET, the others pushed to
-- the ready LIST with `push` ('RPUSH' at the tail; 'LPUSH': give them in reverse for the
-- head).  Writes only.
local function make_ready(ready, urgent, push, entries)
  local plain, scored = {}, {}
  for i = 1, #entries do
    local seq = string.match(entries[i], '^[^#]*')
    local p = seq_priority(seq)
    if p > 0 then
      scored[#scored + 1] = urgent_score(seq, p)
      scored[#scored + 1] = entries[i]
    else
      plain[#plain + 1] = entries[i]
    end
  end
  if #plain > 0 then redis.call(push, ready, unpack(plain)) end
  if #scored > 0 then redis.call('ZADD', urgent, unpack(scored)) end
end

-- ZADD `zargs` (score, member, ...) to the ZSET at `key`; a new set is made a skiplist.
-- Redis keeps a set of up to zset-max-listpack-entries (128) short members as a listpack,
-- which ZADD, ZMSCORE and ZREM read end to end: the in-flight set of a draining worker holds
-- about its prefetch window, and there a ZADD cost 4.4 µs a member against 0.35 µs in a
-- skiplist.  A member longer than zset-max-listpack-value (64) makes Redis create a skiplist,
-- which it keeps until the set is empty; that member goes again in the same call.
local function zadd_indexed(key, zargs)
  if redis.call('EXISTS', key) == 1 then
    redis.call('ZADD', key, unpack(zargs))
    return
  end
  local seed = string.rep('~', 512)  -- made here: the scripts that load this file and never
  redis.call('ZADD', key, 0, seed)   -- call this one pay nothing for it
  redis.call('ZADD', key, unpack(zargs))
  redis.call('ZREM', key, seed)
end
