-- break: end a NetMutex hold by force, for "netlock break". In one step it
-- deletes the lock key, raises the fence counter to at least the broken
-- hold's token (so that the next acquire, which increments it, gets a higher
-- one, and a resource that records fencing tokens refuses the broken
-- holder's writes once the next holder has written), and tells the waiter
-- whose turn it is, as a release does: only that waiter wakes, at once.
--
-- KEYS[1]  lock key, p{name}; it holds "<value>:<token>:<holder>" (the
--          library's lua/acquire.lua)
-- KEYS[2]  waiters' queue, p{name}:waiters: members "<waiter id>", or
--          "<waiter id>+<expiry ms>+<nonce>+<holder>" (lua/acquire.lua)
-- KEYS[3]  fence counter, p{tag}:fence, in KEYS[1]'s hash slot
-- ARGV[1]  the hold to break: the first 12 hex digits of the SHA1 of the
--          key's value (what lua/inspect.lua reports as the holder), or ""
--          for whatever holds the key
-- ARGV[2]  how many queued waiters to try at most: a waiter nobody listens
--          for (its process died) is taken off the queue and the next tried
-- ARGV[3]  the release channel, p{name}:released: a waiter listens on
--          ARGV[3] .. ':' .. <waiter id>
--
-- A waiter is woken with the message "<waiter id>", which it takes as its
-- turn: it attempts at once and finds the key gone. A release's grant
-- ("g:..." with a key written for the waiter, lua/handon.lua) is not made
-- here: the token it would carry is the library's business.
--
-- Everything that can fail with WRONGTYPE is read before anything is
-- written: a script is not rolled back when a command fails.
--
-- Reply, an array of integers:
--   { 1, token, counter, heard, skipped }  broken: token is the broken
--       hold's (0 for a value netlock did not write, or fencing off),
--       counter the fence counter now, heard the clients that heard the
--       next waiter's turn (0 if none did, or no one waits), skipped the
--       waiters nobody listened for, taken off the queue
--   { 0 }         not held: the key expired or was released
--   {-1, token }  held by another hold than ARGV[1]'s: left untouched
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {0}
end
local token = tonumber(string.match(cur, '^[^:]+:(%d+):[^:]*$') or string.match(cur, '^[^:]+:(%d+)$') or '0')
-- The hold is named by its value without the '+' that ends it when the
-- waiters' queue may exist (lua/acquire.lua), as lua/inspect.lua hashes it.
local named = cur
if string.find(cur, '^[^:]+:%d+:[^:]*%+$') then
  named = string.sub(cur, 1, -2)
end
if ARGV[1] ~= '' and string.sub(redis.sha1hex(named), 1, 12) ~= ARGV[1] then
  return {-1, token}
end
local counter = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
local queued = redis.call('ZCARD', KEYS[2])

redis.call('DEL', KEYS[1])
if token > counter then
  counter = token
  redis.call('SET', KEYS[3], string.format('%d', counter))
end
local heard, skipped = 0, 0
if queued > 0 then
  for _ = 1, tonumber(ARGV[2]) do
    local next = redis.call('ZPOPMIN', KEYS[2])
    if not next[1] then
      break
    end
    local id = string.match(next[1], '^[^+]*')
    heard = redis.call('PUBLISH', ARGV[3] .. ':' .. id, id)
    if heard > 0 then
      break
    end
    skipped = skipped + 1
  end
end
return {1, token, counter, heard, skipped}
