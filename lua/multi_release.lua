-- multi_release: release.lua for each of a MultiMutex's names: delete each
-- lock key that holds exactly our value and give the turn to its next
-- waiter (handOn); leave a tombstone for each that does not, so that a late
-- acquire of ours finds it.
--
-- KEYS     as multi_acquire.lua's: n lock keys, n waiters' queues, n
--          tombstones, and n fence counters when fencing is on
-- ARGV[1]  our lock value
-- ARGV[2]  tombstone TTL in milliseconds
-- ARGV[3]  how many queued waiters to try at most, per name (see release.lua)
-- ARGV[4]  n
--
-- Reply, an array of integers:
--   { 1, n, g, s}  every name released; n clients heard of a waiter's turn,
--                  g is 1 if a waiter was granted a lock, s waiters nobody
--                  listened for were skipped (summed over the names)
--   { 0}           some name's key expired or was deleted (the others that
--                  held our value are released)
--   {-1}           some name's key holds another value: left untouched
--
-- handOn is in handon.lua, prepended to this script.
local n = tonumber(ARGV[4])
local fenced = #KEYS > 3 * n
local mine = ARGV[1] .. ':'
-- A user who may not tell a name's waiters is refused before anything is
-- done, if one is queued (see lua/nopublish.lua).
for i = 1, n do
  local no = noPublish(KEYS[i] .. ':released:*')
  if no and redis.call('EXISTS', KEYS[n + i]) == 1 then
    return no
  end
end
local released, other, heard, granted, skipped = 0, 0, 0, 0, 0
for i = 1, n do
  local cur = redis.call('GET', KEYS[i])
  if cur and string.sub(cur, 1, #mine) == mine then
    local fence = fenced and KEYS[3 * n + i] or nil
    local h, g, s = handOn(KEYS[i], KEYS[n + i], fence, KEYS[i] .. ':released', tonumber(ARGV[3]), true)
    released = released + 1
    heard, granted, skipped = heard + h, math.max(granted, g), skipped + s
  else
    redis.call('SET', KEYS[2 * n + i], '', 'PX', ARGV[2])
    if cur then
      other = other + 1
    end
  end
end
if released == n then
  return {1, heard, granted, skipped}
end
if other > 0 then
  return {-1}
end
return {0}
