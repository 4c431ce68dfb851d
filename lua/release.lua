-- release: delete the lock key only if it holds exactly our value, and tell
-- waiters on the release channel.
--
-- KEYS[1]  lock key, p{name}
-- ARGV[1]  our lock value
-- ARGV[2]  release channel, p{name}:released
--
-- Reply, an array of one integer:
--   { 1}  released (and published on the channel)
--   { 0}  absent: the key expired or was deleted
--   {-1}  held by another value: not ours, left untouched
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return {1}
end
if cur then
  return {-1}
end
return {0}
