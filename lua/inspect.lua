-- inspect: read a lock's state on one node, writing nothing.
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  waiters' queue, p{name}:waiters (see acquire.lua)
-- KEYS[3]  fence counter, p{tag}:fence (see acquire.lua); absent when fencing is off
-- ARGV[1]  the maxmemory policies netlock knows, comma-separated: the reply
--          names the server's policy by its place in this list (package
--          netlock, maxmemoryPolicies)
--
-- Reply, an array of nine integers and the holder's identity:
--   { state, token, pttl, holder, waiters, counter, policy, maxmemory, n, ... }
--   state, token, pttl, holder
--              the lock key's, as holdOf (in readstate.lua, prepended to
--              this script) reads them
--   waiters    the number of waiters in the queue
--   counter    the fence counter, 0 if absent (or fencing is off)
--   policy, maxmemory
--              the server's, as memoryOf (readstate.lua) reads them
--   n          state 1: the length in bytes of the <holder> the key holds (as
--              written: escaped, see acquire.lua), then the holder itself
--              (see pack, in pack.lua, prepended to this script); otherwise 0
--
-- A key of another type makes GET, ZCARD or the counter's GET fail with
-- WRONGTYPE: the script's error is the node's answer. GET and ZCARD count as
-- an access for an LRU or LFU eviction policy, as any read does; nothing is
-- written.
local state, token, pttl, holder, who = holdOf(KEYS[1])
local waiters = redis.call('ZCARD', KEYS[2])
local counter = 0
if #KEYS > 2 then
  counter = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
end
local policy, maxmemory = memoryOf(ARGV[1])
return pack({state, token, pttl, holder, waiters, counter, policy, maxmemory}, who)
