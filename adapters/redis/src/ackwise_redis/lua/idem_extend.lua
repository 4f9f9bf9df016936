-- Idempotency key: move a running claim's lease, only for its own holder.
--
-- Key schema: KEYS[1] {<prefix>:idem:<key>}  HASH status, holder (see idem_claim.lua)
-- ARGV[1] holder, ARGV[2] lease (milliseconds)
--
-- One write, after the checks.
local lease = tonumber(ARGV[2])
if not (lease and lease >= 1 and lease == math.floor(lease)) then
  return redis.error_reply('ERR ackwise idem_extend: bad lease')
end
if redis.call('HGET', KEYS[1], 'status') == 'running'
    and redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
