// Package keyspace names the Redis keys of a netlock lock. The netlock
// package uses it to build its keys, and cmd/netlock to read them ("netlock
// status"), so both always agree.
//
// For lock name with prefix p:
//
//	p{name}               the lock key; it holds "<value>:<token>:<holder>" (see HolderOf)
//	p{name}:released      the release channel (a waiter listens on
//	                      p{name}:released:<waiter id>)
//	p{name}:waiters       the waiters' queue, a sorted set of waiter ids
//	p{name}:gone:<value>  a released value's tombstone
//	p{t}:fence            the fence counter of the lock key's hash slot
//
// A NetRWMutex of the same name uses keys of its own, under p{name}:rw (see
// RW); a Semaphore, under p{name}:sem (see Sem); an Election, under
// p{name}:elect (see Election); a Once, under p{name}:once (see Once).
//
// The braces are a Redis Cluster hash tag. Fence counters are kept per hash
// slot, not per name: t is a short tag chosen so that the counter lands in
// the lock key's slot. An application that locks millions of distinct names
// then leaves at most 16384 counter keys per prefix; a script may touch the
// lock key and the counter together on a Redis Cluster; and a token, monotonic
// per slot, is monotonic per name.
package keyspace

import "sync"

// Keys are the Redis names of one lock.
type Keys struct {
	Lock    string // p{name}
	Channel string // p{name}:released
	Waiters string // p{name}:waiters
	Fence   string // p{t}:fence, in Lock's hash slot; "" when fencing is off
}

// New returns the names of lock name under prefix, with a fence counter when
// fencing is on. It does not validate its input: the netlock package rejects
// an empty name and a prefix containing '{' or '}'.
func New(prefix, name string, fencing bool) Keys {
	k := Keys{Lock: prefix + "{" + name + "}"}
	k.Channel = k.Lock + ":released"
	k.Waiters = k.Lock + ":waiters"
	if fencing {
		k.Fence = prefix + "{" + SlotTags()[Slot(k.Lock)] + "}:fence"
	}
	return k
}

// RWKeys are the Redis names of one NetRWMutex.
type RWKeys struct {
	Writer  string // p{name}:rw, "<value>:<token>:<holder>" while a writer holds
	Writers string // p{name}:rw:writers, waiting writers by arrival
	Readers string // p{name}:rw:readers, waiting readers by arrival
	Leases  string // p{name}:rw:leases, read leases and waiters' deadlines
	Channel string // p{name}:rw:released: readers wait on Channel+":r" (Channel+":r:<waiter id>" where releases grant), a writer on Channel+":w:<waiter id>"
	Joined  string // p{name}:rw:joined, where a writer taking its place is told
	Fence   string // the fence counter, New's; "" when fencing is off
}

// RW returns the names of the NetRWMutex name under prefix. A released
// value's tombstone is Tomb(Writer, value).
func RW(prefix, name string, fencing bool) RWKeys {
	k := New(prefix, name, fencing)
	w := k.Lock + ":rw"
	return RWKeys{Writer: w, Writers: w + ":writers", Readers: w + ":readers", Leases: w + ":leases",
		Channel: w + ":released", Joined: w + ":joined", Fence: k.Fence}
}

// SemKeys are the Redis names of one Semaphore.
type SemKeys struct {
	Leases  string // p{name}:sem, the processes' leases by deadline; waiter <id> is woken on p{name}:sem:wake:<id>
	Permits string // p{name}:sem:permits, each lease's permits, and the size
	Queue   string // p{name}:sem:queue, waiters by arrival
	Places  string // p{name}:sem:places, waiters' place deadlines
	Wants   string // p{name}:sem:wants, the permits each waiter asks for
}

// Sem returns the names of the Semaphore name under prefix. The tombstone of
// a lease value that ended is Tomb(Leases, value): p{name}:sem:gone:<value>.
func Sem(prefix, name string) SemKeys {
	s := New(prefix, name, false).Lock + ":sem"
	return SemKeys{Leases: s, Permits: s + ":permits", Queue: s + ":queue", Places: s + ":places", Wants: s + ":wants"}
}

// ElectionKeys are the Redis names of one Election: a lock of its own
// (Keys, whose holder leads), and beside it the leader's record.
type ElectionKeys struct {
	Keys
	Leader  string // p{name}:elect:leader, a hash: the term, value and revision the leader proclaimed
	Changes string // p{name}:elect:changes, the channel where every change of leader is told
}

// Election returns the names of the Election name under prefix: its lock
// key is p{name}:elect, with New's waiters' queue, release channel and
// fence counter derived from it.
func Election(prefix, name string) ElectionKeys {
	lock := New(prefix, name, true).Lock + ":elect"
	k := Keys{Lock: lock, Channel: lock + ":released", Waiters: lock + ":waiters",
		Fence: prefix + "{" + SlotTags()[Slot(lock)] + "}:fence"}
	return ElectionKeys{Keys: k, Leader: lock + ":leader", Changes: lock + ":changes"}
}

// OnceKeys are the Redis names of one Once: a lock of its own (Keys, whose
// holder runs the function), and beside it the record of its success.
type OnceKeys struct {
	Keys
	Done string // p{name}:once:done, "<token>:<unix ms>:<holder>" once the function ran to success
}

// Once returns the names of the Once name under prefix: its lock key is
// p{name}:once, with New's waiters' queue, release channel and fence
// counter (when fencing is on) derived from it, and its record
// p{name}:once:done, all in the hash slot of p{name}.
func Once(prefix, name string, fencing bool) OnceKeys {
	k := New(prefix, name, fencing)
	lock := k.Lock + ":once"
	return OnceKeys{Keys: Keys{Lock: lock, Channel: lock + ":released", Waiters: lock + ":waiters", Fence: k.Fence}, Done: lock + ":done"}
}

// Tomb returns the tombstone key of value for the lock key lock:
// p{name}:gone:<value>. A release that does not find value in the lock key
// sets it, so that an acquire of value arriving late is refused.
func Tomb(lock, value string) string { return lock + ":gone:" + value }

// Slot is Redis Cluster's HASH_SLOT: CRC16 of the key's hash tag (the bytes
// between the first '{' and the first '}' after it, if not empty), or of the
// whole key, modulo 16384.
func Slot(key string) uint16 {
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
	return CRC16(key) & 16383
}

// SlotTags returns, for every slot, a short string that hashes to it. The
// table is computed once, on first use (about a millisecond): all strings of
// one to three characters over [0-9a-zA-Z] cover every slot. It is shared:
// callers must not modify it.
var SlotTags = sync.OnceValue(func() *[16384]string {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var tags [16384]string
	left := len(tags)
	buf := make([]byte, 0, 4)
	var walk func(depth int) bool
	walk = func(depth int) bool {
		if depth == 0 {
			s := CRC16(string(buf)) & 16383
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

// CRC16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis
// Cluster uses for key slots.
func CRC16(s string) uint16 {
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
