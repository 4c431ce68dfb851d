-- acquire: take the lock if it is free, or confirm a hold that is already ours.
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  tombstone of our value, p{name}:gone:<value> (see release.lua)
-- KEYS[3]  waiters' queue, p{name}:waiters: a sorted set of waiter ids by
--          arrival (see release.lua)
-- KEYS[4]  fence counter, p{tag}:fence, same slot as KEYS[1]; absent when fencing is off
-- ARGV[1]  our lock value (random, fresh for every acquisition)
-- ARGV[2]  expiry in milliseconds (relative: PX, never an absolute time)
-- ARGV[3]  "<proposal>:<member>:<flags>:<queue ttl>". The proposed fencing token: "0"
--          asks the node to increment its counter (single node), any other
--          value is a ballot (quorum). Our member of the waiters' queue ("" for
--          TryLock): "<waiter id>", or "<waiter id>+<expiry ms>+<nonce>" when
--          a release may grant us the lock in its own script (see
--          release.lua), the nonce fresh for each waiting call. Flags, any
--          of:
--            j  we listen on our release channel: while the lock is held,
--               join the waiters' queue if we are not in it
--            t  a release named us and we lost the race for the key: join
--               at the head, where we were, not at the tail
--            q  we may be in the queue: taking the lock takes us off it
--          The TTL of the waiters' queue in milliseconds, set when a waiter
--          joins (extend.lua renews it while the lock is held). Last, our
--          holder identity (WithHolderInfo; escaped, so that it holds no
--          ':' or '+'; package keyspace), "" for none; a member with a
--          nonce ends with it too, "<id>+<expiry ms>+<nonce>+<holder>", so
--          that a release granting us the lock writes our identity with
--          it. An uncontended attempt (proposal "0", no member, no flags,
--          and no queue TTL, as it does not join) sends only ":<holder>".
--          (One argument, not five: Redis refuses more than 10 words from
--          a client not yet authenticated, and a clear NOAUTH is worth
--          keeping.)
--
-- The key holds "<value>:<token>:<holder>", so that a retry of our own
-- request can return the token it was granted with (the fence counter is
-- shared by every name in the slot and may have moved on since), and
-- Inspect can tell who holds the lock; followed by '+' when the waiters'
-- queue may exist (see below).
--
-- Reply, an array of three integers (four when a waiter must join again):
--   { 1, token,   0    }  acquired; or the key already held our value (a retry
--                         of our own request): its TTL is refreshed and the
--                         token it was granted with is returned
--   { 1, token,   n    }  a release granted us the lock (our nonce is in the
--                         key, "<nonce>.<n>:<token>:<holder>"; we may not have heard
--                         its message yet): its TTL is refreshed, and our
--                         value is "<nonce>.<n>"
--   {-1, counter, pttl }  held by another value; pttl is its remaining TTL in
--                         ms (-1: the key has no TTL). counter is 0 unless the
--                         proposal was a ballot (only a quorum needs it).
--   {-1, counter, pttl, 1}  the same, and our member (with a nonce) is no
--                         longer queued: join again under a fresh nonce
--   {-2, counter, 0    }  free, but the proposed token is not above the counter
--   {-3, counter, 0    }  our value was already released: this request arrived
--                         late (a node that stalled) and must not take the key
--
-- A key of another type makes GET fail with WRONGTYPE before anything is written.
--
-- The key's value ends with '+' when the waiters' queue may exist: written
-- so by a take that cannot tell the queue is absent (EXISTS counted it, or
-- a joining waiter took the lock), by a release that grants the lock (see
-- handon.lua), and appended by the first waiter that joins while the lock
-- is held. A value without it (taken while neither the key, our tombstone
-- nor the queue existed) has no queue behind it, so its release only
-- deletes it (GET, DEL: no ZPOPMIN) and its extend renews no queue. A '+'
-- where the queue is gone (it expired, or a release emptied it) costs one
-- ZPOPMIN at the release. The holder identity never holds a '+', so the mark
-- cannot be mistaken for it.
--
-- Every redis.call costs more Lua overhead than the command itself costs,
-- so each path makes as few as it can. An attempt that does not join the
-- queue (j) looks first with one EXISTS counting the key, our tombstone and
-- the queue: none (the lock is free, not ours to refuse, and nobody waits)
-- takes it at once, so the free path makes three (EXISTS, INCR, SET; with a
-- ballot, EXISTS, GET, SET, SET; without fencing, two); otherwise it reads
-- the key as a joining waiter does, one call more (a key of another type
-- counts, and then GET fails). A joining waiter, which expects the lock
-- held, reads the key first: joining makes five (GET, TIME, ZADD, PEXPIRE,
-- PTTL; six when it marks the value); one queued already, three (GET,
-- ZSCORE, PTTL). Not MGET: it reads a key of another type as nil, where GET
-- fails. The free path runs before any string is matched or built but the
-- value, and the script defines no function: each EVALSHA runs the whole
-- chunk, a local function being a new closure every time.
local proposal, waiter, flags, queueTTL, tail = '0', '', '', '', ARGV[3]
-- An uncontended attempt's ":<holder>" is read without a pattern (58 is
-- ':'), and is what the key holds after the token: tail.
if string.byte(tail) ~= 58 then
  proposal, waiter, flags, queueTTL, tail = string.match(tail, '^(%d+):([^:]*):([^:]*):(%d+)(:[^:]*)$')
