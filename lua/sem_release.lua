-- sem_release: give back permits of a process's lease (all of them end the
-- lease), and tell the waiters that now fit.
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  "<value>:<total>": the lease's value; the permits it keeps (0
--          ends it). The whole count, not a difference: a call whose reply
--          was lost can be sent again.
--
-- (publish and lua/sem_wake.lua are put before this one: see backend.go.)
--
-- Reply:
--   {1, left}  released; left: the permits the lease still holds (0: it
--              ended)
--   {0, 0}     the lease is gone: it expired (its permits came back then)
local value, total = string.match(ARGV[1], '^([^:]+):(%d+)$')
total = tonumber(total)

-- Keys of another type fail here, before anything is written.
local size = tonumber(redis.call('HGET', K.permits, '#size') or '0')
local now = servertime()
purge(K, now)
local reply = {0, 0}
local p = redis.call('HGET', K.permits, value)
if p and redis.call('ZSCORE', K.leases, value) then
  local left = math.min(total, tonumber(p))
  if left == 0 then
    redis.call('HDEL', K.permits, value)
    redis.call('ZREM', K.leases, value)
  else
    redis.call('HSET', K.permits, value, left)
  end
  reply = {1, left}
end
wake(K, now, size - used(K))
tidy(K)
return reply
