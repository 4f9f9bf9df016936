-- ackwise beat: compare-and-delete the lock.
--
-- Key schema: KEYS[1] lock  HASH token, owner, fence (see lock_acquire.lua)
-- ARGV[1] token
--
-- Returns 1 when the token held the lock (now free), else 0 and nothing changes (a stale
-- release).  The fencing counter is never deleted, so numbers keep rising.  One write (DEL,
-- which takes any type), after the read.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
