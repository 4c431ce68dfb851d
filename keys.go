package netlock

import "github.com/netlock-go/netlock/internal/keyspace"

// keys are the Redis names one NetMutex uses. They are made by package
// internal/keyspace, which cmd/netlock shares to read the same keys.
type keys struct {
	lock    string // p{name}
	channel string // p{name}:released
	waiters string // p{name}:waiters
	fence   string // p{t}:fence, in lock's hash slot; "" when fencing is off
}

// tomb returns the tombstone key of value: p{name}:gone:<value>. A release
// that does not find value in the lock key sets it, so that an acquire of
// value arriving late is refused.
func (k *keys) tomb(value string) string { return keyspace.Tomb(k.lock, value) }

// newKeys derives the names for lock name under prefix. Fence counters are
// kept per hash slot, not per name (see keyspace.New).
func newKeys(prefix, name string, fencing bool) keys {
	k := keyspace.New(prefix, name, fencing)
	return keys{lock: k.Lock, channel: k.Channel, waiters: k.Waiters, fence: k.Fence}
}

// keySlot is Redis Cluster's HASH_SLOT of key (keyspace.Slot).
func keySlot(key string) uint16 { return keyspace.Slot(key) }

// lockCall returns the keys of an acquire or release script (lock,
// tombstone, waiters' queue, and the fence counter with fencing on) and its
// three arguments, in one allocation.
func (k *keys) lockCall(tomb, arg1, arg2, arg3 string) (keys, args []string) {
	all := []string{k.lock, tomb, k.waiters, k.fence, arg1, arg2, arg3}
	keys = all[:4:4]
	if k.fence == "" {
		keys = all[:3:3]
	}
	return keys, all[4:]
}
