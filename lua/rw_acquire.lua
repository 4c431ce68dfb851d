-- rw_acquire: take a read lease or the write lock of a NetRWMutex, or
-- confirm one that is already ours; or, for a waiter, keep its place.
--
-- KEYS[1]  writer key, p{name}:rw: "<value>:<token>:<holder>" while a writer
--          holds (see acquire.lua)
-- KEYS[2]  tombstone of our value, p{name}:rw:gone:<value> (rw_release.lua)
-- KEYS[3]  writers' queue, p{name}:rw:writers: waiter ids by arrival
-- KEYS[4]  readers' queue, p{name}:rw:readers: waiter ids by arrival
-- KEYS[5]  leases, p{name}:rw:leases: a sorted set holding each read lease
--          (member: its value, which ends with "+<holder>" where the
--          reader has one, score: its deadline in server ms, > 0) and
--          each queued waiter's deadline (member: "q:<id>", score: minus
--          its deadline), so that a waiter whose process died stops
--          keeping others out
-- KEYS[6]  fence counter, p{tag}:fence (acquire.lua); a writer's, when
--          fencing is on
-- ARGV[1]  "<mode>:<value>:<expiry ms>:<proposal>:<member>:<flags>:<place ms>:<arrival>:<holder>":
--          mode r (read lease) or w (write lock); our fresh value; the
--          lease's expiry; the proposed fencing token ("0": the node
--          increments its counter; else a quorum's ballot; ignored for a
--          reader); our waiter id ("" for TryLock and TryRLock); flags "q"
--          if we may have a place already (taking the lock then gives it
--          up), else ""; how long a waiter's place lasts without an attempt
--          renewing it; when the waiter's call began (µs, its own clock),
--          its place in the queue. The waiter gives the same arrival to
--          every node, so the nodes of a quorum order their queues alike:
--          with server times, two waiters could each be first on some node,
--          neither on a majority, and wait for ever. (Clients' clocks that
--          disagree make the order less fair, never stuck.) Our holder
--          identity, escaped as acquire.lua's, "" for none; a member with a
--          nonce ends with it too, "<id>+<expiry ms>+<nonce>+<holder>". One
--          argument: Redis refuses more than 10 words from a client not yet
--          authenticated, and a clear NOAUTH is worth keeping.
--
-- (The line that sets publish, PUBLISH or SPUBLISH, is put before this
-- one: see backend.go.)
--
-- The rules are sync.RWMutex's, across every client of the name:
--   a reader gets in unless a writer holds, or a writer waits that came
--   before it (a caller without a place, TryRLock, comes after every one);
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
--   { 1, token, n}   a writer: a release granted us the lock, under the
--                    value "<nonce>.<n>" (see wake, in rw_wake.lua)
--   { 1, 0, w, 1}    a reader: a release granted us the lease "<nonce>.1"
--   {-1, counter, t} not now; t: when to look again at the latest (ms): the
--                    holder's TTL, capped at the expiry. A waiter is queued
--                    (or its place kept)
--   {-2, counter, 0} free, but the proposed token is not above the counter
--   {-3, counter, 0} our value was already released: a late request
--
-- A waiter attempts about once per expiry, so the refused path is kept
-- short: a waiter's place is renewed only when less than half of its time
-- is left (every other attempt), and the places of dead waiters are looked
-- for only when a place is what keeps us out.
local mode, value, exp, proposal, member, flags, placeMS, arrival, holder = string.match(ARGV[1], '^([rw]):([^:]+):(%d+):(%d+):([^:]*):([^:]*):(%d+):(%d+):([^:]*)$')
arrival = tonumber(arrival)
local queued = flags == 'q'
exp, placeMS = tonumber(exp), tonumber(placeMS)
local fenced = #KEYS > 5
local function counter()
  if fenced and proposal ~= '0' then
    return tonumber(redis.call('GET', KEYS[6]) or '0')
  end
  return 0
