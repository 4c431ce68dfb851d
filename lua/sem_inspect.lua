-- sem_inspect: read a Semaphore's state on its node, writing nothing.
--
-- KEYS as sem_acquire.lua's.
--
-- Reply: {size, out, leases, waiters, holder...}
--   size     the size its holders and waiters use, 0 when none is recorded
--            (nothing held, nobody waiting)
--   out      the permits out: the live leases' counts and the permits a
--            release set aside for waiters (see sem_wake.lua)
--   leases   the live leases (processes holding permits)
--   waiters  the processes with a live place in the queue
--   holder   for each live lease, in the order of their deadlines, what
--            follows its value's first '+' (its holder, escaped; "" for
--            none), packed (see pack.lua)
--
-- Leases whose deadlines passed, and places not renewed in time, are not
-- counted (the next call that writes takes them off). A key of another type
-- makes a read fail with WRONGTYPE.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local z = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local fields = {'#size'}
for _, v in ipairs(z) do
  fields[#fields + 1] = v
  fields[#fields + 1] = v .. '#g'
end
local f = redis.call('HMGET', KEYS[2], unpack(fields))
local out = 0
for i = 2, #f, 2 do
  out = out + tonumber(f[i] or '0')
  if f[i + 1] then
    out = out + tonumber(string.match(f[i + 1], ':(%d+)$'))
  end
end
redis.call('ZCARD', KEYS[3])
local waiters = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
redis.call('HLEN', KEYS[5])
local reply = {tonumber(f[1] or '0'), out, #z, waiters}
for _, v in ipairs(z) do
  pack(reply, string.match(v, '^[^+]*%+(.*)$') or '')
end
return reply
