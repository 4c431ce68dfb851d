package netlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// Info is what Inspect found about a lock: whether it is held, by which
// hold, for how long, and what each node holds.
type Info struct {
	// Held reports whether the lock is held: a quorum of the nodes
	// (len(backends)/2+1, so the one node of a plain lock) hold its key
	// with one holder's value, so that no acquire can succeed until that
	// hold ends. Keys on fewer nodes, left over from an acquire that failed
	// or a hold that ended elsewhere, exclude no one: Held is false.
	Held bool

	// Holder is the NodeInfo.Holder of the hold's nodes, "" when the lock
	// is not held.
	Holder string

	// HolderInfo is the identity the holder wrote with its hold
	// (WithHolderInfo; by default "<hostname>/<pid>" of its process), ""
	// when the lock is not held or the holder wrote none.
	HolderInfo string

	// Token is the fencing token of the hold: 0 when the lock is not held,
	// with fencing off (WithFencing), or when the key holds a value netlock
	// did not write (NodeInfo.Foreign).
	Token uint64

	// TTL is how long the hold lasts, by the nodes' clocks, unless its
	// holder extends or releases it: the time until fewer than a quorum of
	// the nodes still hold its key (on a single node, the key's remaining
	// TTL). It is negative if a quorum hold a key without a TTL
	// (one netlock did not set), and 0 when the lock is not held. A
	// holder's own view of its hold ends earlier, by the drift allowance
	// (WithDriftFactor).
	TTL time.Duration

	// Nodes has one entry per backend, in the order of the backends given.
	Nodes []NodeInfo
}

// NodeInfo is what one node holds for a lock.
type NodeInfo struct {
	// Held reports whether the node holds the lock's key, whatever its
	// value.
	Held bool

	// Token is the fencing token in the key's value: 0 when the node does
	// not hold the key, with fencing off, or when Foreign.
	Token uint64

	// Foreign reports that the key holds a value netlock did not write (it
	// has no token). Such a key still keeps every acquire out while it
	// exists.
	Foreign bool

	// TTL is the key's remaining TTL: negative if the key has none, 0 when
	// the node does not hold it.
	TTL time.Duration

	// Holder tells holds apart without revealing the key's value (which
	// would let anyone release the lock): 12 hex digits of the value's
	// SHA1, the same on every node that holds the key for one acquisition,
	// "" when the node does not hold the key.
	Holder string

	// HolderInfo is the identity the holder wrote with the key
	// (WithHolderInfo), "" when the node does not hold the key, or when it
	// holds a value without one (Foreign, or WithHolderInfo("")).
	HolderInfo string

	// Waiters is the number of clients in the lock's waiters' queue on the
	// node: waiters whose Backend tells them their turn (see Subscriber).
	// Waiters that poll take no place in the queue and are not counted.
	Waiters int

	// FenceCounter is the node's fence counter for the hash slot of the
	// lock's key: the highest fencing token it has granted to any lock name
	// in that slot. It is 0 with fencing off or before the first grant.
	FenceCounter uint64

	// MaxMemoryPolicy is the server's maxmemory-policy (noeviction,
	// volatile-lru, ..., allkeys-random), as its INFO reports it; "" if the
	// node could not tell: its INFO has no such field (miniredis), its ACL
	// user may not run INFO, or the policy is one netlock does not know.
	// See Evicts.
	MaxMemoryPolicy string

	// MaxMemory is the server's maxmemory in bytes, 0 for no limit, -1 if
	// the node could not tell (as for MaxMemoryPolicy).
	MaxMemory int64

	// Err is the node's error, nil if it answered: it did not answer
	// within the node timeout, refused the connection or the password,
	// or a key of the lock holds another type (WRONGTYPE). It names the
	// node by its index, as the errors of a NetMutex do. The other fields
	// then say nothing: zero, and MaxMemory -1.
	Err error
}

// Evicts reports whether the server's maxmemory-policy lets it evict keys
// that have a TTL when its memory is full (volatile-* and allkeys-*), as a
// lock key has: an evicted key is a lock released under its holder, which
// breaks mutual exclusion; allkeys-* can also evict fence counters, which
// breaks fencing. Eviction happens only while maxmemory is set (MaxMemory
// above 0), but it can be set at any time. netlock needs noeviction.
func (n NodeInfo) Evicts() bool {
	return strings.HasPrefix(n.MaxMemoryPolicy, "volatile-") || strings.HasPrefix(n.MaxMemoryPolicy, "allkeys-")
}

