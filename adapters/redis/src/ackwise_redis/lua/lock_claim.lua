-- ackwise beat: claim one fire (schedule, fire time), only as the lock's holder.
--
-- Key schema (hash tag {<prefix>:beat:<name>}):
--   KEYS[1] lock                HASH token, owner, fence (see lock_acquire.lua)
--   KEYS[2] fires:<schedule>    ZSET fire time (us since the epoch) -> the same number
--   KEYS[3] schedules           SET  schedule names that have fires
-- ARGV[1] token, ARGV[2] schedule, ARGV[3] fire time (us), ARGV[4] fires kept per schedule
--
-- Returns 1 (claimed: enqueue it), 0 (claimed before: do not), -1 (not the holder: nothing
-- recorded).  The token check and the record are one atomic step.  Reads and checks first;
-- the ZADD is the first write, the one that can still fail.
local fire, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
if not (ARGV[2] and fire and fire == fire and keep and keep >= 1) then
  return redis.error_reply('ERR ackwise lock_claim: bad arguments')
end
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return -1
end
redis.call('SCARD', KEYS[3])
if redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[3]) == 0 then
  return 0
end
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(math.floor(keep) + 1))
return 1
