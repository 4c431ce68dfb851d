-- sem_wake: what sem_acquire, sem_release, sem_extend and sem_leave share
-- (put before them; see backend.go).
--
-- A waiter's wants entry is "<n>:<value>:<nonce>:<flags>:<next>:<seq>":
-- the permits its process's first waiter asks for; the process's lease
-- value, and a nonce naming this waiter's call, when a release may grant it
-- the permits in its own script ("" and "" when not: a client that cannot
-- be told, or WithSyncReplicas, which a script cannot wait for); flags "g"
-- if that lease holds permits already; the arrival of the process's next
-- waiter (0 if none), which is not in the queue but comes before the
-- waiters that arrived after it; the sequence number of the call that
-- wrote the entry (see below). A place kept for a next waiter is
-- "0:::-:0".
--
-- A grant puts the permits beside the lease's count, in "<value>#g" =
-- "<nonce>:<n>", counted as out from then on, and tells the waiter
-- "g:<nonce>:<value>". The process takes them in (adopts them) and folds
-- them into the count with its next call (see sem_acquire.lua): the lease's
-- count is the process's to set, whole, and a grant must not be lost to a
-- count set by a call that did not know of it. Nor to a call that the
-- process sent before the entry, whose reply was lost and which arrives
-- only now (a held-up link, a connection the client gave up on): a
-- release of "<value>:0" would end the lease the grant made, and an
-- attempt that does not carry the grant's nonce would drop it, while the
-- process, having heard from Redis since (not dirty), adopts the permits.
-- So the grant raises the lease's last sequence number ("<value>#s") to the
-- entry's: a call sent before it is late, and changes nothing.

-- keep sets key's TTL to at least ms.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- holdPlace, for a process whose first waiter got in (id: its waiter id):
-- takes it off the queue, or, if another waiter of the process arrived at
-- next (0: none), keeps the process's place at that arrival, with flags
-- "-": the process asks for that waiter at once, and the waiters after it
-- wait (wake stops there; sem_acquire counts it ahead of them), as they
-- would have behind it had it been in the queue.
local function holdPlace(K, id, next)
  if next > 0 then
    redis.call('ZADD', K.queue, next, id)
    redis.call('HSET', K.wants, id, '0:::-:0')
  else
    redis.call('ZREM', K.queue, id)
    redis.call('ZREM', K.places, id)
    redis.call('HDEL', K.wants, id)
  end
end

-- grantOf returns the nonce and permits of value's pending grant, or nil.
local function grantOf(K, value)
  local g = redis.call('HGET', K.permits, value .. '#g')
  if not g then
    return nil, 0
  end
  local nonce, n = string.match(g, '^([^:]+):(%d+)$')
  return nonce, tonumber(n)
end

-- wake tells, in the order of the queue, the waiters that fit in free
-- permits, granting them where their entry allows, each on its own channel
-- <leases key>:wake:<waiter id>, and stops at the first that does not fit:
-- waiters get in in order of arrival, as golang.org/x/sync/semaphore's do,
-- so a large request is not passed over by smaller ones. A waiter whose
-- place was not renewed in time (its process died) is taken off the queue
-- on the way. At most wakeBatch waiters are looked at per call: a waiter
-- told without a grant tells the next ones in turn as it gets in
-- (sem_acquire).
local wakeBatch = 64
local function wake(K, now, free, exp)
  if free <= 0 then
    return
  end
  local q = redis.call('ZRANGE', K.queue, 0, wakeBatch - 1)
  local after = nil
  for _, id in ipairs(q) do
    local dl = redis.call('ZSCORE', K.places, id)
    local w = redis.call('HGET', K.wants, id)
    if not dl or tonumber(dl) <= now or not w then
      redis.call('ZREM', K.queue, id)
      redis.call('ZREM', K.places, id)
      redis.call('HDEL', K.wants, id)
    else
      local n, value, nonce, flags, nextArrival, seq = string.match(w, '^(%d+):([^:]*):([^:]*):([^:]*):(%d+):?(%d*)$')
      n, nextArrival, seq = tonumber(n), tonumber(nextArrival), tonumber(seq)
      if flags == '-' or n > free or (after and after < tonumber(redis.call('ZSCORE', K.queue, id))) then
        -- It does not fit; or the process told before has a waiter of
        -- its own that came before this one, and gets in first (it asks
        -- when its process takes its grant in: see sem_acquire.lua).
        return
      end
      if nextArrival > 0 then
        after = nextArrival
      end
      free = free - n
      local msg = 'w'
      if value ~= '' then
        -- Granted, if the lease is as the waiter left it: held ("g") or
        -- not, and without a grant not yet taken in.
        local held = redis.call('ZSCORE', K.leases, value) ~= false
        if held == (flags == 'g') and redis.call('HEXISTS', K.permits, value .. '#g') == 0 then
          msg = 'g:' .. nonce .. ':' .. value
        end
      end
      if msg ~= 'w' then
        redis.call('HSET', K.permits, value .. '#g', nonce .. ':' .. n)
        -- The calls sent before the entry are late from now on (see above).
        if seq and seq > tonumber(redis.call('HGET', K.permits, value .. '#s') or '0') then
          redis.call('HSET', K.permits, value .. '#s', string.format('%d', seq))
        end
        -- GT: a lease's deadline never moves back; a new one is added.
        redis.call('ZADD', K.leases, 'GT', now + exp, value)
        keep(K.leases, 3 * exp)
        keep(K.permits, 3 * exp)
        holdPlace(K, id, nextArrival)
      end
      redis.call(publish, K.leases .. ':wake:' .. id, msg)
    end
  end
