-- ackwise beat: compare-and-replace the lock's expiry.
--
-- Key schema: KEYS[1] lock  HASH token, owner, fence (see lock_acquire.lua)
-- ARGV[1] token, ARGV[2] ttl (milliseconds)
--
-- Returns 1 when the token still holds the lock (its expiry is now ttl from now), else 0 and
-- nothing changes: a stale holder never extends the lock of the process that took it over.
-- One write, after the checks.
local ttl = tonumber(ARGV[2])
if not (ttl and ttl >= 1 and ttl == math.floor(ttl)) then
  return redis.error_reply('ERR ackwise lock_renew: bad ttl')
end
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
