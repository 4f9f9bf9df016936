-- ackwise delete_dead: delete the named dead letters, or all of a queue's.
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] dead       ZSET  <seq> -> dead_at
--   KEYS[2] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[3] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[4] data       HASH  <seq> -> "<len(id)>:<id><body>"
-- ARGV[1] "*": every dead letter; "=": the message ids in ARGV[2..]
--
-- Returns how many dead letters were deleted.
local deleted = 0
if ARGV[1] == '*' then
  local seqs = redis.call('ZRANGE', KEYS[1], 0, -1)
  for i = 1, #seqs, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #seqs) do chunk[#chunk + 1] = seqs[j] end
    redis.call('HDEL', KEYS[4], unpack(chunk))
  end
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
  return #seqs
end
for i = 2, #ARGV do
  local seqs = redis.call('HGET', KEYS[3], ARGV[i])
  if seqs then
    redis.call('HDEL', KEYS[3], ARGV[i])
    for seq in string.gmatch(seqs, '%S+') do
      if redis.call('ZREM', KEYS[1], seq) == 1 then
        redis.call('HDEL', KEYS[2], seq)
        redis.call('HDEL', KEYS[4], seq)
        deleted = deleted + 1
      end
    end
  end
end
return deleted
