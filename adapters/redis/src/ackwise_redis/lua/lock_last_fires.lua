-- ackwise beat: the newest claimed fire time of every schedule of one lock.
--
-- Key schema: KEYS[1] schedules  SET schedule names (see lock_claim.lua)
-- ARGV[1] the prefix of the fires keys: "{<prefix>:beat:<name>}:fires:" (same hash tag)
--
-- Returns a flat list: schedule, fire time, schedule, fire time, ...
local out = {}
for _, schedule in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local newest = redis.call('ZRANGE', ARGV[1] .. schedule, -1, -1)
  if newest[1] then
    out[#out + 1] = schedule
    out[#out + 1] = newest[1]
  end
end
return out
