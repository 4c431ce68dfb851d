-- once_forget: forget that a Once's function ran, on one node: the next Do
-- runs it again.
--
-- KEYS[1]  the Once's record, p{name}:once:done (see once_record.lua)
--
-- Reply, an array of one integer:
--   {1}  forgotten (or there was nothing to forget)
redis.call('DEL', KEYS[1])
return {1}