end
local join = flags ~= '' and string.find(flags, 'j', 1, true)
local mark = ''
if join or redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) ~= 0 then
  local cur = redis.call('GET', KEYS[1])
  if cur then
    local mine = ARGV[1] .. ':'
    if string.sub(cur, 1, #mine) == mine then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return {1, tonumber(string.match(cur, '^%d+', #mine + 1)), 0}
    end
    local nonce = string.match(waiter, '^[^+]*%+%d*%+([^+]*)') or ''
    if nonce ~= '' and string.sub(cur, 1, #nonce + 1) == nonce .. '.' then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      if string.find(flags, 'q', 1, true) then
        redis.call('ZREM', KEYS[3], waiter)
      end
      local n, token = string.match(cur, '^[^.]*%.(%d+):(%d+)')
      return {1, tonumber(token), tonumber(n)}
    end
    -- A waiter that may be queued looks first (one call, where joining is
    -- three); one that cannot be (its first join) joins at once, NX keeping
    -- it from moving if it was after all. A member with a nonce joins once:
    -- one that is gone (a release took it, granting it a lock since lost,
    -- or skipping it; or the queue was lost) is not added again under the
    -- same nonce, so that a late message of that release can never be taken
    -- for a grant of the new join. The waiter is told to join again under a
    -- fresh nonce (the reply's fourth integer).
    if join and string.find(flags, 'q', 1, true) then
      if redis.call('ZSCORE', KEYS[3], waiter) then
        join = false
      elseif nonce ~= '' then
        return {-1, 0, redis.call('PTTL', KEYS[1]), 1} -- a nonce means one node: no ballot
      end
    end
    if join then
      local score = 0 -- below every arrival time: the head
      if not string.find(flags, 't', 1, true) then
        local t = redis.call('TIME')
        score = t[1] * 1000000 + t[2]
      end
      if redis.call('ZADD', KEYS[3], 'NX', score, waiter) == 1 then
        redis.call('PEXPIRE', KEYS[3], queueTTL)
      end
      -- The holder's release must look at the queue now (43 is '+'); a
      -- value netlock did not write is left as it is.
      if string.byte(cur, -1) ~= 43 and string.find(cur, '^[^:]+:%d+:[^:]*$') then
        redis.call('APPEND', KEYS[1], '+')
      end
    end
    local c = 0
    if proposal ~= '0' and KEYS[4] then
      c = tonumber(redis.call('GET', KEYS[4]) or '0')
    end
    return {-1, c, redis.call('PTTL', KEYS[1])}
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    local c = 0
    if KEYS[4] then
      c = tonumber(redis.call('GET', KEYS[4]) or '0')
    end
    return {-3, c, 0}
  end
  mark = '+' -- the queue may exist
end

-- The token as a string: formatting a number costs as much as a call, and
-- without fencing there is none to format.
local token, digits = 0, '0'
if KEYS[4] then
  if proposal == '0' then
    token = redis.call('INCR', KEYS[4])
    digits = string.format('%d', token)
  else
    local c = tonumber(redis.call('GET', KEYS[4]) or '0')
    token, digits = tonumber(proposal), proposal
    if token <= c then
      return {-2, c, 0}
    end
    redis.call('SET', KEYS[4], proposal)
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. digits .. tail .. mark, 'PX', ARGV[2])
if mark ~= '' and flags ~= '' and string.find(flags, 'q', 1, true) then
  redis.call('ZREM', KEYS[3], waiter)
end
return {1, token, 0}
