-- once_read: whether a Once's function ran to success, on one node, writing
-- nothing. A Do reads it before it waits for the Once's lock (a name done
-- costs this one call) and again once it holds the lock.
--
-- KEYS[1]  the Once's record, p{name}:once:done (see once_record.lua)
--
-- Reply, an array of one integer:
--   {1}  the record exists: the function ran to success, and it is remembered
--   {0}  it does not
return {redis.call('EXISTS', KEYS[1])}
