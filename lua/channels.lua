-- channels: whether the user of this connection may publish and subscribe
-- on a lock's channels: asked before a waiter first listens on a Backend,
-- and before an Election's campaign (see acl.go). A user who may not would
-- have its waits and releases refused (see lua/nopublish.lua).
--
-- KEYS[1]  a channel of the lock, such as p{name}:released:<waiter id>: a
--          key name only so that a Redis Cluster runs the call on the node
--          of its hash slot
--
-- (publish, PUBLISH or SPUBLISH, and noPublish are put before this one:
-- see backend.go. The subscribe that goes with SPUBLISH is SSUBSCRIBE.)
--
-- Reply: {1} it may, or the server cannot tell (redis.acl_check_cmd is
-- Redis 7's); an error NOPERM naming the ACL rule to add if it may not.
local no = noPublish(KEYS[1])
if no then
  return no
end
local subscribe = 'SUBSCRIBE'
if publish == 'SPUBLISH' then
  subscribe = 'SSUBSCRIBE'
end
if redis.acl_check_cmd and not redis.acl_check_cmd(subscribe, KEYS[1]) then
  local prefix = string.match(KEYS[1], '^[^{]*')
  return redis.error_reply('NOPERM netlock: this user may not ' .. subscribe .. ' on ' .. KEYS[1] ..
    ': add the channel rule &' .. prefix .. '* (ACL SETUSER <user> &' .. prefix .. '*)')
end
return {1}