// maxmemoryPolicies are the maxmemory policies netlock knows, as Redis 7
// names them. lua/inspect.lua, which gets the list as an argument, names the
// server's policy by its place in it.
var maxmemoryPolicies = []string{
	"noeviction",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl",
	"allkeys-lru", "allkeys-lfu", "allkeys-random",
}

// inspectReplyLen is the length of lua/inspect.lua's reply before the
// holder's identity.
const inspectReplyLen = 9

// Inspect reports whether the lock called name is held on backends, by
// which hold (its fencing token) and for how long, and what each node
// holds. name, backends and opts are those a NetMutex for the lock is made
// with (New); of the options, only the prefix, fencing (whether to read the
// fence counter) and the node timeout matter. Inspect validates them as New
// does; for bad input it returns New's error, which matches no sentinel,
// with a zero Info, and contacts no node.
//
// Inspect writes nothing to Redis and takes no place in the waiters' queue:
// it runs one read-only script on every node, in parallel, each call bounded
// by the node timeout and by ctx, so it blocks at most the node timeout and
// returns early when ctx ends. (Its reads count as accesses for an LRU or
// LFU maxmemory-policy, as any read does.) It reads each node once, at
// slightly different instants: a lock that changes hands while Inspect runs
// may show either holder.
//
// Over several backends the lock is held when a quorum of the nodes
// (len(backends)/2+1) hold its key with one holder's value, as the lock
// itself decides; see Info.Held. A node that does not answer may hold the
// key or not, so:
//
//   - if a quorum of the nodes that answered hold the key with one value,
//     the lock is held (Held true), whatever the others would say;
//   - if too few hold it for a quorum even counting every node that did not
//     answer as a holder, the lock is free (Held false);
//   - otherwise the nodes that answered cannot tell: Inspect returns the
//     Info read so far, with Held false, and an error matching ErrQuorum
//     that names each failed node (for one node, its error), and ctx's
//     error too if ctx ended.
//
// In the first two cases the error is nil, even if nodes failed: their
// errors are in Info.Nodes. Inspect is safe for concurrent use.
func Inspect(ctx context.Context, name string, backends []Backend, opts ...Option) (Info, error) {
	// New validates name, backends and options, and derives the keys, the
	// quorum and the node timeout: one set of rules for the lock and for
	// Inspect. It does not contact Redis.
	m, err := New(name, backends, opts...)
	if err != nil {
		return Info{}, err
	}
	return m.inspect(ctx)
}

// inspect runs the inspect script on every node and judges the replies.
func (m *engine) inspect(ctx context.Context) (Info, error) {
	keys := []string{m.keys.lock, m.keys.waiters, m.keys.fence}
	if m.keys.fence == "" {
		keys = keys[:2]
	}
	return inspectNodes(ctx, m, inspectScript, keys, nodeInfo, judge)
}

// inspectNodes runs an inspect script (s, on keys) on every node of m,
// reads each node's reply with read, and judges them over m's quorum; an
// error names ctx's end too, if ctx ended.
func inspectNodes[N, I any](ctx context.Context, m *engine, s *Script, keys []string,
	read func(int, nodeReply) N, judge func([]N, int) (I, *inspectError)) (I, error) {
	replies := m.fanout(ctx, s, keys, []string{strings.Join(maxmemoryPolicies, ",")}, nil)
	nodes := make([]N, len(replies))
	for i, r := range replies {
		nodes[i] = read(i, r)
	}
	info, err := judge(nodes, m.quorum)
	if err != nil {
		if cause := ctxEnded(ctx); cause != nil {
			err.cause = cause
		}
		return info, err
	}
	return info, nil
}

