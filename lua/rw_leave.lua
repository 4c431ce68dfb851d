-- rw_leave: take a waiter of a NetRWMutex that gives up off its queue, and
-- wake the waiters its place may have kept out (a writer keeps later
-- readers out; a reader, later writers): see wake, in rw_wake.lua. A
-- writer that leaves is also told on p{name}:rw:joined, with "l". A waiter
-- no longer queued may have been granted its hold by a release (see wake):
-- the grant is released, and the waiters it kept out are woken.
--
-- KEYS[1]  writers' queue, p{name}:rw:writers (rw_acquire.lua)
-- KEYS[2]  readers' queue, p{name}:rw:readers
-- KEYS[3]  leases, p{name}:rw:leases (holds the waiter's deadline)
-- KEYS[4]  writer key, p{name}:rw
-- KEYS[5]  fence counter, p{tag}:fence, when fencing is on (see wake)
-- ARGV[1]  the waiter's member
--
-- Reply: {1, n} removed, n clients heard; {2, n} its grant released, n
-- clients heard; {0} it was neither queued nor granted.
local fence = KEYS[5]
-- A user who may not tell the waiters is refused before anything is
-- written, if one is queued (see lua/nopublish.lua): the leaving waiter
-- itself, when it is.
local no = noWake(KEYS[4], KEYS[1], KEYS[2])
if no then
  return no
end
local writer = redis.call('ZREM', KEYS[1], ARGV[1])
local n = writer + redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], 'q:' .. ARGV[1])
local reply = 1
if n == 0 then
  local nonce, holder = string.match(ARGV[1], '^[^+]*%+%d*%+([^+]*)%+?(.*)$')
  nonce = nonce or ''
  if nonce == '' then
    return {0}
  end
  local cur = redis.call('GET', KEYS[4])
  if cur and string.sub(cur, 1, #nonce + 1) == nonce .. '.' then
    redis.call('DEL', KEYS[4])
  elseif redis.call('ZREM', KEYS[3], nonce .. '.1' .. (holder ~= '' and '+' .. holder or '')) == 0 then
    return {0}
  end
  reply = 2
end
if writer == 1 then
  -- Tell the processes whose readers stopped sharing their leases for
  -- this writer to look again (see NetRWMutex).
  redis.call(publish, KEYS[4] .. ':joined', 'l')
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {reply, 0} -- a writer holds: nobody gets in before it leaves
end
local t = redis.call('TIME')
local live = redis.call('ZCOUNT', KEYS[3], t[1] * 1000 + math.floor(t[2] / 1000) + 1, '+inf') > 0
local heard = wake(KEYS[4], KEYS[1], KEYS[2], KEYS[3], fence, live)
return {reply, heard}
