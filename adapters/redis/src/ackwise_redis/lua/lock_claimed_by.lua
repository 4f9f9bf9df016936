-- ackwise beat: the fencing number of the holder that claimed one fire.
--
-- Key schema (hash tag {<prefix>:beat:<name>}, see lock_claim.lua):
--   KEYS[1] fires:<schedule>    ZSET claimed fire times
--   KEYS[2] fences:<schedule>   HASH fire time -> fencing number of its claimer
-- ARGV[1] fire time (us)
--
-- Returns the fencing number, or nil when the fire is not claimed (never, or pruned) or was
-- claimed before fences were kept.  The fire's own record decides first: a field left by a
-- pruned fire is never an answer.
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return false
end
return redis.call('HGET', KEYS[2], ARGV[1])
