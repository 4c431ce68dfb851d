-- release: delete the lock key only if it holds exactly our value, and tell
-- the waiter whose turn it is on its release channel. If our value is not
-- there, leave a tombstone for it: an acquire of ours that is still on its
-- way (sent to a node that stalled, and given up on) then finds it and does
-- not take the key, whichever of the two requests the node runs first.
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  tombstone of our value, p{name}:gone:<value>
-- KEYS[3]  waiters' queue, p{name}:waiters (see acquire.lua)
-- KEYS[4]  fence counter, p{tag}:fence (see acquire.lua); absent when fencing is off
-- KEYS[5]  an Election's lock only: its leader's record (see
--          elect_proclaim.lua), whose observers are told that our term
--          ended, on p{name}:elect:changes, with "n:<token>", before the
--          next waiter's turn comes
-- ARGV[1]  our lock value; the key holds "<value>:<token>:<holder>" (see acquire.lua)
-- ARGV[2]  tombstone TTL in milliseconds (relative: PX)
-- ARGV[3]  how many queued waiters to try at most (see handOn); 1 where
--          PUBLISH cannot count the listeners (a Redis Cluster without
--          sharded pub/sub, whose subscribers may be connected to another
--          node)
--
-- Each waiter listens on its own release channel, p{name}:released:<waiter
-- id>, the lock key followed by ":released:" and the id (package keyspace).
--
-- The longest-waiting waiter is taken off the queue and given its turn
-- (see handOn): only it wakes, and only its connection hears of it, instead
-- of every waiter at once. A waiter joins the queue only while it listens.
-- With the queue empty nothing is published. A value whose queue cannot
-- exist (no '+' at its end, see acquire.lua) is only deleted: the common
-- release makes two calls, GET and DEL, and runs before handOn is defined
-- (it is in handon.lua, put in this script where it says so): each EVALSHA
-- runs the whole chunk, and a function defined is a new closure per call.
--
-- Reply, an array of integers:
--   { 1, n, g, s}  released; n clients (pub/sub connections of waiters)
--                  heard of the next waiter's turn (0 if none did); g is 1 if
--                  that waiter was granted the lock here; s waiters nobody
--                  listened for were taken off the queue first
--   { 0}           absent: the key expired or was deleted
--   {-1}           held by another value: not ours, left untouched
--   error NOPERM   a waiter is queued, and this user may not tell it (see
--                  lua/nopublish.lua): nothing done, the hold left as it was
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
local ours = cur and string.sub(cur, 1, #mine) == mine
if not ours then
  redis.call('SET', KEYS[2], '', 'PX', ARGV[2])
  if cur then
    return {-1}
  end
  return {0}
end
-- A value without the queue's mark (43 is '+'; see acquire.lua) has
-- nobody queued behind it.
local queued = string.byte(cur, -1) == 43
if queued then
  -- A waiter may be told: a user who may not is refused before anything
  -- is done (see lua/nopublish.lua), if a waiter is queued.
  local no = noPublish(KEYS[1] .. ':released:*')
  if no and redis.call('EXISTS', KEYS[3]) == 1 then
    return no
  end
end
-- Before the first write: refused, it leaves the hold as it was.
if KEYS[5] then
  redis.call(publish, KEYS[1] .. ':changes', 'n:' .. string.match(cur, '^%d+', #mine + 1))
end
-- Nobody queued: delete it, two calls in all.
if not queued then
  redis.call('DEL', KEYS[1])
  return {1, 0, 0, 0}
end
-- handOn (handon.lua) is defined here.
local heard, granted, skipped = handOn(KEYS[1], KEYS[3], KEYS[4], KEYS[1] .. ':released', tonumber(ARGV[3]), true)
return {1, heard, granted, skipped}
