-- rw_inspect: read a NetRWMutex's state on one node, writing nothing.
--
-- KEYS[1]  writer key, p{name}:rw (see rw_acquire.lua)
-- KEYS[2]  writers' queue, p{name}:rw:writers
-- KEYS[3]  readers' queue, p{name}:rw:readers
-- KEYS[4]  leases, p{name}:rw:leases: the read leases (positive scores,
--          their deadlines) and the queued waiters' places (negative
--          scores, minus their deadlines)
-- KEYS[5]  fence counter, p{tag}:fence; absent when fencing is off
-- ARGV[1]  the maxmemory policies netlock knows, as inspect.lua's
--
-- Reply, an array of integers:
--   { state, token, pttl, holder, writers, readers, counter, policy,
--     maxmemory, n, ..., leases, lease... }
--   state, token, pttl, holder
--              the writer key's, as holdOf (in readstate.lua, prepended to
--              this script) reads them
--   writers    the writers waiting: members of the writers' queue whose
--              places are live (deadline not passed)
--   readers    the same for the readers' queue (one member per process
--              whose readers wait)
--   counter    the fence counter, 0 if absent (or fencing is off)
--   policy, maxmemory
--              the server's, as memoryOf (readstate.lua) reads them
--   n, ...     state 1: the writer's identity, packed (see pack, in
--              pack.lua, prepended to this script); otherwise 0
--   leases     the live read leases (deadline not passed), then for each,
--              in the order of their deadlines, soonest first:
--                holder  the first 48 bits of the SHA1 of its value, as
--                        for the writer
--                ttl     the time left to its deadline, in ms
--                n, ...  what follows its value's first '+' (its holder's
--                        identity, escaped; "" for none), packed
--
-- Leases whose deadlines passed and places not renewed in time are not
-- counted (the next acquire that looks takes them off). A key of another
-- type makes a read fail with WRONGTYPE: the script's error is the node's
-- answer.
local state, token, pttl, holder, who = holdOf(KEYS[1])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)

-- waiting counts the members of queue whose places are live.
local function waiting(queue)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    local dl = redis.call('ZSCORE', KEYS[4], 'q:' .. m)
    if dl and -tonumber(dl) > now then
      n = n + 1
    end
  end
  return n
end

local writers, readers = waiting(KEYS[2]), waiting(KEYS[3])
local counter = 0
if #KEYS > 4 then
  counter = tonumber(redis.call('GET', KEYS[5]) or '0') or 0
end
local policy, maxmemory = memoryOf(ARGV[1])
local reply = pack({state, token, pttl, holder, writers, readers, counter, policy, maxmemory}, who)
local leases = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf', 'WITHSCORES')
reply[#reply + 1] = #leases / 2
for i = 1, #leases, 2 do
  local v = leases[i]
  reply[#reply + 1] = tonumber(string.sub(redis.sha1hex(v), 1, 12), 16)
  reply[#reply + 1] = tonumber(leases[i + 1]) - now
  pack(reply, string.match(v, '^[^+]*%+(.*)$') or '')
end
return reply
