-- pack: not a script of its own. Its function is prepended to the scripts
-- whose replies carry a string (see backend.go).
--
-- pack appends to reply the length of s in bytes, then s itself, six bytes
-- to an integer, big-endian, the last one holding what is left (a reply
-- holds integers only; six bytes are exact in Lua's numbers), and returns
-- reply. (package netlock reads it back with replyString.)
local function pack(reply, s)
  reply[#reply + 1] = #s
  for i = 1, #s, 6 do
    local n = 0
    for j = i, math.min(i + 5, #s) do
      n = n * 256 + string.byte(s, j)
    end
    reply[#reply + 1] = n
  end
  return reply
end
