-- set: write a value only if the writer's token is at least the highest
-- recorded for the key, and record the token. Prepended with record.lua.
--
-- KEYS[1]  the fenced key, a hash (see record.lua)
-- ARGV[1]  the token, a decimal uint64 without leading zeros, above 0
-- ARGV[2]  the value, any bytes
--
-- Reply, an array of integers:
--   { 1}             written: the value is ARGV[2], the token ARGV[1]
--   { 0, high, low}  stale: the recorded token, high*1e9 + low, is above
--                    ARGV[1]; nothing changed
--   {-1}             the key holds another type than a hash; nothing changed
--   {-2}             the key holds a hash that is not a fenced value;
--                    nothing changed
local t, other = recorded(KEYS[1])
if t == nil then
  return other
end
if t and below(ARGV[1], t) then
  return stale(t)
end
redis.call('HSET', KEYS[1], valueField, ARGV[2], tokenField, ARGV[1])
return {1}
