-- sem_acquire: take permits of a Semaphore for a process's lease (a new
-- lease, or more permits on the one it holds), for the first waiters of
-- the process at once; or, for a waiter, keep its place in the queue.
--
-- KEYS[1]  leases, p{name}:sem: a sorted set of the processes' leases
--          (member: the lease's value, score: its deadline in server ms)
-- KEYS[2]  permits, p{name}:sem:permits: a hash of each lease's permits
--          (field: its value), of the sequence number of the last call
--          that set them (field: "<value>#s"), and of the semaphore's size
--          (field "#size")
-- KEYS[3]  queue, p{name}:sem:queue: waiter ids by arrival
-- KEYS[4]  places, p{name}:sem:places: each waiter's place deadline (server
--          ms), so that a waiter whose process died stops keeping others out
-- KEYS[5]  wants, p{name}:sem:wants: the permits each waiter asks for
-- KEYS[6]  our value's tombstone, p{name}:sem:gone:<value>: the sequence
--          number of the call that ended its lease, or found it gone (see
--          bury in sem_wake.lua)
-- ARGV[1]  "<value>:<base>:<seq>:<size>:<expiry ms>:<member>:<flags>:<place ms>:<tomb ms>:<fold>:<nonce>:<batch>":
--          the lease's value; the permits the process holds on it (0 for
--          a new lease); the call's sequence number, which increases with
--          every call of the process that sets a count; the size every
--          process must agree on; the lease's expiry; our waiter id (""
--          for TryAcquire); flags: "g" if the lease exists already (more
--          permits on it: if it is gone, it was lost), "w" if the waiter's
--          entry changed since its last attempt (see below); how long a
--          waiter's place lasts without an attempt renewing it; how long
--          the value's tombstone lasts; the nonce of a grant the process
--          has taken in (adopted: counted in base), to fold into the
--          count, or ""; the nonce of this waiter's call,
--          under which a release may grant it (see sem_wake.lua), or ""
--          when none may; the process's first waiters, "<n>@<arrival>,...",
--          each asking for n permits, in their order, with when its call
--          began (µs, the process's clock): the first's arrival is the
--          process's place in the queue. One argument: Redis refuses more
--          than 10 words from a client not yet authenticated, and a clear
--          NOAUTH is worth keeping.
--
-- (The line that sets publish, PUBLISH or SPUBLISH, and lua/sem_wake.lua
-- are put before this one: see backend.go.)
--
-- The rule is golang.org/x/sync/semaphore's, across every client of the
-- name: n permits are granted when they are free and no waiter came before
-- (a caller without a place, TryAcquire, comes after every one). The first
-- waiter of the batch is granted by it, and each next one while it fits and
-- no other process's waiter arrived before it: the process's waiters get in
-- together, in one call, in the order of every waiter's arrival.
--
-- The count set is the whole count (base and the permits granted), never a
-- difference, and a call whose sequence number is not above the last one
-- applied changes nothing: a call sent again after its reply was lost finds
-- what its first sending was granted (the first k of the batch, told by
-- the count), and a call that arrives after a later one cannot undo it,
-- nor make the value a lease again once a later call ended it (its
-- tombstone).
--
-- Reply:
--   { 1, k, 0}     granted to the first k of the batch (k >= 1)
--   {-1, 0, t}     not now; t: when to look again at the latest (ms): when
--                  the first lease ends, capped at the expiry. A waiter is
--                  queued (or its place kept)
--   {-2, 0, 0}     a later call of the process was applied: this one is late
--   {-3, 0, 0}     "g", and our lease is gone: it was lost
--   {-4, size, 0}  the semaphore's holders and waiters use another size
local value, base, seq, size, exp, member, flags, placeMS, tomb, fold, nonce, batch = string.match(ARGV[1], '^([^:]+):(%d+):(%d+):(%d+):(%d+):([^:]*):([^:]*):(%d+):(%d+):([^:]*):([^:]*):([%d@,]+)$')
if not value then
  return redis.error_reply('ERR netlock sem_acquire: malformed argument ' .. ARGV[1])
end
base, seq, size, exp, placeMS, tomb = tonumber(base), tonumber(seq), tonumber(size), tonumber(exp), tonumber(placeMS), tonumber(tomb)
local ns, arrivals = {}, {}
for n, a in string.gmatch(batch, '(%d+)@(%d+)') do
  ns[#ns + 1] = tonumber(n)
  arrivals[#arrivals + 1] = tonumber(a)
end
local no = noWake(K)
if no then
  return no
end

-- Keys of another type fail in survey, before anything is written.
local now = servertime()
local S = survey(K, now, value)
if S.size and S.size ~= size then
  return {-4, S.size, 0}
end
local out = S.out
local mine = -1 -- no lease
-- granted: the first waiter was granted by a release, under its nonce,
-- and the permits wait beside the count (see sem_wake.lua). dropped: a
-- grant to a call that gave up, whose leave did not reach us.
local granted, dropped = false, false
if S.live then
  if S.seq >= seq then
    return {-2, 0, 0}
  end
  mine = S.mine
  if S.g then
    -- Folded into the count set below (base counts a grant adopted); or
    -- the first waiter's; or dropped.
    redis.call('HDEL', K.permits, value .. '#g')
    out = out - S.gn
    granted = S.g == nonce and S.g ~= fold
    dropped = S.g ~= nonce and S.g ~= fold
  end
elseif string.find(flags, 'g', 1, true) then
  return {-3, 0, 0}
elseif buried(K, seq) then
  return {-2, 0, 0}
end
if granted then
  -- The first waiter's permits, counted below with the count set to
  -- base.
  out = out + (base - mine)
  mine = base
end

-- k of the batch granted already: a call sent again whose first sending
-- was granted to the first k. A count that no prefix of this batch
-- explains (the batch changed since) is set back to base first.
local k, sum = 0, 0
if mine > base then
  local s = 0
  for i, n in ipairs(ns) do
    s = s + n
    if s == mine - base then
      k, sum = i, s
      break
    end
  end
  if k == 0 then
    out = out - (mine - base)
  end
elseif mine >= 0 and mine < base then
  -- Fewer than the process holds: cannot be, as no call undoes a later
  -- one; counted at base from here.
  out = out + (base - mine)
end

-- ahead returns the arrival of the first live waiter of another process,
-- or nil; the waiters at the head whose places were not renewed in time
-- are taken off the queue on the way.
local function ahead()
  while true do
    local h = redis.call('ZRANGE', K.queue, 0, 1, 'WITHSCORES')
    local id, score = h[1], h[2]
    if id == member then
      id, score = h[3], h[4]
    end
    if not id then
      return nil
    end
    local dl = redis.call('ZSCORE', K.places, id)
    if dl and tonumber(dl) > now then
      return tonumber(score), id
    end
    redis.call('ZREM', K.queue, id)
    redis.call('ZREM', K.places, id)
    redis.call('HDEL', K.wants, id)
  end
end

-- first: whether one of ours comes first. A caller without a place comes
-- after every waiter; else an earlier arrival (the same with a smaller id,
-- the order of a sorted set) comes first.
local first
if granted then
  k, sum, out = 1, ns[1], out + ns[1]
elseif k == 0 and out + ns[1] <= size then
  local a, id = ahead()
  first = not a or (member ~= '' and (arrivals[1] < a or (arrivals[1] == a and member < id)))
  if first and out + ns[1] <= size then
    k, sum, out = 1, ns[1], out + ns[1]
  end
end
if k > 0 then
  -- The next of ours, while they fit and came before every other waiter.
  local a, id = ahead()
  while k < #ns and out + ns[k + 1] <= size and (not a or arrivals[k + 1] < a) do
    k = k + 1
    sum, out = sum + ns[k], out + ns[k]
  end
  redis.call('HSET', K.permits, value, base + sum, value .. '#s', seq, '#size', size)
  redis.call('ZADD', K.leases, now + exp, value)
  keep(K.leases, placeMS)
  keep(K.permits, placeMS)
  if member ~= '' then
    -- Our place: given up, or kept at the arrival of our next waiter that
    -- did not get in (see holdPlace).
    local next = arrivals[k + 1] or 0
    if next > 0 then
      redis.call('ZADD', K.places, now + placeMS, member)
      keep(K.places, placeMS)
      keep(K.queue, placeMS)
      keep(K.wants, placeMS)
    end
    holdPlace(K, member, next)
  end
  -- The next in line may fit in what is left (also when a grant let us in
  -- first: see sem_wake.lua).
  wake(K, now, size - out, exp)
  return {1, k, 0}
end

if mine >= 0 and mine ~= base then
  -- Set to base, as this call found it (see above).
  if base == 0 then
    bury(K, value, seq, tomb)
  else
    redis.call('HSET', K.permits, value, base, value .. '#s', seq)
  end
end
-- The permits a dropped grant or a count set back frees, and a place
-- moved back, are told to the queue once, below: a second telling from
-- the same count would grant the permits the first granted.
local tell = dropped or (mine >= 0 and mine ~= base)
local moved = false
if member ~= '' then
  -- A waiter attempts about once per expiry, so this path is kept short:
  -- its place is renewed only when less than half of its time is left
  -- (every other attempt), and its entry (what it asks for, where a
  -- release may grant it, its arrival) written only then or when it
  -- changed ("w"). The entry first: a key of another type fails before our
  -- place is taken (places is read first).
  local dl = redis.call('ZSCORE', K.places, member)
  local renew = not dl or tonumber(dl) - now < placeMS / 2
  if renew or string.find(flags, 'w', 1, true) then
    local grantTo, g = '', ''
    if nonce ~= '' then
      grantTo = value
    end
    if string.find(flags, 'g', 1, true) then
      g = 'g'
    end
    redis.call('HSET', K.wants, member, ns[1] .. ':' .. grantTo .. ':' .. nonce .. ':' .. g .. ':' .. string.format('%d', arrivals[2] or 0) ..
      ':' .. string.format('%d', seq))
    -- The arrival of our first waiter, who may have changed (one that
    -- gave up leaves its place to the next; see Semaphore.leave).
    local was = redis.call('ZSCORE', K.queue, member)
    moved = was and tonumber(was) < arrivals[1]
    redis.call('ZADD', K.queue, arrivals[1], member)
    keep(K.wants, placeMS)
    keep(K.queue, placeMS)
  end
  if renew then
    redis.call('ZADD', K.places, now + placeMS, member)
    redis.call('HSET', K.permits, '#size', size)
    keep(K.places, placeMS)
    keep(K.permits, placeMS)
  end
end
if tell or moved then
  -- Permits came back; or our place moved back, and the waiters it kept
  -- out may fit now, as when a waiter at the head leaves (see
  -- sem_leave.lua).
  wake(K, now, size - out, exp)
end
local t = exp
if S.first then
  t = math.max(1, math.min(exp, S.first - now))
end
return {-1, 0, t}
