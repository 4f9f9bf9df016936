-- Idempotency key: claim it for one execution.
--
-- Key schema: KEYS[1] {<prefix>:idem:<key>}  HASH status ('running' | 'done'), holder;
--             its expiry is the running claim's lease, or how long a done key is remembered.
-- ARGV[1] holder, ARGV[2] lease (milliseconds)
--
-- Returns {0, 0} RUN (new, or the old holder's lease ran out: the key expired),
--         {1, 0} DONE, {2, pttl} BUSY (held by a live execution for pttl more milliseconds).
-- Reads and checks first; the HSET is the first write, the one that can still fail.
local lease = tonumber(ARGV[2])
if not (ARGV[1] and lease and lease >= 1 and lease == math.floor(lease)) then
  return redis.error_reply('ERR ackwise idem_claim: bad arguments')
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' then
  return {1, 0}
end
if status == 'running' then
  return {2, redis.call('PTTL', KEYS[1])}
end
redis.call('HSET', KEYS[1], 'status', 'running', 'holder', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0, 0}
