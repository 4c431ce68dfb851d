-- leave: take a waiter that gives up off the waiters' queue, so that no
-- release wakes it in vain; and if a release has given it its turn already
-- (it is no longer queued), pass the turn on as release.lua does: a lock
-- granted to it is released, and with the lock free the next waiter is
-- given its turn. A turn given to a waiter that gave up is never lost.
--
-- KEYS[1]  waiters' queue, p{name}:waiters (see acquire.lua)
-- KEYS[2]  lock key, p{name}
-- KEYS[3]  fence counter, p{tag}:fence (see acquire.lua); absent when fencing is off
-- ARGV[1]  the waiter's member of the queue (see acquire.lua)
-- ARGV[2]  how many queued waiters to try at most (see release.lua)
--
-- Reply, an array of integers:
--   {1}           removed from the queue
--   {0, n, g, s}  it was not queued; n clients heard of the next waiter's
--                 turn (0 if none did, or the lock is held by another), g and
--                 s as release.lua's
--
-- handOn is in handon.lua, prepended to this script.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  return {1}
end
local cur = redis.call('GET', KEYS[2])
local nonce = string.match(ARGV[1], '^[^+]*%+%d*%+([^+]*)') or ''
local ours = cur and nonce ~= '' and string.sub(cur, 1, #nonce + 1) == nonce .. '.'
if cur and not ours then
  return {0, 0, 0, 0}
end
-- Free, or granted to us: ours to release. A user who may not tell the
-- next waiter is refused first (see lua/nopublish.lua), if one is queued.
local no = noPublish(KEYS[2] .. ':released:*')
if no and redis.call('EXISTS', KEYS[1]) == 1 then
  return no
end
local heard, granted, skipped = handOn(KEYS[2], KEYS[1], KEYS[3], KEYS[2] .. ':released', tonumber(ARGV[2]), ours)
return {0, heard, granted, skipped}
