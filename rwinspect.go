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

// RWInfo is what NetRWMutex.Inspect found about a NetRWMutex: whether a
// writer holds it, by which hold and for how long, the read leases that
// hold it, and what each node holds.
type RWInfo struct {
	// Held reports whether a writer holds the write lock: a quorum of the
	// nodes hold the writer key with one writer's value (see Info.Held).
	// Readers hold the lock when Readers is not empty.
	Held bool

	// Holder, HolderInfo, Token and TTL describe the writer's hold as
	// Info's describe a NetMutex's: "" and 0 when no writer holds.
	Holder     string
	HolderInfo string
	Token      uint64
	TTL        time.Duration

	// Readers are the live read leases that a quorum of the nodes hold:
	// one per process whose readers hold the read lock (they share it),
	// soonest to end first. Their TTL is the time until fewer than a
	// quorum of the nodes hold them (on a single node, the time left to
	// the lease's deadline).
	Readers []LeaseInfo

	// Nodes has one entry per backend, in the order of the backends given.
	Nodes []RWNodeInfo
}

// LeaseInfo is one read lease of a NetRWMutex.
type LeaseInfo struct {
	// Holder tells leases apart without revealing their values, as
	// NodeInfo.Holder does: 12 hex digits of the value's SHA1.
	Holder string

	// HolderInfo is the identity the lease's process wrote with it
	// (WithHolderInfo), "" for none.
	HolderInfo string

	// TTL is how long the lease lasts unless its process extends or
	// releases it.
	TTL time.Duration
}

// RWNodeInfo is what one node holds for a NetRWMutex.
type RWNodeInfo struct {
	// NodeInfo is the node's writer key, as for a NetMutex's lock key: Held,
	// Token, Foreign, TTL, Holder and HolderInfo describe it; Waiters is the
	// number of writers waiting (every waiting writer has a place, whether
	// its Backend tells it its turn or it polls). FenceCounter,
	// MaxMemoryPolicy, MaxMemory and Err are the node's.
	NodeInfo

	// Leases are the node's live read leases, soonest to end first.
	Leases []LeaseInfo

	// ReadWaiters is the number of processes whose readers wait on the
	// node (a process's waiting readers take one place).
	ReadWaiters int
}

// rwInspectReplyLen is the length of lua/rw_inspect.lua's reply before the
// writer's identity.
const rwInspectReplyLen = 10

// Inspect reports whether a writer holds rw's lock in Redis, by which hold
// (its fencing token, its holder's identity) and for how long, which
// processes' read leases hold it, and what each node holds, across every
// process using its name. Leases whose deadlines passed, and waiters
// whose places were not renewed, are not counted.
//
// Inspect writes nothing to Redis and takes no place in a queue: it runs
// one read-only script on every node, in parallel, each bounded by the
// node timeout and by ctx. It reads each node once, at slightly different
// instants. Over several backends it judges the write lock and each read
// lease by a quorum as Inspect (the function) judges a lock: when the
// nodes that answered cannot tell, it returns what it read, with the
// holds it could tell, and an error matching ErrQuorum that names each
// failed node (and ctx's error if ctx ended); otherwise the error is nil,
// and the failed nodes' errors are in RWInfo.Nodes. Inspect is safe for
// concurrent use.
func (rw *NetRWMutex) Inspect(ctx context.Context) (RWInfo, error) {
	if err := rw.check(); err != nil {
		return RWInfo{}, err
	}
	m, k := rw.w, rw.keys
	keys := []string{k.Writer, k.Writers, k.Readers, k.Leases}
	if k.Fence != "" {
		keys = append(keys, k.Fence)
	}
	return inspectNodes(ctx, m, rwInspectScript, keys, rwNodeInfo, judgeRW)
}

// rwNodeInfo decodes node i's reply to the rw_inspect script (see
// lua/rw_inspect.lua).
func rwNodeInfo(i int, r nodeReply) RWNodeInfo {
	if r.err != nil {
		return RWNodeInfo{NodeInfo: NodeInfo{Err: r.err, MaxMemory: -1}}
	}
	n, ok := readRWInspect(r.vals)
	if !ok {
		err := nodeError(i, fmt.Errorf("rw_inspect script: unexpected reply %v", r.vals))
		return RWNodeInfo{NodeInfo: NodeInfo{Err: err, MaxMemory: -1}}
	}
	return n
}

