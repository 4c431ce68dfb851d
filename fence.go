package netlock

import "sync"

// keys are the Redis names one NetMutex uses.
type keys struct {
	lock    string // p{name}
	channel string // p{name}:released
	fence   string // p{t}:fence, in lock's hash slot; "" when fencing is off
}

// tomb returns the tombstone key of value: p{name}:gone:<value>. A release
// that does not find value in the lock key sets it, so that an acquire of
// value arriving late is refused.
func (k *keys) tomb(value string) string { return k.lock + ":gone:" + value }

// newKeys derives the names for lock name under prefix. Fence counters are
// kept per hash slot, not per name, so an application that locks millions of
// distinct names leaves at most 16384 counter keys per prefix. The tag t is
// chosen so that the counter lands in the lock key's slot: a script may then
// touch both keys on a Redis Cluster, and a token is monotonic per slot, hence
// per name.
func newKeys(prefix, name string, fencing bool) keys {
	k := keys{lock: prefix + "{" + name + "}"}
	k.channel = k.lock + ":released"
	if fencing {
		k.fence = prefix + "{" + slotTags()[keySlot(k.lock)] + "}:fence"
	}
	return k
}

// keySlot is Redis Cluster's HASH_SLOT: CRC16 of the key's hash tag (the
// bytes between the first '{' and the first '}' after it, if not empty), or
// of the whole key, modulo 16384.
func keySlot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	return crc16(key) & 16383
}

// slotTags returns, for every slot, a short string that hashes to it. It is
// computed once, on first use (about a millisecond): all strings of one to
// three characters over [0-9a-zA-Z] cover every slot.
var slotTags = sync.OnceValue(func() *[16384]string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var tags [16384]string
	left := len(tags)
	buf := make([]byte, 0, 4)
	var walk func(depth int) bool
	walk = func(depth int) bool {
		if depth == 0 {
			s := crc16(string(buf)) & 16383
			if tags[s] == "" {
				tags[s] = string(buf)
				left--
			}
			return left == 0
		}
		for i := 0; i < len(alphabet); i++ {
			buf = append(buf, alphabet[i])
			done := walk(depth - 1)
			buf = buf[:len(buf)-1]
			if done {
				return true
			}
		}
		return false
	}
	for n := 1; left > 0; n++ {
		walk(n)
	}
	return &tags
})

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis
// Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
