-- rw_extend: reset the TTL of our read lease or write lock, only if it is
-- still ours and live. Never re-creates one that lapsed.
--
-- KEYS[1]  writer key, p{name}:rw (rw_acquire.lua)
-- KEYS[2]  leases, p{name}:rw:leases
-- KEYS[3]  writers' queue, p{name}:rw:writers
-- ARGV[1]  "<mode>:<value>:<expiry ms>"
--
-- Reply:
--   { 1, w}  extended; w, for a reader: 1 if a writer waits (the process
--            must stop letting more readers share this lease)
--   { 0}     absent: expired or deleted
--   {-1}     the writer key holds another value: left untouched
local mode, value, exp = string.match(ARGV[1], '^([rw]):([^:]+):(%d+)$')
if mode == 'w' then
  local cur = redis.call('GET', KEYS[1])
  local mine = value .. ':'
  if cur and string.sub(cur, 1, #mine) == mine then
    redis.call('PEXPIRE', KEYS[1], exp)
    return {1, 0}
  end
  if cur then
    return {-1}
  end
  return {0}
end
local s = redis.call('ZSCORE', KEYS[2], value)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if s and tonumber(s) > now then
  redis.call('ZADD', KEYS[2], now + tonumber(exp), value)
  if redis.call('PTTL', KEYS[2]) < tonumber(exp) then
    redis.call('PEXPIRE', KEYS[2], exp)
  end
  return {1, redis.call('EXISTS', KEYS[3])}
end
return {0}
