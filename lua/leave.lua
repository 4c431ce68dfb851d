-- leave: take a waiter that gives up off the waiters' queue, so that no
-- release wakes it in vain; and if a release has named it already (it is no
-- longer queued) while the lock is still free, pass its turn on to the next
-- waiter, as release.lua would have: a turn given to a waiter that gave up
-- is not lost.
--
-- KEYS[1]  waiters' queue, p{name}:waiters (see acquire.lua)
-- KEYS[2]  lock key, p{name}
-- ARGV[1]  the waiter's id
-- ARGV[2]  release channel, p{name}:released (see release.lua)
-- ARGV[3]  how many queued waiters to try at most (see release.lua)
--
-- Reply, an array of integers:
--   {1}        removed from the queue
--   {0, n, s}  it was not queued; n clients heard the turn passed on (0 if
--              none did, or the lock is held), after s waiters nobody
--              listened for were taken off the queue
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  return {1}
end
local heard, skipped = 0, 0
if redis.call('EXISTS', KEYS[2]) == 0 then
  for _ = 1, tonumber(ARGV[3]) do
    local next = redis.call('ZPOPMIN', KEYS[1])
    if not next[1] then
      break
    end
    heard = redis.call('PUBLISH', ARGV[2] .. ':' .. next[1], next[1])
    if heard > 0 then
      break
    end
    skipped = skipped + 1
  end
end
return {0, heard, skipped}
