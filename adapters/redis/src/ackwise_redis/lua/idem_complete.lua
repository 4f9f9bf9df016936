-- Idempotency key: mark it done (whoever holds it now: the effect has happened).
--
-- Key schema: KEYS[1] {<prefix>:idem:<key>}  HASH status, holder (see idem_claim.lua)
-- ARGV[1] how long a done key is remembered (milliseconds)
redis.call('HSET', KEYS[1], 'status', 'done')
redis.call('HDEL', KEYS[1], 'holder')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
