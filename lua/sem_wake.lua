-- sem_wake: the wake-up shared by sem_acquire, sem_release and sem_leave
-- (put before them; see backend.go).
--
-- wake tells, in the order of the queue, the waiters that fit in free
-- permits, each on its own channel <leases key>:wake:<waiter id>, and stops
-- at the first that does not fit: waiters get in in order of arrival, as
-- golang.org/x/sync/semaphore's do, so a large request is not passed over
-- by smaller ones. A waiter whose place was not renewed in time (its
-- process died) is taken off the queue on the way. At most wakeBatch
-- waiters are looked at per call: each one told takes its permits and
-- tells the next ones in turn (sem_acquire).
local wakeBatch = 64
local function wake(K, now, free)
  if free <= 0 then
    return
  end
  local q = redis.call('ZRANGE', K.queue, 0, wakeBatch - 1)
  for _, id in ipairs(q) do
    local dl = redis.call('ZSCORE', K.places, id)
    if not dl or tonumber(dl) <= now then
      redis.call('ZREM', K.queue, id)
      redis.call('ZREM', K.places, id)
      redis.call('HDEL', K.wants, id)
    else
      local want = tonumber(redis.call('HGET', K.wants, id) or '1')
      if want > free then
        return
      end
      free = free - want
      redis.call(publish, K.leases .. ':wake:' .. id, 'w')
    end
  end
end

-- purge takes off the leases whose deadlines passed (their processes died,
-- or could not extend them in time): their permits come back.
local function purge(K, now)
  local dead = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)
  for _, v in ipairs(dead) do
    redis.call('HDEL', K.permits, v, v .. '#s')
    redis.call('ZREM', K.leases, v)
  end
end

-- used returns the permits the live leases hold (call purge first).
local function used(K)
  local live = redis.call('ZRANGE', K.leases, 0, -1)
  if #live == 0 then
    return 0
  end
  local n = 0
  for _, p in ipairs(redis.call('HMGET', K.permits, unpack(live))) do
    n = n + tonumber(p or '0')
  end
  return n
end

local function servertime()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- tidy deletes the size and the count of permits out when nothing is held
-- and nobody waits: the next holders may then agree on another size.
local function tidy(K)
  if redis.call('ZCARD', K.leases) == 0 and redis.call('ZCARD', K.queue) == 0 then
    redis.call('DEL', K.permits)
  end
end

-- keep sets key's TTL to at least ms.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

local K = {leases = KEYS[1], permits = KEYS[2], queue = KEYS[3], places = KEYS[4], wants = KEYS[5]}
