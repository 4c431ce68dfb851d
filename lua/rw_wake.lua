-- rw_wake: not a script of its own. Its function is prepended to
-- rw_release.lua and rw_leave.lua (see backend.go), after the line that
-- sets publish.
--
-- wake tells the waiters of a NetRWMutex who may get in now that no writer
-- holds (live: whether a read lease is still live). Readers listen on one
-- channel, p{name}:rw:released:r, and are all told at once if one of them
-- waits ahead of every writer: those ahead of the first writer get in.
-- Otherwise the first writer is told, on its own channel,
-- p{name}:rw:released:w:<id>, once no lease is live: it alone may get in.
-- It returns how many clients heard.
local function wake(writer, writers, readers, live)
  local w = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
  local r = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
  if r[1] and (not w[1] or tonumber(r[2]) < tonumber(w[2])) then
    return redis.call(publish, writer .. ':released:r', 'u')
  end
  if w[1] and not live then
    return redis.call(publish, writer .. ':released:w:' .. w[1], w[1])
  end
  return 0
end
