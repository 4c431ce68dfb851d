-- once_record: record that a Once's function ran to success, by the hold
-- that ran it: only while the Once's lock holds our value and token, so that
-- a runner whose hold was lost (expired, taken by the next runner) records
-- nothing.
--
-- KEYS[1]  the Once's lock key, p{name}:once; it holds
--          "<value>:<token>:<holder>", followed by '+' when the waiters' queue
--          may exist (see acquire.lua)
-- KEYS[2]  the Once's record, p{name}:once:done
-- ARGV[1]  our lock value
-- ARGV[2]  our fencing token, as the key holds it ("0" with fencing off)
-- ARGV[3]  how long the record is remembered, in milliseconds (relative:
--          PX); "0": until Forget deletes it
-- ARGV[4]  our holder identity, as the key holds it (escaped, see package
--          keyspace)
-- ARGV[5]  "1" to copy the record to a node whose lock is not ours, once a
--          quorum of the nodes recorded it under our hold (a quorum hold
--          need not be on every node); "0" otherwise
--
-- The record holds "<token>:<unix ms>:<holder>": the run's fencing token,
-- when this node recorded it (by its clock, TIME), and the holder's
-- identity. A record that exists is replaced: the latest run is the one
-- remembered.
--
-- Reply, an array of one integer (release.lua's statuses):
--   { 1}  recorded
--   { 0}  absent: the lock expired or was deleted; nothing recorded
--   {-1}  the lock holds another value or token: not ours; nothing recorded
if ARGV[5] ~= '1' then
  local cur = redis.call('GET', KEYS[1])
  if not cur then
    return {0}
  end
  local mine = ARGV[1] .. ':' .. ARGV[2] .. ':'
  if string.sub(cur, 1, #mine) ~= mine then
    return {-1}
  end
end
local t = redis.call('TIME')
local record = ARGV[2] .. ':' .. t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)) .. ':' .. ARGV[4]
if ARGV[3] == '0' then
  redis.call('SET', KEYS[2], record)
else
  redis.call('SET', KEYS[2], record, 'PX', ARGV[3])
end
return {1}
