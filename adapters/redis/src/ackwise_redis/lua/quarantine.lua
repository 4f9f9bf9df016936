-- ackwise quarantine: rename aside the keys of a queue that hold what ackwise never writes
-- there, so that the queue goes on.
--
-- Key schema: KEYS[i] one key of a queue (or the queue registry {<prefix>}:queues), ARGV[i]
-- what it must hold: a Redis type ("list", "zset", "hash", "set") or "counter" (a string of
-- a decimal count below 2^52, see publish.lua).
--
-- A key holding anything else is renamed to "<key>:quarantined:<server time, us>": the same
-- hash tag (the same cluster slot), kept for inspection, never read by ackwise.  A counter
-- renamed aside starts again at the server time in microseconds, above any count a queue's
-- counter reaches, so new seqs never collide with stored ones.  Reads first, then renames.
-- Returns {key, what it held, new name, ...} for the keys renamed.
local t = redis.call('TIME')
local stamp = t[1] .. string.format('%06d', tonumber(t[2]))
local wrong = {}
for i = 1, #KEYS do
  local held = redis.call('TYPE', KEYS[i])['ok']
  local want = ARGV[i]
  if want == 'counter' then want = 'string' end
  if held ~= 'none' and held ~= want then
    wrong[#wrong + 1] = {i, held}
  elseif held == 'string' and ARGV[i] == 'counter' then
    local v = redis.call('GET', KEYS[i])
    if not (#v <= 16 and string.match(v, '^%d+$') and tonumber(v) < 4503599627370496) then
      wrong[#wrong + 1] = {i, 'string that is no count'}
    end
  end
end
local out = {}
for _, w in ipairs(wrong) do
  local key = KEYS[w[1]]
  local aside = key .. ':quarantined:' .. stamp
  redis.call('RENAME', key, aside)
  if ARGV[w[1]] == 'counter' then redis.call('SET', key, stamp) end
  out[#out + 1] = key
  out[#out + 1] = w[2]
  out[#out + 1] = aside
end
return out
