-- readstate: not a script of its own. Its functions are prepended to
-- inspect.lua and rw_inspect.lua (see backend.go), which read a lock key
-- and the server's memory policy alike.
--
-- holdOf reads the lock or writer key key, writing nothing, and returns
-- state, token, pttl, holder, who:
--   state   0 free; 1 held, the key holds netlock's "<value>:<token>" or
--           "<value>:<token>:<holder>", a lock key's maybe followed by '+'
--           (see acquire.lua); 2 held by a value netlock did not write
--   token   the holder's fencing token (0 when free, by a foreign value, or
--           with fencing off)
--   pttl    the key's remaining TTL in ms; -1 if it has none; -2 when free
--   holder  the first 48 bits of the SHA1 of the key's value, 0 when free:
--           nodes held by one acquisition have the same holder, whatever the
--           token (all 0 with fencing off), and the value itself, which
--           would let anyone release the lock, is never sent
--   who     state 1: the <holder> the key holds, as written (escaped, see
--           acquire.lua); otherwise ""
-- A key of another type makes its GET fail with WRONGTYPE.
local function holdOf(key)
  local cur = redis.call('GET', key)
  if not cur then
    return 0, 0, -2, 0, ''
  end
  -- Without the '+' that ends a lock key's value when its waiters' queue
  -- may exist (see acquire.lua): nodes held by one acquisition differ in
  -- it.
  if string.find(cur, '^[^:]+:%d+:[^:]*%+$') then
    cur = string.sub(cur, 1, -2)
  end
  local pttl = redis.call('PTTL', key)
  local holder = tonumber(string.sub(redis.sha1hex(cur), 1, 12), 16)
  local t, h = string.match(cur, '^[^:]+:(%d+):([^:]*)$')
  if not t then
    t, h = string.match(cur, '^[^:]+:(%d+)$'), ''
  end
  if t then
    return 1, tonumber(t), pttl, holder, h
  end
  return 2, 0, pttl, holder, ''
end

-- memoryOf returns the server's maxmemory-policy, as its 1-based place in
-- policies (the policies netlock knows, comma-separated; package netlock,
-- maxmemoryPolicies), 0 if it is not there, -1 if INFO could not tell (a
-- server without the field, such as miniredis, or an ACL user without
-- +info); and its maxmemory in bytes (0: no limit), -1 if unknown.
--
-- INFO, not CONFIG GET: scripts may not call CONFIG. pcall: a server or a
-- user that refuses INFO still gets the lock's state.
local function memoryOf(policies)
  local policy, maxmemory = -1, -1
  local info = redis.pcall('INFO', 'memory')
  if type(info) == 'string' then
    local name = string.match(info, 'maxmemory_policy:([%w%-]+)')
    if name then
      policy = 0
      local i = 0
      for known in string.gmatch(policies, '[^,]+') do
        i = i + 1
        if known == name then
          policy = i
        end
      end
    end
    maxmemory = tonumber(string.match(info, '\nmaxmemory:(%d+)') or '-1')
  end
  return policy, maxmemory
end
