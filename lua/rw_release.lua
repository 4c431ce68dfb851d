-- rw_release: end a read lease or the write lock of a NetRWMutex, if it is
-- ours, and wake the waiters it lets in (see wake, in rw_wake.lua). If our
-- value is not there, leave a tombstone for it, as release.lua does: an
-- acquire of ours still on its way then finds it and takes nothing.
--
-- KEYS[1]  writer key, p{name}:rw (rw_acquire.lua)
-- KEYS[2]  tombstone of our value, p{name}:rw:gone:<value>
-- KEYS[3]  writers' queue, p{name}:rw:writers
-- KEYS[4]  readers' queue, p{name}:rw:readers
-- KEYS[5]  leases, p{name}:rw:leases
-- KEYS[6]  fence counter, p{tag}:fence, when fencing is on: a writer
--          granted the lock here takes its token from it (see wake)
-- ARGV[1]  "<mode>:<value>:<tombstone ms>"
--
-- Reply, as release.lua's:
--   { 1, n, g, 0}  released; n clients heard (0 if nobody was woken); g
--                  is 1 if a waiter was granted its hold here (see wake)
--   { 0}           absent: the lease expired, or the key was deleted
--   {-1}           the writer key holds another value: left untouched
local mode, value, tombMS = string.match(ARGV[1], '^([rw]):([^:]+):(%d+)$')
local fence = KEYS[6]
if mode == 'w' then
  local cur = redis.call('GET', KEYS[1])
  local mine = value .. ':'
  if cur and string.sub(cur, 1, #mine) == mine then
    local no = noWake(KEYS[1], KEYS[3], KEYS[4])
    if no then
      return no
    end
    redis.call('DEL', KEYS[1])
    local heard, granted = wake(KEYS[1], KEYS[3], KEYS[4], KEYS[5], fence, false)
    return {1, heard, granted, 0}
  end
  redis.call('SET', KEYS[2], '', 'PX', tombMS)
  if cur then
    return {-1}
  end
  return {0}
end
local s = redis.call('ZSCORE', KEYS[5], value)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if s and tonumber(s) > now then
  -- Only a writer waits for readers: look when one waits, and the last
  -- live lease is gone. A user who may not tell it is refused first (see
  -- lua/nopublish.lua).
  local writing = redis.call('EXISTS', KEYS[3]) == 1
  local no = writing and (noPublish(KEYS[1] .. ':released:*') or noPublish(KEYS[1] .. ':joined'))
  if no then
    return no
  end
  redis.call('ZREM', KEYS[5], value)
  local heard, granted = 0, 0
  if writing and redis.call('ZCOUNT', KEYS[5], now + 1, '+inf') == 0 then
    heard, granted = wake(KEYS[1], KEYS[3], KEYS[4], KEYS[5], fence, false)
  end
  return {1, heard, granted, 0}
end
if s and tonumber(s) > 0 then
  -- Our lease, expired by the server's clock (rw_extend.lua finds it gone
  -- too), though no writer's acquire has taken it off yet: absent.
  redis.call('ZREM', KEYS[5], value)
end
redis.call('SET', KEYS[2], '', 'PX', tombMS)
return {0}
