-- ackwise lib: helpers of the scripts that load it (the adapter puts this file before them:
-- a Redis script cannot include another).  Reads only, but for what `command` does.

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