// readRWInspect reads lua/rw_inspect.lua's reply, reporting false if it is
// not one.
func readRWInspect(v []int64) (RWNodeInfo, bool) {
	if len(v) < rwInspectReplyLen || v[0] < 0 || v[0] > 2 {
		return RWNodeInfo{}, false
	}
	who, rest, ok := unpack(v[rwInspectReplyLen-1:])
	if !ok || len(rest) == 0 || rest[0] < 0 {
		return RWNodeInfo{}, false
	}
	n := RWNodeInfo{NodeInfo: NodeInfo{Waiters: int(v[4]), FenceCounter: uint64(v[6])}, ReadWaiters: int(v[5])}
	n.readLock(v[:4], who)
	n.readMemory(v[7], v[8])
	count := rest[0]
	rest = rest[1:]
	for range count {
		if len(rest) < 2 {
			return RWNodeInfo{}, false
		}
		l := LeaseInfo{Holder: fmt.Sprintf("%012x", rest[0]), TTL: time.Duration(rest[1]) * time.Millisecond}
		var h string
		if h, rest, ok = unpack(rest[2:]); !ok {
			return RWNodeInfo{}, false
		}
		l.HolderInfo = keyspace.HolderDecode(h)
		n.Leases = append(n.Leases, l)
	}
	sortLeases(n.Leases) // the script's order breaks ties of a millisecond otherwise
	return n, len(rest) == 0
}

// judgeRW decides from the nodes' answers whether a writer holds the lock,
// and which read leases a quorum of the nodes hold, by the rules Inspect
// documents. It returns an error when the nodes that answered cannot tell
// the writer or a lease.
func judgeRW(nodes []RWNodeInfo, quorum int) (RWInfo, *inspectError) {
	writers := make([]NodeInfo, len(nodes))
	for i, n := range nodes {
		writers[i] = n.NodeInfo
	}
	w, werr := judge(writers, quorum)
	info := RWInfo{Held: w.Held, Holder: w.Holder, HolderInfo: w.HolderInfo, Token: w.Token, TTL: w.TTL, Nodes: nodes}

	failed := 0
	ttls := map[string][]time.Duration{} // each lease's TTL on each node that holds it
	byHolder := map[string]LeaseInfo{}
	var holders []string
	var errs []error
	for _, n := range nodes {
		if n.Err != nil {
			failed++
			errs = append(errs, n.Err)
			continue
		}
		for _, l := range n.Leases {
			if _, ok := byHolder[l.Holder]; !ok {
				byHolder[l.Holder] = l
				holders = append(holders, l.Holder)
			}
			ttls[l.Holder] = append(ttls[l.Holder], l.TTL)
		}
	}
	// most: the most nodes that hold a lease short of a quorum.
	most := 0
	for _, h := range holders {
		t := ttls[h]
		if len(t) < quorum {
			most = max(most, len(t))
			continue
		}
		// The lease lasts until fewer than quorum nodes hold it: the
		// quorum-th longest TTL.
		slices.Sort(t)
		l := byHolder[h]
		l.TTL = t[len(t)-quorum]
		info.Readers = append(info.Readers, l)
	}
	sortLeases(info.Readers)
	switch {
	case werr != nil:
		werr.what = "the writer key"
		return info, werr
	case most > 0 && most+failed >= quorum:
		return info, &inspectError{nodes: len(nodes), answered: len(nodes) - failed, most: most, need: quorum, errs: errs, what: "a read lease"}
	}
	return info, nil
}

// sortLeases orders leases soonest to end first, then by holder.
func sortLeases(leases []LeaseInfo) {
	slices.SortFunc(leases, func(a, b LeaseInfo) int {
		return cmp.Or(cmp.Compare(a.TTL, b.TTL), strings.Compare(a.Holder, b.Holder))
	})
}
