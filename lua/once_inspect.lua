-- once_inspect: read a Once's record on one node, writing nothing.
--
-- KEYS[1]  the Once's record, p{name}:once:done (see once_record.lua)
--
-- Reply, an array of integers:
--   {1, token, ms, pttl, n, packed...}  the record exists: the run's fencing
--        token, when it was recorded (unix ms), its remaining TTL in ms (-1:
--        none, remembered until Forget), then its holder's identity (as
--        written: escaped), n bytes (see pack, in pack.lua, prepended to
--        this script)
--   {0}  there is no record
--   {2}  the record holds a value netlock did not write
--
-- A key of another type makes GET fail with WRONGTYPE.
local rec = redis.call('GET', KEYS[1])
if not rec then
  return {0}
end
local token, ms, holder = string.match(rec, '^(%d+):(%d+):(.*)$')
if not token then
  return {2}
end
return pack({1, tonumber(token), tonumber(ms), redis.call('PTTL', KEYS[1])}, holder)
