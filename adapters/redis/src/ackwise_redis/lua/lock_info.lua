-- ackwise beat: who holds the lock.
--
-- Key schema: KEYS[1] lock  HASH token, owner, fence (see lock_acquire.lua)
--
-- Returns {owner, fence, milliseconds to expiry}, or nil when the lock is free.
local v = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if not v[2] then
  return false
end
return {v[1], v[2], redis.call('PTTL', KEYS[1])}
