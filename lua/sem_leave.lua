-- sem_leave: take a waiter that gave up off the queue; if it was first,
-- tell the waiters that now fit (a large request at the head no longer
-- keeps smaller ones behind it out).
--
-- KEYS as sem_acquire.lua's.
-- ARGV[1]  the waiter's id
--
-- (publish and lua/sem_wake.lua are put before this one: see backend.go.)
--
-- Reply: {1}
local member = ARGV[1]
local head = redis.call('ZRANGE', K.queue, 0, 0)
redis.call('ZREM', K.queue, member)
redis.call('ZREM', K.places, member)
redis.call('HDEL', K.wants, member)
if head[1] == member then
  local now = servertime()
  purge(K, now)
  wake(K, now, tonumber(redis.call('HGET', K.permits, '#size') or '0') - used(K))
end
tidy(K)
return {1}
