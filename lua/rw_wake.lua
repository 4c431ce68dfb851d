-- rw_wake: not a script of its own. Its function is prepended to
-- rw_release.lua and rw_leave.lua (see backend.go), after the line that
-- sets publish.
--
-- wake lets in the waiters of a NetRWMutex who may get in now that no
-- writer holds (live: whether a read lease is still live): the readers
-- queued ahead of every writer, or else, once no lease is live, the first
-- writer alone.
--
-- A waiter whose member is "<id>+<expiry ms>+<nonce>+<holder>" (one backend, whose
-- PUBLISH counts the listeners: see NetMutex.grants) is granted its hold
-- here, without a round trip of its own, and told on its own channel:
--   a reader's process, p{name}:rw:released:r:<id>, "g:<nonce>:1:<w>": its
--     read lease "<nonce>.1" ("<nonce>.1+<holder>" where its member names a
--     holder, see rw_acquire.lua) is in the leases (score: now + its expiry); w
--     is 1 if a writer still waits (the process lets no more readers share
--     the lease);
--   a writer, p{name}:rw:released:w:<id>, "g:<nonce>:<n>:<token>": the
--     writer key holds "<nonce>.<n>:<token>:<holder>", with its expiry as TTL and
--     the next fencing token (n is the token, or the server's time in µs
--     without fencing), as rw_acquire.lua would have set it.
-- Its member and its place leave the queue. (The waiter's own next attempt
-- puts them back, under the same nonce, only if it finds no grant to
-- adopt; a late message of a grant to that nonce is still safe to take:
-- the waiter takes one only while the validity counted from its first
-- attempt lasts, and every grant to the nonce lives longer, from later.)
-- The nonce is fresh for each call. A grant that
-- nobody heard (PUBLISH counts 0: the waiter's process died, or its
-- connection dropped, which wakes it to attempt) is undone, and the next
-- waiter looked at. A grant heard but never adopted (the waiter gave up:
-- rw_leave.lua releases it; or died meanwhile) expires with its TTL.
--
-- A waiter whose member is "<id>" (a quorum's) is told to attempt: readers
-- on one channel, p{name}:rw:released:r, with "u", all at once; a writer on
-- its own, p{name}:rw:released:w:<id>, with its id.
--
-- It returns how many clients heard, and 1 if a hold was granted (0 if
-- not).
local function wake(writer, writers, readers, leases, fence, live)
  local heard, granted = 0, 0
  -- A bounded number of rounds: each skips at least one waiter nobody
  -- listens for (the others wait for their next attempt, at the latest an
  -- expiry away).
  for _ = 1, 8 do
    local w = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
    local r = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
    local t = redis.call('TIME')
    if r[1] and (not w[1] or tonumber(r[2]) < tonumber(w[2]) or (r[2] == w[2] and r[1] < w[1])) then
      -- The readers ahead of the first writer (rw_acquire.lua's order:
      -- arrival, then member).
      local ahead
      if w[1] then
        ahead = redis.call('ZRANGEBYSCORE', readers, '-inf', w[2], 'WITHSCORES')
      else
        ahead = redis.call('ZRANGE', readers, 0, -1, 'WITHSCORES')
      end
      local now = t[1] * 1000 + math.floor(t[2] / 1000)
      local wflag = 0
      if w[1] then
        wflag = 1
      end
      local tell, dead = false, false
      for i = 1, #ahead, 2 do
        local m = ahead[i]
        if w[1] and ahead[i + 1] == w[2] and m >= w[1] then
          break
        end
        local id, exp, nonce, holder = string.match(m, '^([^+]*)%+?(%d*)%+?([^+]*)%+?(.*)$')
        if exp == '' then
          tell = true
        else
          local lease = nonce .. '.1'
          if holder ~= '' then
            lease = lease .. '+' .. holder
          end
          redis.call('ZREM', readers, m)
          redis.call('ZREM', leases, 'q:' .. m)
          redis.call('ZADD', leases, now + tonumber(exp), lease)
          if redis.call('PTTL', leases) < tonumber(exp) then
            redis.call('PEXPIRE', leases, exp)
          end
          local n = redis.call(publish, writer .. ':released:r:' .. id, 'g:' .. nonce .. ':1:' .. wflag)
          if n > 0 then
            heard, granted = heard + n, 1
          else
            redis.call('ZREM', leases, lease)
            dead = true
          end
        end
      end
      if tell then
        heard = heard + redis.call(publish, writer .. ':released:r', 'u')
      end
      if not dead or granted == 1 or tell then
        return heard, granted
      end
      -- Every reader let in was dead: look again.
    elseif w[1] and not live then
      local id, exp, nonce, holder = string.match(w[1], '^([^+]*)%+?(%d*)%+?([^+]*)%+?(.*)$')
      if exp == '' then
        return heard + redis.call(publish, writer .. ':released:w:' .. w[1], w[1]), granted
      end
      redis.call('ZREM', writers, w[1])
      redis.call('ZREM', leases, 'q:' .. w[1])
      redis.call('ZREMRANGEBYSCORE', leases, 0, t[1] * 1000 + math.floor(t[2] / 1000)) -- expired leases
      local token, n = 0, 0
      if fence then
        token = redis.call('INCR', fence)
        n = token
      else
        n = t[1] * 1000000 + t[2]
      end
      redis.call('SET', writer, nonce .. '.' .. string.format('%d', n) .. ':' .. string.format('%d', token) .. ':' .. holder, 'PX', exp)
      local h = redis.call(publish, writer .. ':released:w:' .. id, 'g:' .. nonce .. ':' .. string.format('%d', n) .. ':' .. string.format('%d', token))
      if h > 0 then
        return heard + h, 1
      end
      redis.call('DEL', writer)
      -- Tell the processes whose readers stopped sharing their leases for
      -- this writer to look again (see NetRWMutex).
      redis.call(publish, writer .. ':joined', 'l')
    else
      return heard, granted
    end
  end
  return heard, granted
end

-- noWake returns, if a user who may not tell writer's waiters (see
-- lua/nopublish.lua) would tell one, the error to refuse the call with
-- before anything is written; nil otherwise. wake tells only while a
-- waiter is queued.
local function noWake(writer, writers, readers)
  local no = noPublish(writer .. ':released:*') or noPublish(writer .. ':joined')
  if no and (redis.call('EXISTS', writers) == 1 or redis.call('EXISTS', readers) == 1) then
    return no
  end
  return nil
end
