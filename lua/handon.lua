-- handon: not a script of its own. Its function is prepended to
-- leave.lua and the multi_ scripts, and put in release.lua where it says
-- so, after its common path, which needs none (see backend.go).
-- Before it, backend.go puts the line that sets publish, the command that
-- tells a waiter: 'PUBLISH', or 'SPUBLISH' where the Backend's waiters
-- listen with sharded pub/sub (a Redis Cluster: the channel is in the lock
-- key's slot, and SPUBLISH reaches only that slot's shard, and counts the
-- subscribers of the master it runs on, where those waiters listen).
--
-- handOn gives the turn to the longest-waiting waiter: a member
-- "<id>+<expiry ms>+<nonce>+<holder>" is granted the lock here, in the key
-- it finds "<nonce>.<n>:<token>:<holder>", with the waiter's own holder
-- identity (see acquire.lua) (n is the token, or the server's time in
-- microseconds without fencing), and told so on its channel with
-- "g:<nonce>:<n>:<token>": it holds without a round trip. The value ends
-- with the '+' that says the queue may exist (see acquire.lua): others may
-- still wait behind it. A member "<id>"
-- (a quorum's waiter, or where PUBLISH cannot count the listeners) is told
-- with the message "<id>" and attempts. A member nobody listens for (publish
-- returns 0) is a waiter whose process died, or whose connection dropped
-- (which wakes it to attempt and queue again): its grant is undone and the
-- next is tried, up to tries members. held says the lock key holds a
-- value the caller is releasing: a grant overwrites it (one call less than
-- deleting it first), and it is deleted if no grant is made. It returns the
-- number of clients that heard (0 if none), whether the lock was granted,
-- and how many members were skipped.
local function handOn(lock, queue, fence, channel, tries, held)
  local skipped = 0
  for _ = 1, tries do
    local next = redis.call('ZPOPMIN', queue)
    if not next[1] then
      break
    end
    local id, exp, nonce, holder = string.match(next[1], '^([^+]*)%+?(%d*)%+?([^+]*)%+?(.*)$')
    if exp ~= '' then
      local token, n = 0, 0
      if fence then
        token = redis.call('INCR', fence)
        n = token
      else
        local t = redis.call('TIME')
        n = t[1] * 1000000 + t[2]
      end
      local value = nonce .. '.' .. string.format('%d', n)
      redis.call('SET', lock, value .. ':' .. string.format('%d', token) .. ':' .. holder .. '+', 'PX', exp)
      held = true
      local heard = redis.call(publish, channel .. ':' .. id, 'g:' .. nonce .. ':' .. string.format('%d', n) .. ':' .. string.format('%d', token))
      if heard > 0 then
        return heard, 1, skipped
      end
    else
      local heard = redis.call(publish, channel .. ':' .. id, id)
      if heard > 0 then
        if held then
          redis.call('DEL', lock)
        end
        return heard, 0, skipped
      end
    end
    skipped = skipped + 1
  end
  if held then
    redis.call('DEL', lock)
  end
  return 0, 0, skipped
end
