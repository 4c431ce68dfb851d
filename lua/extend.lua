-- extend: reset the lock's TTL only if the key holds exactly our value. Never
-- re-creates an absent key: a hold that lapsed stays lapsed. The waiters'
-- queue is kept as long as the lock is held, so waiters keep their places
-- however long the hold lasts; a value without the '+' that says the queue
-- may exist (see acquire.lua) has none to keep, and its extend makes two
-- calls (GET, PEXPIRE).
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  waiters' queue, p{name}:waiters (see acquire.lua)
-- ARGV[1]  our lock value; the key holds "<value>:<token>:<holder>" (see acquire.lua)
-- ARGV[2]  expiry in milliseconds (relative: PEXPIRE)
-- ARGV[3]  TTL of the waiters' queue in milliseconds, if it exists
-- KEYS[3]  an Election's lock only: its leader's record (see
--          elect_proclaim.lua), kept as long as the lock is held
-- ARGV[4]  with KEYS[3]: the record's TTL in milliseconds
--
-- Reply, an array of one integer:
--   { 1}  extended
--   { 0}  absent: the key expired or was deleted
--   {-1}  held by another value: not ours, left untouched
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if cur and string.sub(cur, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if string.byte(cur, -1) == 43 then -- '+'
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  if KEYS[3] then
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
  end
  return {1}
end
if cur then
  return {-1}
end
return {0}
