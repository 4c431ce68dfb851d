-- release: delete the lock key only if it holds exactly our value, and tell
-- the waiter whose turn it is on its release channel. If our value is not
-- there, leave a tombstone for it: an acquire of ours that is still on its
-- way (sent to a node that stalled, and given up on) then finds it and does
-- not take the key, whichever of the two requests the node runs first.
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  tombstone of our value, p{name}:gone:<value>
-- KEYS[3]  waiters' queue, p{name}:waiters (see acquire.lua)
-- ARGV[1]  our lock value; the key holds "<value>:<token>" (see acquire.lua)
-- ARGV[2]  release channel, p{name}:released; each waiter listens on its
--          own, p{name}:released:<waiter id>
-- ARGV[3]  tombstone TTL in milliseconds (relative: PX)
-- ARGV[4]  how many queued waiters to try at most (see below); 1 where
--          PUBLISH cannot count the listeners (a Redis Cluster, whose
--          subscribers may be connected to another node)
--
-- The longest-waiting waiter is taken off the queue and told on its own
-- channel (the message is its id): only it wakes and attempts, and only its
-- connection hears of it, instead of every waiter at once. A waiter joins
-- the queue only while it listens, so a message that reaches nobody (PUBLISH
-- returns 0) names a waiter that has died or lost its connection (which
-- wakes it to attempt and queue again): the release moves on to the next,
-- up to ARGV[4] waiters. With the queue empty nothing is published.
--
-- Reply, an array of integers:
--   { 1, n, s}  released; n clients (pub/sub connections of waiters) received
--               the message naming the next waiter (0 if none did), after s
--               waiters nobody listened for were taken off the queue
--   { 0}        absent: the key expired or was deleted
--   {-1}        held by another value: not ours, left untouched
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if cur and string.sub(cur, 1, #mine) == mine then
  redis.call('DEL', KEYS[1])
  local heard, skipped = 0, 0
  for _ = 1, tonumber(ARGV[4]) do
    local next = redis.call('ZPOPMIN', KEYS[3])
    if not next[1] then
      break
    end
    heard = redis.call('PUBLISH', ARGV[2] .. ':' .. next[1], next[1])
    if heard > 0 then
      break
    end
    skipped = skipped + 1
  end
  return {1, heard, skipped}
end
redis.call('SET', KEYS[2], '', 'PX', ARGV[3])
if cur then
  return {-1}
end
return {0}
