-- sem_leave: take a waiter that gave up off the queue, and a grant made to
-- it that it did not take in; if it was first, or a grant came back, tell
-- the waiters that now fit (a large request at the head no longer keeps
-- smaller ones behind it out).
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  "<member>:<value>:<nonce>:<expiry ms>:<tomb ms>": the waiter's
--          id; its process's lease value and its call's nonce (see
--          sem_wake.lua), or "" and ""; the expiry, for the leases of
--          waiters granted here; how long the tombstone of a lease ended
--          here lasts (see bury in sem_wake.lua).
--
-- (publish and lua/sem_wake.lua are put before this one: see backend.go.)
--
-- Reply: {1}
local member, value, nonce, exp, tomb = string.match(ARGV[1], '^([^:]+):([^:]*):([^:]*):(%d+):(%d+)$')
if not member then
  return redis.error_reply('ERR netlock sem_leave: malformed argument ' .. ARGV[1])
end
exp, tomb = tonumber(exp), tonumber(tomb)
local no = noWake(K)
if no then
  return no
end
local head = redis.call('ZRANGE', K.queue, 0, 0)
redis.call('ZREM', K.queue, member)
redis.call('ZREM', K.places, member)
redis.call('HDEL', K.wants, member)
local back = false
if value ~= '' and nonce ~= '' then
  local g = grantOf(K, value)
  if g == nonce then
    redis.call('HDEL', K.permits, value .. '#g')
    back = true
    -- A lease made for the grant alone ends with it.
    local f = redis.call('HMGET', K.permits, value, value .. '#s')
    if tonumber(f[1] or '0') == 0 then
      bury(K, value, tonumber(f[2] or '0'), tomb)
    end
  end
end
if head[1] == member or back then
  local now = servertime()
  purge(K, now)
  wake(K, now, tonumber(redis.call('HGET', K.permits, '#size') or '0') - used(K), exp)
end
tidy(K)
return {1}
