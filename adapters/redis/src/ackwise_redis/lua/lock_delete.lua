-- ackwise beat: delete every key of one lock (a lock no process uses any more).
--
-- Key schema: KEYS[1] lock  HASH   token, owner, fence (see lock_acquire.lua)
--             KEYS[2] fence STRING the fencing counter
--             KEYS[3] schedules SET schedule names (see lock_claim.lua)
-- ARGV[1] the prefix of the fires keys: "{<prefix>:beat:<name>}:fires:" (same hash tag)
-- ARGV[2] the prefix of the fences keys: "{<prefix>:beat:<name>}:fences:" (same hash tag)
--
-- Returns the number of keys deleted.
local n = 0
for _, schedule in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  n = n + redis.call('DEL', ARGV[1] .. schedule, ARGV[2] .. schedule)
end
return n + redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
