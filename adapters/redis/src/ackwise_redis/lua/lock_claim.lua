-- ackwise beat: claim one fire (schedule, fire time), only as the lock's holder.
--
-- Key schema (hash tag {<prefix>:beat:<name>}):
--   KEYS[1] lock                HASH token, owner, fence (see lock_acquire.lua)
--   KEYS[2] fires:<schedule>    ZSET fire time (us since the epoch) -> the same number
--   KEYS[3] schedules           SET  schedule names that have fires
--   KEYS[4] fences:<schedule>   HASH fire time -> fencing number of the holder that claimed
--                               it (claims made before this key existed have no field: the
--                               claimer is unknown)
-- ARGV[1] token, ARGV[2] schedule, ARGV[3] fire time (us), ARGV[4] fires kept per schedule
--
-- Returns 1 (claimed: enqueue it), 0 (claimed before: do not), -1 (not the holder: nothing
-- recorded).  The token check and the record, with who made it, are one atomic step.  Reads
-- and checks first (SCARD and HLEN fail on a key of the wrong type); the ZADD is the first
-- write, the one that can still fail.
local fire, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
if not (ARGV[2] and fire and fire == fire and keep and keep >= 1) then
  return redis.error_reply('ERR ackwise lock_claim: bad arguments')
end
local held = redis.call('HMGET', KEYS[1], 'token', 'fence')
if held[1] ~= ARGV[1] then
  return -1
end
redis.call('SCARD', KEYS[3])
redis.call('HLEN', KEYS[4])
if redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[3]) == 0 then
  return 0
end
if held[2] then  -- always there: lock_acquire writes it with the token
  redis.call('HSET', KEYS[4], ARGV[3], held[2])
end
redis.call('SADD', KEYS[3], ARGV[2])
local last = -(math.floor(keep) + 1)
local pruned = redis.call('ZRANGE', KEYS[2], 0, last)
if #pruned > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, last)
  redis.call('HDEL', KEYS[4], unpack(pruned))
end
-- Fields of fires pruned by a version that kept no fences (during a rolling upgrade) would
-- stay for ever: drop every field whose fire is gone, which only ever happens then.
if redis.call('HLEN', KEYS[4]) > redis.call('ZCARD', KEYS[2]) then
  for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
    if not redis.call('ZSCORE', KEYS[2], f) then
      redis.call('HDEL', KEYS[4], f)
    end
  end
end
return 1
