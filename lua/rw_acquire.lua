-- rw_acquire: take a read lease or the write lock of a NetRWMutex, or
-- confirm one that is already ours; or, for a waiter, keep its place.
--
-- KEYS[1]  writer key, p{name}:rw: "<value>:<token>" while a writer holds
-- KEYS[2]  tombstone of our value, p{name}:rw:gone:<value> (rw_release.lua)
-- KEYS[3]  writers' queue, p{name}:rw:writers: waiter ids by arrival (µs)
-- KEYS[4]  readers' queue, p{name}:rw:readers: waiter ids by arrival (µs)
-- KEYS[5]  leases, p{name}:rw:leases: a sorted set holding each read lease
--          (member: its value, score: its deadline in server ms, > 0) and
--          each queued waiter's deadline (member: "q:<id>", score: minus
--          its deadline), so that a waiter whose process died stops
--          keeping others out
-- KEYS[6]  fence counter, p{tag}:fence (acquire.lua); a writer's, when
--          fencing is on
-- ARGV[1]  "<mode>:<value>:<expiry ms>:<proposal>:<member>:<marker ms>":
--          mode r (read lease) or w (write lock); our fresh value; the
--          lease's expiry; the proposed fencing token ("0": the node
--          increments its counter; else a quorum's ballot; ignored for a
--          reader); our waiter id ("" for TryLock and TryRLock); how long a
--          waiter's place lasts without an attempt refreshing it. One
--          argument: Redis refuses more than 10 words from a client not yet
--          authenticated, and a clear NOAUTH is worth keeping.
--
-- (The line that sets publish, PUBLISH or SPUBLISH, is put before this
-- one: see backend.go.)
--
-- The rules are sync.RWMutex's, across every client of the name:
--   a reader gets in unless a writer holds, or a writer waits that came
--   before it (a waiter that has no place yet came after every one);
--   a writer gets in unless a writer holds, a read lease is live, or a
--   waiter (reader or writer) came before it.
-- Readers that waited behind a writer thus all get in when it leaves,
-- before any writer that came after them; and a waiting writer keeps new
-- readers out.
--
-- Reply, as acquire.lua's:
--   { 1, token, w}   acquired, or our own hold confirmed (a retry). token:
--                    the writer's fencing token (0 for a reader); w, for a
--                    reader: 1 if a writer waits (the process must not let
--                    more readers share this lease)
--   {-1, counter, t} not now; t: when to look again at the latest (ms): the
--                    holder's TTL, capped at the expiry. A waiter is queued
--                    (or its place kept)
--   {-2, counter, 0} free, but the proposed token is not above the counter
--   {-3, counter, 0} our value was already released: a late request
local mode, value, exp, proposal, member, markerMS = string.match(ARGV[1], '^([rw]):([^:]+):(%d+):(%d+):([^:]*):(%d+)$')
exp = tonumber(exp)
local fenced = #KEYS > 5
local function counter()
  if fenced and proposal ~= '0' then
    return tonumber(redis.call('GET', KEYS[6]) or '0')
  end
  return 0
end
-- keep sets key's TTL at least ms.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Reads first: a key of another type fails before anything is written.
local cur = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local nowUS = t[1] * 1000000 + t[2]
local now = math.floor(nowUS / 1000)
local mine = value .. ':'
if mode == 'w' and cur and string.sub(cur, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], exp)
  return {1, tonumber(string.sub(cur, #mine + 1)), 0}
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. string.format('%d', -now), '(0')
if mode == 'r' then
  local s = redis.call('ZSCORE', KEYS[5], value)
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[5], now + exp, value)
    keep(KEYS[5], exp)
    return {1, 0, redis.call('EXISTS', KEYS[3])}
  end
end
local queue = KEYS[4]
if mode == 'w' then
  queue = KEYS[3]
end
local arrival = false
if member ~= '' then
  arrival = redis.call('ZSCORE', queue, member)
end
-- Waiters whose places were not refreshed in time: gone.
for _, q in ipairs(dead) do
  local id = string.sub(q, 3)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], q)
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-3, counter(), 0}
end

-- ahead: the head h of a queue came before us.
local function ahead(h)
  return h[1] ~= nil and h[1] ~= member and (not arrival or tonumber(h[2]) < tonumber(arrival))
end
local blocked, ttl = false, exp
if cur then
  blocked, ttl = true, redis.call('PTTL', KEYS[1])
elseif ahead(redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')) then
  blocked = true
elseif mode == 'w' then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], 0, now) -- expired leases
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if last[1] and tonumber(last[2]) > 0 then
    blocked, ttl = true, tonumber(last[2]) - now
  elseif ahead(redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')) then
    blocked = true
  end
end

if blocked then
  if member ~= '' then
    if not arrival then
      redis.call('ZADD', queue, nowUS, member)
      if mode == 'w' then
        -- Tell the processes whose readers share a lease to stop letting
        -- more readers in (see NetRWMutex): they listen on a channel of
        -- their own, p{name}:rw:joined, which no waiter hears.
        redis.call(publish, KEYS[1] .. ':joined', 'j')
      end
    end
    redis.call('ZADD', KEYS[5], -(now + tonumber(markerMS)), 'q:' .. member)
    keep(queue, tonumber(markerMS))
    keep(KEYS[5], tonumber(markerMS))
  end
  if ttl < 0 or ttl > exp then
    ttl = exp
  end
  return {-1, counter(), ttl}
end

if arrival then
  redis.call('ZREM', queue, member)
  redis.call('ZREM', KEYS[5], 'q:' .. member)
end
if mode == 'r' then
  redis.call('ZADD', KEYS[5], now + exp, value)
  keep(KEYS[5], exp)
  return {1, 0, redis.call('EXISTS', KEYS[3])}
end
local token = 0
if fenced then
  if proposal == '0' then
    token = redis.call('INCR', KEYS[6])
  else
    local c = counter()
    if tonumber(proposal) <= c then
      return {-2, c, 0}
    end
    redis.call('SET', KEYS[6], proposal)
    token = tonumber(proposal)
  end
end
redis.call('SET', KEYS[1], mine .. string.format('%d', token), 'PX', exp)
return {1, token, 0}
