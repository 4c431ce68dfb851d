-- record: what a fenced key holds, shared by set.lua and delete.lua, which
-- are prepended with it. The Go side prepends, before this file, one line
-- that defines valueField, tokenField and maxToken (see script.go).
--
-- A fenced key is a hash of at most two fields: tokenField, the highest
-- token written, as a decimal string without leading zeros, and valueField,
-- the value (absent after a fenced delete). Nothing else is kept, so a
-- key's record costs one field, however many writes it has seen.
--
-- Tokens are uint64s, passed and kept as decimal strings: a Lua number is a
-- double, exact only up to 2^53. A token is split into the digits above the
-- last nine and the last nine, two numbers below 2^53 each, so both the
-- comparison and the reply (which Redis makes integers of) are exact over
-- the whole uint64 range.

-- split returns the token t as {high, low}: t = high*1e9 + low.
local function split(t)
  return tonumber(string.sub(t, 1, -10)) or 0, tonumber(string.sub(t, -9))
end

-- below reports whether token a is less than token b.
local function below(a, b)
  local ah, al = split(a)
  local bh, bl = split(b)
  return ah < bh or (ah == bh and al < bl)
end

-- recorded returns the token recorded at key; false if key does not exist;
-- or, if key holds anything but a fenced value, nil and the reply that
-- says what it holds: {-1} another type than a hash, {-2} a hash that is
-- not a fenced value.
local function recorded(key)
  local kind = redis.call('TYPE', key)
  if type(kind) == 'table' then
    kind = kind.ok
  end
  if kind == 'none' then
    return false
  end
  if kind ~= 'hash' then
    return nil, {-1}
  end
  local t = redis.call('HGET', key, tokenField)
  if not t or not string.find(t, '^[1-9][0-9]*$') or #t > #maxToken or
      (#t == #maxToken and below(maxToken, t)) then
    return nil, {-2}
  end
  local fields = 1
  if redis.call('HEXISTS', key, valueField) == 1 then
    fields = 2
  end
  if redis.call('HLEN', key) ~= fields then
    return nil, {-2}
  end
  return t
end

-- stale returns the reply that refuses a token below the recorded t.
local function stale(t)
  local high, low = split(t)
  return {0, high, low}
end