end

-- purge takes off the leases whose deadlines passed (their processes died,
-- or could not extend them in time): their permits come back.
local function purge(K, now)
  local dead = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)
  for _, v in ipairs(dead) do
    redis.call('HDEL', K.permits, v, v .. '#s', v .. '#g')
    redis.call('ZREM', K.leases, v)
  end
end

-- used returns the permits out: the live leases' counts and pending grants
-- (call purge first).
local function used(K)
  local live = redis.call('ZRANGE', K.leases, 0, -1)
  if #live == 0 then
    return 0
  end
  local fields = {}
  for _, v in ipairs(live) do
    fields[#fields + 1] = v
    fields[#fields + 1] = v .. '#g'
  end
  local n = 0
  local f = redis.call('HMGET', K.permits, unpack(fields))
  for i = 1, #f, 2 do
    n = n + tonumber(f[i] or '0')
    if f[i + 1] then
      n = n + tonumber(string.match(f[i + 1], ':(%d+)$'))
    end
  end
  return n
end

-- survey reads, in two calls, what sem_acquire needs to know: the leases
-- (those whose deadlines passed are purged), the size, the permits out
-- (counts and pending grants), and of our lease value: whether it lives,
-- its count, the last sequence number applied and its pending grant.
local function survey(K, now, value)
  local z = redis.call('ZRANGE', K.leases, 0, -1, 'WITHSCORES')
  local fields = {'#size', value, value .. '#s', value .. '#g'}
  local dead = {}
  local S = {out = 0, live = false}
  for i = 1, #z, 2 do
    local v, dl = z[i], tonumber(z[i + 1])
    if dl <= now then
      dead[#dead + 1] = v
    else
      S.first = S.first or dl -- in order of deadline
      S.live = S.live or v == value
      fields[#fields + 1] = v
      fields[#fields + 1] = v .. '#g'
    end
  end
  local f = redis.call('HMGET', K.permits, unpack(fields))
  S.size = f[1] and tonumber(f[1])
  S.mine = tonumber(f[2] or '0')
  S.seq = tonumber(f[3] or '0')
  if f[4] then
    S.g, S.gn = string.match(f[4], '^([^:]+):(%d+)$')
    S.gn = tonumber(S.gn)
  end
  for i = 5, #f, 2 do
    S.out = S.out + tonumber(f[i] or '0')
    if f[i + 1] then
      S.out = S.out + tonumber(string.match(f[i + 1], ':(%d+)$'))
    end
  end
  for _, v in ipairs(dead) do
    redis.call('HDEL', K.permits, v, v .. '#s', v .. '#g')
    redis.call('ZREM', K.leases, v)
  end
  return S
end

local function servertime()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- tidy deletes the size and the counts when nothing is held and nobody
-- waits: the next holders may then agree on another size.
local function tidy(K)
  if redis.call('ZCARD', K.leases) == 0 and redis.call('ZCARD', K.queue) == 0 then
    redis.call('DEL', K.permits)
  end
end

-- bury ends value's lease, and leaves its tombstone (KEYS[6], see
-- sem_acquire.lua) for tomb ms, holding seq, the sequence number of the
-- last call of the process applied to it: a call the process sent before
-- that one, whose reply was lost and which arrives only now (a held-up
-- link, a connection the client gave up on), is late, and does not make the
-- value a lease again that nobody holds.
local function bury(K, value, seq, tomb)
  redis.call('HDEL', K.permits, value, value .. '#s', value .. '#g')
  redis.call('ZREM', K.leases, value)
  redis.call('SET', K.gone, seq, 'PX', tomb)
end

-- buried reports whether value's tombstone holds a sequence number not
-- below seq: a call with seq is late.
local function buried(K, seq)
  local t = redis.call('GET', K.gone)
  return t and tonumber(t) >= seq
end

-- noWake returns, if a user who may not tell the waiters (see
-- lua/nopublish.lua) may have one to tell, the error to refuse the call
-- with before anything is written; nil otherwise. wake tells only while a
-- waiter is queued.
local function noWake(K)
  local no = noPublish(K.leases .. ':wake:*')
  if no and redis.call('EXISTS', K.queue) == 1 then
    return no
  end
  return nil
end

local K = {leases = KEYS[1], permits = KEYS[2], queue = KEYS[3], places = KEYS[4], wants = KEYS[5], gone = KEYS[6]}
