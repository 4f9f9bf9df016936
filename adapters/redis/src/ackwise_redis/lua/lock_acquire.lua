-- ackwise beat: take the leader lock if nobody holds it, with a new fencing number.
--
-- Key schema (one lock, hash tag {<prefix>:beat:<name>}):
--   KEYS[1] lock       HASH   token, owner, fence; expires (PEXPIRE) ttl after the last renewal
--   KEYS[2] fence      STRING counter, never expires: every acquisition gets a higher number
-- ARGV[1] token, ARGV[2] ttl (milliseconds), ARGV[3] owner ("host:pid")
--
-- Returns the new fencing number, or nil when another token holds the lock.  Checks first;
-- INCR is the first write, the one that can still fail (a fence that holds no number).
local ttl = tonumber(ARGV[2])
if not (ARGV[1] and ARGV[3] and ttl and ttl >= 1 and ttl == math.floor(ttl)) then
  return redis.error_reply('ERR ackwise lock_acquire: bad arguments')
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'owner', ARGV[3], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
