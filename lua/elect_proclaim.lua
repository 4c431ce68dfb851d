-- elect_proclaim: record the value of an Election's leader, and tell every
-- observer. Only the holder of the election's lock may: the lock is a
-- NetMutex's (acquire.lua), whose fencing token is the leader's term.
--
-- KEYS[1]  the election's lock key, p{name}:elect; it holds "<value>:<token>:<holder>"
--          (see acquire.lua)
-- KEYS[2]  the leader's record, p{name}:elect:leader: a hash of term, rev
--          and value
-- ARGV[1]  our lock value
-- ARGV[2]  the revision of this value within the term: 1 for the value the
--          leader campaigned with, one more for each Proclaim; proposed by
--          the leader, so that every node of a quorum numbers a value alike
-- ARGV[3]  the record's TTL in milliseconds (relative: PEXPIRE); extend.lua
--          renews it while the lock is held
-- ARGV[4]  the value
--
-- The change is told on p{name}:elect:changes (the lock key followed by
-- ":changes") as "l:<term>:<rev>:<pttl>:<value>", pttl the lock's remaining
-- TTL in ms. A revision below the one recorded for the same term (a retry
-- of an earlier Proclaim, arriving late) writes and tells nothing. A user
-- who may not publish on the channel (see lua/nopublish.lua) gets an error
-- NOPERM, and nothing is written.
-- (publish is set by a first line, see handon.lua: PUBLISH, or SPUBLISH
-- where observers listen with sharded pub/sub.)
--
-- Reply, an array of integers:
--   { 1, term, pttl}  recorded (or a later revision was already)
--   { 0}              absent: the lock expired or was deleted
--   {-1}              the lock holds another value: not ours to proclaim
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if not cur then
  return {0}
end
if string.sub(cur, 1, #mine) ~= mine then
  return {-1}
end
local term = string.match(cur, '^%d+', #mine + 1)
local pttl = redis.call('PTTL', KEYS[1])
local had = redis.call('HMGET', KEYS[2], 'term', 'rev')
if had[1] == term and tonumber(had[2] or '0') > tonumber(ARGV[2]) then
  return {1, tonumber(term), pttl}
end
local no = noPublish(KEYS[1] .. ':changes')
if no then
  return no
end
redis.call('HSET', KEYS[2], 'term', term, 'rev', ARGV[2], 'value', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call(publish, KEYS[1] .. ':changes', 'l:' .. term .. ':' .. ARGV[2] .. ':' .. string.format('%d', pttl) .. ':' .. ARGV[4])
return {1, tonumber(term), pttl}