end
-- keep sets key's TTL to at least ms.
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- A key of another type fails before anything is written.
local cur = redis.call('GET', KEYS[1])
local mine = value .. ':'
if mode == 'w' and cur and string.sub(cur, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], exp)
  return {1, tonumber(string.match(cur, '^%d+', #mine + 1)), 0}
end
-- A release may have granted us our hold (see wake, in rw_wake.lua): our
-- member then carries a nonce, "<id>+<expiry ms>+<nonce>+<holder>", and the
-- hold is under "<nonce>.<n>". We may not have heard its message yet: adopt it,
-- refreshing its TTL.
local nonce = string.match(member, '^[^+]*%+%d*%+([^+]*)') or ''
if mode == 'w' and cur and nonce ~= '' and string.sub(cur, 1, #nonce + 1) == nonce .. '.' then
  redis.call('PEXPIRE', KEYS[1], exp)
  local n, token = string.match(cur, '^[^.]*%.(%d+):(%d+)')
  return {1, tonumber(token), tonumber(n)}
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local queue = KEYS[4]
if mode == 'w' then
  queue = KEYS[3]
end
local place = 'q:' .. member

-- wait keeps a waiter's place and answers "not now, look again in ttl".
local function wait(ttl)
  if member ~= '' then
    local dl = redis.call('ZSCORE', KEYS[5], place)
    if not dl or -tonumber(dl) - now < placeMS / 2 then
      if mode == 'w' then
        -- A writer that joins tells, below: a user who may not is
        -- refused before anything is written (see lua/nopublish.lua).
        local no = noPublish(KEYS[1] .. ':joined')
        if no then
          return no
        end
      end
      -- The deadline first: a leases key of another type fails here,
      -- before the queue is written.
      redis.call('ZADD', KEYS[5], -(now + placeMS), place)
      keep(KEYS[5], placeMS)
      if redis.call('ZADD', queue, 'NX', arrival, member) == 1 then
        keep(queue, placeMS)
        if mode == 'w' then
          -- Tell the processes whose readers share a lease to let no
          -- more readers in (see NetRWMutex): they listen on a channel
          -- of their own.
          redis.call(publish, KEYS[1] .. ':joined', 'j')
        end
      else
        redis.call('PEXPIRE', queue, placeMS, 'GT')
      end
    end
  end
  if ttl < 0 or ttl > exp then
    ttl = exp
  end
  return {-1, counter(), ttl}
end

if cur then
  return wait(redis.call('PTTL', KEYS[1]))
end
-- A reader's grant, likewise: its lease "<nonce>.1", or "<nonce>.1+<holder>"
-- (no writer takes the lock while it is live, so there is none to look for
-- above).
if mode == 'r' and nonce ~= '' then
  local lease = nonce .. '.1'
  if holder ~= '' then
    lease = lease .. '+' .. holder
  end
  local s = redis.call('ZSCORE', KEYS[5], lease)
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[5], now + exp, lease)
    keep(KEYS[5], exp)
    return {1, 0, redis.call('EXISTS', KEYS[3]), 1}
  end
end

-- first returns the head of queue q that came before us, if any: after
-- taking off every queue the waiters whose places were not renewed in time
-- (their processes died), the first time one is found.
local purged = false
local function first(q)
  local h = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  if not h[1] or h[1] == member then
    return nil
  end
  if not purged then
    purged = true
    local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. string.format('%d', -now), '(0')
    if #dead > 0 then
      for _, d in ipairs(dead) do
        local id = string.sub(d, 3)
        redis.call('ZREM', KEYS[3], id)
        redis.call('ZREM', KEYS[4], id)
        redis.call('ZREM', KEYS[5], d)
      end
      return first(q)
    end
  end
  -- Ahead of us: an earlier arrival, or the same with a smaller id (the
  -- order of a sorted set). A caller without a place (TryLock) comes
  -- after every waiter.
  local score = tonumber(h[2])
  if member == '' or score < arrival or (score == arrival and h[1] < member) then
    return h
  end
  return nil
end

if mode == 'r' then
  local s = redis.call('ZSCORE', KEYS[5], value)
  if s and tonumber(s) > now then -- a retry of our own request
    redis.call('ZADD', KEYS[5], now + exp, value)
    keep(KEYS[5], exp)
    return {1, 0, redis.call('EXISTS', KEYS[3])}
  end
end
if first(KEYS[3]) then
  return wait(exp)
end
if mode == 'w' then
  local top = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if top[1] and tonumber(top[2]) > now then
    return wait(tonumber(top[2]) - now)
  end
  if first(KEYS[4]) then
    return wait(exp)
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-3, counter(), 0}
end

if queued then
  redis.call('ZREM', queue, member)
  redis.call('ZREM', KEYS[5], place)
end
if mode == 'r' then
  redis.call('ZADD', KEYS[5], now + exp, value)
  keep(KEYS[5], exp)
  return {1, 0, redis.call('EXISTS', KEYS[3])}
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], 0, now) -- expired leases
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
redis.call('SET', KEYS[1], mine .. string.format('%d', token) .. ':' .. holder, 'PX', exp)
return {1, token, 0}
