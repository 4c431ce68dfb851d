-- elect_read: read who leads an Election on one node, writing nothing.
--
-- KEYS[1]  the election's lock key, p{name}:elect (see elect_proclaim.lua)
-- KEYS[2]  the leader's record, p{name}:elect:leader
--
-- A leader leads while the lock holds the token its record names: the
-- record outlives the hold (by a few expiries, see elect_proclaim.lua), so
-- that a node whose leader is gone still says which term ended.
--
-- Reply, an array of integers:
--   {state, term, rev, pttl, n, packed...}
--   state   1: the record's term holds the lock, it leads; 0: nobody leads
--   term    the record's term, 0 if there is none
--   rev     the record's revision (see elect_proclaim.lua), 0 if none
--   pttl    state 1: the lock's remaining TTL in ms; otherwise 0
--   n       state 1: the value's length in bytes, then the value itself
--           (see pack, in pack.lua, prepended to this script); otherwise 0
--
-- A key of another type makes GET or HMGET fail with WRONGTYPE.
local cur = redis.call('GET', KEYS[1])
local rec = redis.call('HMGET', KEYS[2], 'term', 'rev', 'value')
local term, rev = tonumber(rec[1] or '0'), tonumber(rec[2] or '0')
if not cur or not rec[1] or string.match(cur, '^[^:]*:(%d+)') ~= rec[1] then
  return {0, term, rev, 0, 0}
end
local value = rec[3] or ''
return pack({1, term, rev, redis.call('PTTL', KEYS[1])}, value)
