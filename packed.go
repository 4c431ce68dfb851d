package netlock

// unpack reads a string that lua/pack.lua packed at the start of v (its
// length, then its bytes six to an integer), and returns it with what
// follows it in v. It reports false if v does not start with one.
func unpack(v []int64) (s string, rest []int64, ok bool) {
	if len(v) == 0 || v[0] < 0 {
		return "", nil, false
	}
	n := v[0]
	words := (n + 5) / 6
	if int64(len(v)-1) < words {
		return "", nil, false
	}
	// Six bytes to an integer, big-endian, the last one holding what is
	// left.
	b := make([]byte, 0, n)
	for _, x := range v[1 : 1+words] {
		k := min(6, int(n)-len(b))
		for j := k - 1; j >= 0; j-- {
			b = append(b, byte(x>>(8*j)))
		}
	}
	return string(b), v[1+words:], true
}

// unpackAll reads a string that lua/pack.lua packed, as unpack does, and
// reports false unless v holds that string and nothing after it.
func unpackAll(v []int64) (string, bool) {
	s, rest, ok := unpack(v)
	return s, ok && len(rest) == 0
}
