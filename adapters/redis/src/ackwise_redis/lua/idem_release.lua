-- Idempotency key: give a running claim up (the execution failed), only for its own holder.
--
-- Key schema: KEYS[1] {<prefix>:idem:<key>}  HASH status, holder (see idem_claim.lua)
-- ARGV[1] holder
--
-- One write (DEL, which takes any type), after the reads.
if redis.call('HGET', KEYS[1], 'status') == 'running'
    and redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
