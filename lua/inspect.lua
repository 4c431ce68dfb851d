-- inspect: read a lock's state on one node, writing nothing.
--
-- KEYS[1]  lock key, p{name}
-- KEYS[2]  waiters' queue, p{name}:waiters (see acquire.lua)
-- KEYS[3]  fence counter, p{tag}:fence (see acquire.lua); absent when fencing is off
-- ARGV[1]  the maxmemory policies netlock knows, comma-separated: the reply
--          names the server's policy by its place in this list (package
--          netlock, maxmemoryPolicies)
--
-- Reply, an array of nine integers and the holder's identity:
--   { state, token, pttl, holder, waiters, counter, policy, maxmemory, n, ... }
--   state      0 free; 1 held, the key holds netlock's "<value>:<token>" or
--              "<value>:<token>:<holder>", the latter maybe followed by
--              '+' (see acquire.lua); 2 held by a
--              value netlock did not write
--   token      the holder's fencing token (0 when free, by a foreign value, or
--              with fencing off)
--   pttl       the key's remaining TTL in ms; -1 if it has none; -2 when free
--   holder     the first 48 bits of the SHA1 of the key's value, 0 when free:
--              nodes held by one acquisition have the same holder, whatever
--              the token (all 0 with fencing off), and the value itself,
--              which would let anyone release the lock, is never sent
--   waiters    the number of waiters in the queue
--   counter    the fence counter, 0 if absent (or fencing is off)
--   policy     the server's maxmemory-policy: its 1-based place in ARGV[1],
--              0 if it is not there, -1 if INFO could not tell (a server
--              without the field, such as miniredis, or an ACL user without
--              +info)
--   maxmemory  the server's maxmemory in bytes (0: no limit), -1 if unknown
--   n          state 1: the length in bytes of the <holder> the key holds (as
--              written: escaped, see acquire.lua), then the holder itself
--              (see pack, in pack.lua, prepended to this script); otherwise 0
--
-- A key of another type makes GET, ZCARD or the counter's GET fail with
-- WRONGTYPE: the script's error is the node's answer. GET and ZCARD count as
-- an access for an LRU or LFU eviction policy, as any read does; nothing is
-- written.
local cur = redis.call('GET', KEYS[1])
local state, token, pttl, holder, who = 0, 0, -2, 0, ''
if cur then
  -- Without the '+' that says the waiters' queue may exist (see
  -- acquire.lua): nodes held by one acquisition differ in it.
  if string.find(cur, '^[^:]+:%d+:[^:]*%+$') then
    cur = string.sub(cur, 1, -2)
  end
  state, pttl = 2, redis.call('PTTL', KEYS[1])
  holder = tonumber(string.sub(redis.sha1hex(cur), 1, 12), 16)
  local t, h = string.match(cur, '^[^:]+:(%d+):([^:]*)$')
  if not t then
    t, h = string.match(cur, '^[^:]+:(%d+)$'), ''
  end
  if t then
    state, token, who = 1, tonumber(t), h
  end
end
local waiters = redis.call('ZCARD', KEYS[2])
local counter = 0
if #KEYS > 2 then
  counter = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
end

-- INFO, not CONFIG GET: scripts may not call CONFIG. pcall: a server or a
-- user that refuses INFO still gets the lock's state.
local policy, maxmemory = -1, -1
local info = redis.pcall('INFO', 'memory')
if type(info) == 'string' then
  local name = string.match(info, 'maxmemory_policy:([%w%-]+)')
  if name then
    policy = 0
    local i = 0
    for known in string.gmatch(ARGV[1], '[^,]+') do
      i = i + 1
      if known == name then
        policy = i
      end
    end
  end
  maxmemory = tonumber(string.match(info, '\nmaxmemory:(%d+)') or '-1')
end
return pack({state, token, pttl, holder, waiters, counter, policy, maxmemory}, who)
