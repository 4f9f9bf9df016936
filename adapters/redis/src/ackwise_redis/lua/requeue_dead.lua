-- ackwise requeue_dead: move dead letters back to ready as new messages (count reset).
--
-- Key schema (one queue, hash tag {<prefix>:<queue>}):
--   KEYS[1] dead       ZSET  <seq> -> dead_at
--   KEYS[2] dead_info  HASH  <seq> -> "<attempt>|<reason>"
--   KEYS[3] dead_ids   HASH  <message id> -> "<seq> <seq> ..."
--   KEYS[4] data       HASH  <seq> -> "<len(id)>:<id><body>"
--   KEYS[5] ready      LIST  "<seq>#<n>"
--   KEYS[6] seq        STRING counter
--   KEYS[7] notify     LIST  wake-up tokens for idle receivers
-- ARGV[1..] message ids
--
-- Atomic: each dead letter leaves the store and enters the queue in the same step, under a
-- new seq (fresh enqueue time, delivery count 0), so a replay run twice replays it once.
-- Returns how many messages moved.
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix = string.format('%x-', ms)
local moved = 0
for i = 1, #ARGV do
  local seqs = redis.call('HGET', KEYS[3], ARGV[i])
  if seqs then
    redis.call('HDEL', KEYS[3], ARGV[i])
    for seq in string.gmatch(seqs, '%S+') do
      if redis.call('ZREM', KEYS[1], seq) == 1 then
        redis.call('HDEL', KEYS[2], seq)
        local body = redis.call('HGET', KEYS[4], seq)
        redis.call('HDEL', KEYS[4], seq)
        if body then
          local new = prefix .. string.format('%x', redis.call('INCR', KEYS[6]))
          redis.call('HSET', KEYS[4], new, body)
          redis.call('RPUSH', KEYS[5], new .. '#0')
          moved = moved + 1
        end
      end
    end
  end
end
if moved > 0 and redis.call('LLEN', KEYS[7]) == 0 then redis.call('RPUSH', KEYS[7], '1') end
return moved
