-- multi_extend: extend.lua for a MultiMutex: reset the TTL of every name's
-- lock key, only if every one holds exactly our value. Never re-creates an
-- absent key, and extends none if one is lost.
--
-- KEYS[1..n]     lock keys, p{name}
-- KEYS[n+1..2n]  waiters' queues, p{name}:waiters
-- ARGV[1]  our lock value
-- ARGV[2]  expiry in milliseconds (relative: PEXPIRE)
-- ARGV[3]  TTL of the waiters' queues in milliseconds, if they exist
--
-- Reply, an array of one integer:
--   { 1}  extended
--   { 0}  some name's key expired or was deleted: nothing extended
--   {-1}  some name's key holds another value: nothing extended
local n = #KEYS / 2
local mine = ARGV[1] .. ':'
for i = 1, n do
  local cur = redis.call('GET', KEYS[i])
  if not cur then
    return {0}
  end
  if string.sub(cur, 1, #mine) ~= mine then
    return {-1}
  end
end
for i = 1, n do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
  redis.call('PEXPIRE', KEYS[n + i], ARGV[3])
end
return {1}
