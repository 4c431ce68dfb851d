-- nopublish: not a script of its own. Its function is put before every
-- script that tells (see backend.go), after the line that sets publish.
--
-- noPublish returns, if the user of this connection may not publish on
-- channel, the error that says which ACL rule to add; nil if it may, or if
-- the server cannot tell (redis.acl_check_cmd is Redis 7's). A script that
-- tells, and cannot tell before its first write, asks it first: a refused
-- PUBLISH does not undo the writes made before it, and the caller, told of
-- an error, would not know that its call took effect. A channel that names
-- a waiter is asked as "<base>:*", before the waiter is known.
local function noPublish(channel)
  if redis.acl_check_cmd and not redis.acl_check_cmd(publish, channel, '') then
    local prefix = string.match(channel, '^[^{]*')
    return redis.error_reply('NOPERM netlock: this user may not ' .. publish .. ' on ' .. channel ..
      ': add the channel rule &' .. prefix .. '* (ACL SETUSER <user> &' .. prefix .. '*)')
  end
  return nil
end
