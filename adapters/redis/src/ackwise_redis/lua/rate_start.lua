-- Rate limit: record a start of a task now, unless its last start is less than an interval
-- ago (docs/rate-limits.md).  An executor calls it right before the task's function: a start
-- that comes late (a thread held back) makes the next one wait, instead of both starting
-- together.
--
-- Key schema: KEYS[1] {<prefix>:rate:<key>}        STRING the next free start (rate_reserve.lua)
--             KEYS[2] {<prefix>:rate:<key>}:start  STRING the last recorded start
--             (seconds, server clock; one hash slot: the braces hold the whole first name)
-- ARGV[1] the interval between two starts (seconds)
-- ARGV[2] the margin (seconds): the start is recorded that long after now, the latest the
--         caller will begin it
--
-- Returns "0" when the start is recorded (and the next free start moved to at least one
-- interval after it), else the seconds until it may be (nothing written), as a string.
local interval = tonumber(ARGV[1])
if not (interval and interval > 0) then
  return redis.error_reply('ERR ackwise rate_start: bad interval')
end
local margin = tonumber(ARGV[2])
if not (margin and margin >= 0) then
  return redis.error_reply('ERR ackwise rate_start: bad margin')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = tonumber(redis.call('GET', KEYS[2]) or '')
if last and last + interval > now then
  return string.format('%.6f', last + interval - now)
end
local begun = now + margin
local after = begun + interval
local ttl = math.ceil((after - now) * 1000) + 1000
redis.call('SET', KEYS[2], string.format('%.6f', begun), 'PX', ttl)
local nxt = tonumber(redis.call('GET', KEYS[1]) or '')
if not nxt or nxt < after then
  redis.call('SET', KEYS[1], string.format('%.6f', after), 'PX', ttl)
end
return '0'
