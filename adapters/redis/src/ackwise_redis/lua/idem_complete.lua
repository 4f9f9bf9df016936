-- Idempotency key: mark it done (whoever holds it now: the effect has happened).
--
-- Key schema: KEYS[1] {<prefix>:idem:<key>}  HASH status, holder (see idem_claim.lua)
-- ARGV[1] how long a done key is remembered (milliseconds)
--
-- Checks first; the HSET is the first write, the one that can still fail (a wrong-typed key).
local ttl = tonumber(ARGV[1])
if not (ttl and ttl >= 1 and ttl == math.floor(ttl)) then
  return redis.error_reply('ERR ackwise idem_complete: bad ttl')
end
redis.call('HSET', KEYS[1], 'status', 'done')
redis.call('HDEL', KEYS[1], 'holder')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
