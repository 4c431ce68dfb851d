-- sem_release: give back permits of a process's lease (all of them end the
-- lease), and tell the waiters that now fit.
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  "<value>:<total>:<seq>:<fold>:<nonce>:<expiry ms>:<tomb ms>":
--          the lease's value; the permits it keeps (0 ends it); the call's sequence
--          number; the nonce of a grant taken in, to fold into the count,
--          or ""; the nonce of the process's waiting call, whose grant
--          stays, or "" (see sem_acquire.lua); the expiry, for the leases
--          of waiters granted here (see sem_wake.lua); how long the
--          value's tombstone lasts (see bury in sem_wake.lua), left when
--          the lease ends here or is found gone.
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
local value, total, seq, fold, nonce, exp, tomb = string.match(ARGV[1], '^([^:]+):(%d+):(%d+):([^:]*):([^:]*):(%d+):(%d+)$')
if not value then
  return redis.error_reply('ERR netlock sem_release: malformed argument ' .. ARGV[1])
end
total, seq, exp, tomb = tonumber(total), tonumber(seq), tonumber(exp), tonumber(tomb)
local no = noWake(K)
if no then
  return no
end

-- Keys of another type fail here, before anything is written.
local size = tonumber(redis.call('HGET', K.permits, '#size') or '0')
local now = servertime()
purge(K, now)
local reply = {0, 0}
local f = redis.call('HMGET', K.permits, value, value .. '#s')
if tonumber(f[2] or '0') >= seq then
  return {-2, 0}
end
if redis.call('ZSCORE', K.leases, value) then
  -- Never above what the lease has, its grant folded in: a count is
  -- raised by sem_acquire only, within the size.
  local has = tonumber(f[1] or '0')
  local g, n = grantOf(K, value)
  if g and g == fold then
    redis.call('HDEL', K.permits, value .. '#g')
    has = has + n
  elseif g and g ~= nonce then
    -- A grant to a call that gave up, whose leave did not reach us.
    redis.call('HDEL', K.permits, value .. '#g')
  end
  local left = math.min(total, has)
  if left == 0 then
    -- A grant not yet taken in goes with the lease: its waiter asks again.
    bury(K, value, seq, tomb)
  else
    redis.call('HSET', K.permits, value, left, value .. '#s', seq)
  end
  reply = {1, left}
elseif buried(K, seq) then
  return {-2, 0}
else
  redis.call('SET', K.gone, seq, 'PX', tomb)
end
wake(K, now, size - used(K), exp)
tidy(K)
return reply
