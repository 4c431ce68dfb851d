-- leave: take a waiter that gives up off the waiters' queue, so that no
-- release wakes it in vain.
--
-- KEYS[1]  waiters' queue, p{name}:waiters (see acquire.lua)
-- ARGV[1]  the waiter's id
--
-- Reply, an array of one integer: {1} removed, {0} it was not queued.
return {redis.call('ZREM', KEYS[1], ARGV[1])}
