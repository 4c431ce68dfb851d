-- sem_acquire: take permits of a Semaphore for a process's lease (a new
-- lease, or more permits on the one it holds); or, for a waiter, keep its
-- place in the queue.
--
-- KEYS[1]  leases, p{name}:sem: a sorted set of the processes' leases
--          (member: the lease's value, score: its deadline in server ms)
-- KEYS[2]  permits, p{name}:sem:permits: a hash of each lease's permits
--          (field: its value), and the semaphore's size (field "#size")
-- KEYS[3]  queue, p{name}:sem:queue: waiter ids by arrival
-- KEYS[4]  places, p{name}:sem:places: each waiter's place deadline (server
--          ms), so that a waiter whose process died stops keeping others out
-- KEYS[5]  wants, p{name}:sem:wants: the permits each waiter asks for
-- ARGV[1]  "<value>:<total>:<n>:<size>:<expiry ms>:<member>:<flags>:<place ms>:<arrival>":
--          the lease's value; the permits the lease is to hold if granted
--          (the whole count, not a difference: a call whose reply was lost
--          can be sent again, and finds itself granted already); the
--          permits asked for (total less what the process holds); the size every
--          process must agree on; the lease's expiry; our waiter id (""
--          for TryAcquire); flags "g" if the lease exists already (more
--          permits on it: if it is gone, it was lost), else ""; how long a
--          waiter's place lasts without an attempt renewing it; when the
--          waiter's call began (µs, its own clock), its place in the queue.
--          One argument: Redis refuses more than 10 words from a client
--          not yet authenticated, and a clear NOAUTH is worth keeping.
--
-- (The line that sets publish, PUBLISH or SPUBLISH, and lua/sem_wake.lua
-- are put before this one: see backend.go.)
--
-- The rule is golang.org/x/sync/semaphore's, across every client of the
-- name: n permits are granted when they are free and no waiter came before
-- us (a caller without a place, TryAcquire, comes after every one).
--
-- Reply:
--   { 1, out, 0}   granted: out permits are out now, ours included
--   {-1, out, t}   not now; t: when to look again at the latest (ms): when
--                  the first lease ends, capped at the expiry. A waiter is
--                  queued (or its place kept)
--   {-3, 0, 0}     "g", and our lease is gone: it was lost
--   {-4, size, 0}  the semaphore's holders and waiters use another size
local value, total, _, size, exp, member, flags, placeMS, arrival = string.match(ARGV[1], '^([^:]+):(%d+):(%d+):(%d+):(%d+):([^:]*):([^:]*):(%d+):(%d+)$')
total, size, exp, placeMS, arrival = tonumber(total), tonumber(size), tonumber(exp), tonumber(placeMS), tonumber(arrival)

-- Keys of another type fail here, before anything is written.
local have = redis.call('HGET', K.permits, '#size')
if have and tonumber(have) ~= size then
  return {-4, tonumber(have), 0}
end
local now = servertime()
purge(K, now)
local mine = 0
if redis.call('ZSCORE', K.leases, value) then
  mine = tonumber(redis.call('HGET', K.permits, value) or '0')
elseif string.find(flags, 'g', 1, true) then
  return {-3, 0, 0}
end
local out = used(K)
-- A call sent again whose first sending was granted: need is 0.
local need = math.max(0, total - mine)

-- ahead reports whether a live waiter came before us, taking off the queue
-- the waiters at its head whose places were not renewed in time.
local function ahead()
  while true do
    local h = redis.call('ZRANGE', K.queue, 0, 0, 'WITHSCORES')
    if not h[1] or h[1] == member then
      return false
    end
    local dl = redis.call('ZSCORE', K.places, h[1])
    if dl and tonumber(dl) > now then
      -- An earlier arrival, or the same with a smaller id (the order of
      -- a sorted set).
      local score = tonumber(h[2])
      return member == '' or score < arrival or (score == arrival and h[1] < member)
    end
    redis.call('ZREM', K.queue, h[1])
    redis.call('ZREM', K.places, h[1])
    redis.call('HDEL', K.wants, h[1])
  end
end

if need == 0 or (out + need <= size and not ahead()) then
  redis.call('HSET', K.permits, value, total, '#size', size)
  redis.call('ZADD', K.leases, now + exp, value)
  keep(K.leases, placeMS)
  keep(K.permits, placeMS)
  if member ~= '' and redis.call('ZREM', K.queue, member) == 1 then
    redis.call('ZREM', K.places, member)
    redis.call('HDEL', K.wants, member)
    -- The next in line may fit in what is left.
    wake(K, now, size - out - need)
  end
  return {1, out + need, 0}
end

if member ~= '' then
  -- A waiter attempts about once per expiry: its place is renewed only
  -- when less than half of its time is left (every other attempt).
  local dl = redis.call('ZSCORE', K.places, member)
  if not dl or tonumber(dl) - now < placeMS / 2 then
    -- wants first, then the queue: a key of another type fails before
    -- our place is taken (places was read above).
    redis.call('HSET', K.wants, member, need)
    redis.call('ZADD', K.queue, 'NX', arrival, member)
    redis.call('ZADD', K.places, now + placeMS, member)
    redis.call('HSET', K.permits, '#size', size)
    keep(K.places, placeMS)
    keep(K.queue, placeMS)
    keep(K.wants, placeMS)
    keep(K.permits, placeMS)
  end
end
local t = exp
local first = redis.call('ZRANGE', K.leases, 0, 0, 'WITHSCORES')
if first[2] then
  t = math.max(1, math.min(exp, tonumber(first[2]) - now))
end
return {-1, out, t}
