-- multi_leave: leave.lua for a MultiMutex that gives up waiting: take its
-- member off every name's waiters' queue. A waiter is queued for one name
-- at most (see multi_acquire.lua): if it was queued nowhere, a release may
-- have given it its turn already, so the turn is passed on for every name
-- that is free, as leave.lua does. A turn given to a waiter that gave up is
-- never lost.
--
-- KEYS[1..n]       lock keys, p{name}
-- KEYS[n+1..2n]    waiters' queues, p{name}:waiters
-- KEYS[2n+1..3n]   fence counters (see multi_acquire.lua); absent when fencing is off
-- ARGV[1]  the waiter's member of the queues
-- ARGV[2]  how many queued waiters to try at most (see release.lua)
-- ARGV[3]  n
--
-- Reply, an array of integers:
--   {1}     removed from a queue
--   {0, n}  it was queued nowhere; n clients heard of a turn passed on
--
-- handOn is in handon.lua, prepended to this script.
local n = tonumber(ARGV[3])
local fenced = #KEYS > 2 * n
local removed = 0
for i = 1, n do
  removed = removed + redis.call('ZREM', KEYS[n + i], ARGV[1])
end
if removed > 0 then
  return {1}
end
-- A user who may not tell a name's waiters is refused before a turn is
-- passed on, if one is queued (see lua/nopublish.lua).
for i = 1, n do
  local no = noPublish(KEYS[i] .. ':released:*')
  if no and redis.call('EXISTS', KEYS[n + i]) == 1 then
    return no
  end
end
local heard = 0
for i = 1, n do
  if not redis.call('GET', KEYS[i]) then
    local fence = fenced and KEYS[2 * n + i] or nil
    local h = handOn(KEYS[i], KEYS[n + i], fence, KEYS[i] .. ':released', tonumber(ARGV[2]), false)
    heard = heard + h
  end
end
return {0, heard}
