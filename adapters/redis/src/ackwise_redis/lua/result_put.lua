-- Task result: store a record unless the stored one may not be replaced (docs/results.md),
-- then tell the waiters.
--
-- Key schema: KEYS[1] {<prefix>:result:<id>}  STRING the record (JSON), expiring with the TTL
-- ARGV[1] the record (JSON)   ARGV[2] its state   ARGV[3] TTL (milliseconds)
--
-- A success is never replaced; a failure or a death is not replaced by a start.  The channel
-- of the key's name hears the new state (handle.get() subscribes before it reads).
local ttl = tonumber(ARGV[3])
if not (ttl and ttl >= 1 and ttl == math.floor(ttl)) then
  return redis.error_reply('ERR ackwise result_put: bad ttl')
end
local old = redis.call('GET', KEYS[1])
if old then
  local ok, record = pcall(cjson.decode, old)
  local state = ok and type(record) == 'table' and record['state'] or nil
  if state == 'succeeded' then
    return 0
  end
  if ARGV[2] == 'started' and (state == 'failed' or state == 'dead') then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('PUBLISH', KEYS[1], ARGV[2])
return 1
