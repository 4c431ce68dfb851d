-- rw_leave: take a waiter of a NetRWMutex that gives up off its queue, and
-- wake the others: the place it leaves may have kept some of them out (a
-- writer keeps later readers out; a reader, later writers).
--
-- KEYS[1]  writers' queue, p{name}:rw:writers (rw_acquire.lua)
-- KEYS[2]  readers' queue, p{name}:rw:readers
-- KEYS[3]  leases, p{name}:rw:leases (holds the waiter's deadline)
-- KEYS[4]  writer key, p{name}:rw (names the channel)
-- ARGV[1]  the waiter's id
--
-- (The line that sets publish is put before this one: see backend.go.)
--
-- Reply: {1} removed; {0} it was not queued.
local n = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], 'q:' .. ARGV[1])
if n == 0 then
  return {0}
end
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  redis.call(publish, KEYS[4] .. ':released', 'l')
end
return {1}
