-- multi_acquire: take the locks of all of a MultiMutex's names at once, only
-- if every one is free; otherwise take none, queue for the first one held,
-- and say how long it is held. The lock keys, values and fence counters are
-- a NetMutex's (see acquire.lua), so a NetMutex of one of the names and the
-- MultiMutex exclude each other.
--
-- n is the number of names (ARGV[5]); names are in sorted order, the same in
-- every call, so the first busy name is the same for every caller.
-- KEYS[1..n]       lock keys, p{name}
-- KEYS[n+1..2n]    waiters' queues, p{name}:waiters (see acquire.lua)
-- KEYS[2n+1..3n]   tombstones of our value, p{name}:gone:<value> (see release.lua)
-- KEYS[3n+1..4n]   fence counters of each name's slot, p{tag}:fence (names of
--                  one slot repeat the key); absent when fencing is off
-- ARGV[1]  our lock value (random, fresh for every acquisition)
-- ARGV[2]  expiry in milliseconds (relative: PX)
-- ARGV[3]  "<proposal>:<member>:<flags>:<queue ttl>:<holder>", as acquire.lua's (the
--          member is a plain waiter id: a release never grants a
--          MultiMutex a lock in its own script)
-- ARGV[4]  how many queued waiters a turn passed on tries (see release.lua)
-- ARGV[5]  n
--
-- One token serves the whole set: it is above the counter of every name's
-- slot, and every counter is set to it, so it is a NetMutex's token for each
-- name (strictly increasing per slot, hence per name).
--
-- Reply, an array of three integers:
--   { 1, token,   0    }  every name taken (or already ours: a retry)
--   {-1, counter, pttl }  a name is held by another value (the first so
--                         held, in sorted order); pttl is its remaining TTL
--                         in ms (-1: no TTL); counter is 0 unless the
--                         proposal was a ballot
--   {-2, counter, 0    }  all free, but the proposal is not above the
--                         highest counter of the names' slots
--   {-3, counter, 0    }  our value was already released: a late request
--
-- While it waits, the caller is in the queue of one name at most: the one
-- held. A waiter told its turn (flag t) that finds another name held passes
-- the turn on where it does not take it, as leave.lua does. handOn is in
-- handon.lua, prepended to this script.
local n = tonumber(ARGV[5])
local fenced = #KEYS > 3 * n
local proposal, waiter, flags, queueTTL, holder = string.match(ARGV[3], '^(%d+):([^:]*):([^:]*):(%d+):([^:]*)$')
local join = string.find(flags, 'j', 1, true)
local queued = string.find(flags, 'q', 1, true)
local turn = string.find(flags, 't', 1, true)
local mine = ARGV[1] .. ':'

local function counter()
  local c = 0
  if fenced then
    for i = 3 * n + 1, 4 * n do
      c = math.max(c, tonumber(redis.call('GET', KEYS[i]) or '0'))
    end
  end
  return c
end

local busy, late, held = 0, false, nil
for i = 1, n do
  local cur = redis.call('GET', KEYS[i])
  if cur and string.sub(cur, 1, #mine) ~= mine then
    busy, held = i, cur
    break
  end
  if not cur and redis.call('EXISTS', KEYS[2 * n + i]) == 1 then
    late = true
  end
end

if busy > 0 then
  if queued and turn then
    -- A turn may be passed on below: a user who may not tell a name's
    -- waiters is refused first, if one is queued (see lua/nopublish.lua).
    for j = 1, n do
      local no = noPublish(KEYS[j] .. ':released:*')
      if j ~= busy and no and redis.call('EXISTS', KEYS[n + j]) == 1 then
        return no
      end
    end
  end
  if queued then
    for j = 1, n do
      if j ~= busy and redis.call('ZREM', KEYS[n + j], waiter) == 0 and turn and not redis.call('GET', KEYS[j]) then
        local fence = fenced and KEYS[3 * n + j] or nil
        handOn(KEYS[j], KEYS[n + j], fence, KEYS[j] .. ':released', tonumber(ARGV[4]), false)
      end
    end
  end
  local q = KEYS[n + busy]
  if join and queued and redis.call('ZSCORE', q, waiter) then
    join = false
  end
  if join then
    local score = 0 -- below every arrival time: the head
    if not turn then
      local t = redis.call('TIME')
      score = t[1] * 1000000 + t[2]
    end
    if redis.call('ZADD', q, 'NX', score, waiter) == 1 then
      redis.call('PEXPIRE', q, queueTTL)
    end
    -- The holder's release must look at the queue now: a NetMutex's value
    -- says so with a '+' at its end (43; see acquire.lua).
    if string.byte(held, -1) ~= 43 and string.find(held, '^[^:]+:%d+:[^:]*$') then
      redis.call('APPEND', KEYS[busy], '+')
    end
  end
  local c = 0
  if proposal ~= '0' then
    c = counter()
  end
  return {-1, c, redis.call('PTTL', KEYS[busy])}
end
if late then
  return {-3, counter(), 0}
end

local token = 0
if fenced then
  local c = counter()
  if proposal == '0' then
    token = c + 1
  else
    token = tonumber(proposal)
    if token <= c then
      return {-2, c, 0}
    end
  end
  for i = 3 * n + 1, 4 * n do
    redis.call('SET', KEYS[i], string.format('%d', token))
  end
end
local value = mine .. string.format('%d', token) .. ':' .. holder
for i = 1, n do
  redis.call('SET', KEYS[i], value, 'PX', ARGV[2])
  if queued then
    redis.call('ZREM', KEYS[n + i], waiter)
  end
end
return {1, token, 0}
