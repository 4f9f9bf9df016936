-- Rate limit: reserve the next free start of a task (docs/rate-limits.md; GCRA, no burst).
--
-- Key schema: KEYS[1] {<prefix>:rate:<key>}  STRING the next free start (seconds, server clock)
-- ARGV[1] the interval between two starts (seconds)
--
-- Returns the seconds from now to the reserved start ("0": start now), as a string.  The
-- server's clock is the one clock of every worker; the key expires once its slot has passed.
local interval = tonumber(ARGV[1])
if not (interval and interval > 0) then
  return redis.error_reply('ERR ackwise rate_reserve: bad interval')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local start = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if start < now then
  start = now
end
local after = start + interval
redis.call('SET', KEYS[1], string.format('%.6f', after), 'PX', math.ceil((after - now) * 1000) + 1000)
return string.format('%.6f', start - now)
