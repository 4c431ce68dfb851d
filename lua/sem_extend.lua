-- sem_extend: move a process's lease's deadline, if the lease is still
-- held.
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  "<value>:<expiry ms>:<place ms>"
--
-- (publish and lua/sem_wake.lua are put before this one: see backend.go.)
--
-- Reply: {1} extended; {0} the lease is gone (expired: its permits came back,
-- and the waiters that now fit are told).
local value, exp, placeMS = string.match(ARGV[1], '^([^:]+):(%d+):(%d+)$')
if not value then
  return redis.error_reply('ERR netlock sem_extend: malformed argument ' .. ARGV[1])
end
exp, placeMS = tonumber(exp), tonumber(placeMS)

local now = servertime()
local dl = redis.call('ZSCORE', K.leases, value)
if not dl or tonumber(dl) <= now then
  if dl then
    local no = noWake(K)
    if no then
      return no
    end
    purge(K, now)
    wake(K, now, tonumber(redis.call('HGET', K.permits, '#size') or '0') - used(K), exp)
    tidy(K)
  end
  return {0}
end
redis.call('ZADD', K.leases, now + exp, value)
keep(K.leases, placeMS)
keep(K.permits, placeMS)
return {1}