// nodeInfo decodes node i's reply to the inspect script (see
// lua/inspect.lua).
func nodeInfo(i int, r nodeReply) NodeInfo {
	if r.err != nil {
		return NodeInfo{Err: r.err, MaxMemory: -1}
	}
	v := r.vals
	var who string
	ok := len(v) >= inspectReplyLen && v[0] >= 0 && v[0] <= 2
	if ok {
		who, ok = unpackAll(v[inspectReplyLen-1:])
	}
	if !ok {
		return NodeInfo{Err: nodeError(i, fmt.Errorf("inspect script: unexpected reply %v", v)), MaxMemory: -1}
	}
	n := NodeInfo{Waiters: int(v[4]), FenceCounter: uint64(v[5])}
	n.readLock(v[:4], who)
	n.readMemory(v[6], v[7])
	return n
}

// readLock reads what an inspect script says of a lock key, v: {status (0
// free, 1 held, 2 held by a value netlock did not write), token, TTL in ms,
// holder}, and who, the holder's info.
func (n *NodeInfo) readLock(v []int64, who string) {
	n.Held, n.Foreign, n.Token = v[0] != 0, v[0] == 2, uint64(v[1])
	if !n.Held {
		return
	}
	n.Holder = fmt.Sprintf("%012x", v[3])
	n.HolderInfo = keyspace.HolderDecode(who)
	n.TTL = time.Duration(v[2]) * time.Millisecond
	if v[2] < 0 {
		n.TTL = -1
	}
}

// readMemory reads what an inspect script says of the server's memory: the
// maxmemory policy's place in maxmemoryPolicies (from 1; 0 for another),
// and maxmemory.
func (n *NodeInfo) readMemory(policy, maxMemory int64) {
	n.MaxMemory = maxMemory
	if policy >= 1 && int(policy) <= len(maxmemoryPolicies) {
		n.MaxMemoryPolicy = maxmemoryPolicies[policy-1]
	}
}

// judge decides from the nodes' answers whether the lock is held, by the
// rules Inspect documents. It returns an error when the nodes that answered
// cannot tell.
func judge(nodes []NodeInfo, quorum int) (Info, *inspectError) {
	info := Info{Nodes: nodes}
	count := map[string]int{}
	failed, most, best := 0, 0, -1 // best: a node of the holder on the most nodes
	var errs []error
	for i, n := range nodes {
		switch {
		case n.Err != nil:
			failed++
			errs = append(errs, n.Err)
		case n.Held:
			count[n.Holder]++
			if c := count[n.Holder]; c > most {
				most, best = c, i
			}
		}
	}
	switch {
	case most >= quorum:
		// Two holders cannot both hold a quorum: this one holds the lock,
		// whatever the nodes that did not answer hold.
		holder := nodes[best].Holder
		var ttls []time.Duration
		for _, n := range nodes {
			if n.Err == nil && n.Held && n.Holder == holder {
				ttl := n.TTL
				if ttl < 0 {
					ttl = time.Duration(1<<63 - 1) // no TTL: never expires
				}
				ttls = append(ttls, ttl)
			}
		}
		// The hold lasts until fewer than quorum nodes keep the key: the
		// quorum-th longest TTL.
		slices.Sort(ttls)
		info.Held = true
		info.Holder = holder
		info.Token = nodes[best].Token
		info.HolderInfo = nodes[best].HolderInfo
		info.TTL = ttls[len(ttls)-quorum]
		if info.TTL == time.Duration(1<<63-1) {
			info.TTL = -1
		}
		return info, nil
	case most+failed < quorum:
		return info, nil // free: no holder can have a quorum
	}
	return info, &inspectError{nodes: len(nodes), answered: len(nodes) - failed, most: most, need: quorum, errs: errs}
}

// inspectError reports that too few nodes answered to tell whether the lock
// is held. It matches ErrQuorum, each node's error, and the context's error
// if the caller's context ended.
type inspectError struct {
	nodes, answered, most, need int
	errs                        []error // one per failed node, named by nodeError
	cause                       error   // the caller's context's, if it ended
	what                        string  // what the nodes hold: "the key" if ""
}

func (e *inspectError) Error() string {
	if e.nodes == 1 {
		return e.errs[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "netlock: cannot tell whether the lock is held: %d of %d nodes answered, %d of them hold %s with one value, a quorum is %d",
		e.answered, e.nodes, e.most, cmp.Or(e.what, "the key"), e.need)
	for _, err := range e.errs {
		b.WriteString("; ")
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e *inspectError) Unwrap() []error {
	errs := append([]error{ErrQuorum}, e.errs...)
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}
