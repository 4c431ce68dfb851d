-- sem_release: give back permits of a process's lease (all of them end the
-- lease), and tell the waiters that now fit.
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  "<value>:<total>:<seq>": the lease's value; the permits it keeps
--          (0 ends it); the call's sequence number (see sem_acquire.lua).
--          The whole count, not a difference: a call whose reply was lost
--          can be sent again; and one that arrives after a later call of
--          the process changes nothing.
--
-- (publish and lua/sem_wake.lua are put before this one: see backend.go.)
--
-- Reply:
--   {1, left}  released; left: the permits the lease still holds (0: it
--              ended)
--   {0, 0}     the lease is gone: it expired (its permits came back then)
--   {-2, 0}    a later call of the process was applied: this one is late
local value, total, seq = string.match(ARGV[1], '^([^:]+):(%d+):(%d+)$')
if not value then
  return redis.error_reply('ERR netlock sem_release: malformed argument ' .. ARGV[1])
end
total, seq = tonumber(total), tonumber(seq)

-- Keys of another type fail here, before anything is written.
local size = tonumber(redis.call('HGET', K.permits, '#size') or '0')
local now = servertime()
purge(K, now)
local reply = {0, 0}
local f = redis.call('HMGET', K.permits, value, value .. '#s')
if tonumber(f[2] or '0') >= seq then
  return {-2, 0}
end
if f[1] and redis.call('ZSCORE', K.leases, value) then
  -- Never above what the lease has: a count is raised by sem_acquire only,
  -- within the size.
  local left = math.min(total, tonumber(f[1]))
  if left == 0 then
    redis.call('HDEL', K.permits, value, value .. '#s')
    redis.call('ZREM', K.leases, value)
  else
    redis.call('HSET', K.permits, value, left, value .. '#s', seq)
  end
  reply = {1, left}
end
wake(K, now, size - used(K))
tidy(K)
return reply
