package netlock

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// mustInspectRW runs rw.Inspect and fails the test on an error.
func mustInspectRW(t *testing.T, rw *NetRWMutex) RWInfo {
	t.Helper()
	info, err := rw.Inspect(t.Context())
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return info
}

// leaseHolderInfos returns the HolderInfo of each lease, sorted.
func leaseHolderInfos(leases []LeaseInfo) []string {
	var s []string
	for _, l := range leases {
		s = append(s, l.HolderInfo)
	}
	slices.Sort(s)
	return s
}

// TestRWInspectOneNode follows a NetRWMutex through its life on one node,
// on every server and client: free; held by a writer, with a reader waiting;
// read by two processes, with a writer waiting; and checks that Inspect
// writes nothing, and what it says of keys netlock did not write.
func TestRWInspectOneNode(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		k := keyspace.RW(DefaultPrefix, "doc", true)
		look := e.newRW(t, "doc")
		info := mustInspectRW(t, look)
		if info.Held || info.Token != 0 || info.TTL != 0 || info.HolderInfo != "" || len(info.Readers) != 0 || len(info.Nodes) != 1 {
			t.Errorf("never used: got %+v, want a free lock on one node", info)
		}
		if n := info.Nodes[0]; n.Held || n.Waiters != 0 || n.ReadWaiters != 0 || len(n.Leases) != 0 || n.FenceCounter != 0 || n.Err != nil {
			t.Errorf("never used: node %+v, want all zero", n)
		}

		w := e.newRW(t, "doc", WithExpiry(time.Minute), WithHolderInfo(oddHolder))
		if err := w.LockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		r1 := e.newRW(t, "doc", WithExpiry(time.Minute), WithHolderInfo("reader-1"))
		rerr := async(r1.RLockCtx)
		eventually(t, 5*time.Second, "the reader waits", func() bool { return mustInspectRW(t, look).Nodes[0].ReadWaiters == 1 })
		info = mustInspectRW(t, look)
		n := info.Nodes[0]
		if !info.Held || info.HolderInfo != oddHolder || info.Token != w.Token() || info.TTL <= 0 || info.TTL > time.Minute || len(info.Holder) != 12 {
			t.Errorf("a writer: got Held %v, HolderInfo %q, Token %d, TTL %v, Holder %q; want true, %q, %d, (0, 1m], 12 hex digits",
				info.Held, info.HolderInfo, info.Token, info.TTL, info.Holder, oddHolder, w.Token())
		}
		if !n.Held || n.Foreign || n.Token != w.Token() || n.TTL != info.TTL || n.Holder != info.Holder || n.HolderInfo != oddHolder || n.FenceCounter != w.Token() || n.Waiters != 0 || len(info.Readers) != 0 {
			t.Errorf("a writer: node %+v, readers %+v; want the writer's hold, fence counter %d, no lease", n, info.Readers, w.Token())
		}
		if err := w.UnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		mustGet(t, rerr)

		r2 := e.newRW(t, "doc", WithExpiry(time.Minute))
		if err := r2.RLockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		w2 := e.newRW(t, "doc", WithExpiry(time.Minute))
		werr := async(w2.LockCtx)
		eventually(t, 5*time.Second, "the writer waits", func() bool { return mustInspectRW(t, look).Nodes[0].Waiters == 1 })
		info = mustInspectRW(t, look)
		if got, want := leaseHolderInfos(info.Readers), sorted([]string{"reader-1", selfHolder(t)}); info.Held || !slices.Equal(got, want) {
			t.Errorf("two readers: got Held %v, readers %q; want false, %q", info.Held, got, want)
		}
		for i, l := range info.Readers {
			if l.TTL <= 0 || l.TTL > time.Minute || len(l.Holder) != 12 || (i > 0 && l.TTL < info.Readers[i-1].TTL) {
				t.Errorf("two readers: lease %d %+v, want a TTL in (0, 1m], soonest first, and 12 hex digits", i, l)
			}
		}
		if n := info.Nodes[0]; !slices.Equal(n.Leases, info.Readers) || n.Held || n.ReadWaiters != 0 {
			t.Errorf("two readers: node %+v, want the readers' leases %+v, no writer", n, info.Readers)
		}

		// From here on, nothing else writes while Inspect is checked for
		// writing nothing.
		before := e.writes(t)
		mustInspectRW(t, look)
		if after := e.writes(t); after != before {
			t.Errorf("Inspect wrote to Redis: before\n%s\nafter\n%s", before, after)
		}
		for _, r := range []*NetRWMutex{r1, r2} {
			if err := r.RUnlockCtx(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		mustGet(t, werr)
		if info := mustInspectRW(t, look); !info.Held || info.Token != w2.Token() || info.HolderInfo != selfHolder(t) || len(info.Readers) != 0 {
			t.Errorf("the writer let in: got %+v, want held by token %d", info, w2.Token())
		}
		if err := w2.UnlockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}

		// Hand-made: a foreign writer value, a lease without a holder, a
		// lease past its deadline, a live and a dead waiter's place.
		e.do(t, "SET", k.Writer, "not netlock's")
		e.do(t, "ZADD", k.Leases, "9999999999999", "plain", "1", "expired", "-9999999999999", "q:live", "-1", "q:dead")
		e.do(t, "ZADD", k.Writers, "1", "live", "2", "dead")
		e.do(t, "ZADD", k.Readers, "1", "dead")
		info = mustInspectRW(t, look)
		n = info.Nodes[0]
		if !info.Held || info.Token != 0 || info.TTL >= 0 || !n.Foreign || n.HolderInfo != "" || n.Waiters != 1 || n.ReadWaiters != 0 {
			t.Errorf("hand-made: got %+v, want a foreign writer without TTL, 1 writer and no reader waiting", info)
		}
		if len(info.Readers) != 1 || info.Readers[0].HolderInfo != "" || info.Readers[0].TTL < time.Hour {
			t.Errorf("hand-made: readers %+v, want one lease without a holder", info.Readers)
		}

		for _, key := range []string{k.Writer, k.Leases, k.Writers, k.Readers, k.Fence} {
			e.do(t, "DEL", k.Writer, k.Leases, k.Writers, k.Readers, k.Fence)
			e.do(t, "ZADD", k.Writers, "1", "w")
			e.do(t, "ZADD", k.Readers, "1", "r")
			if key == k.Leases || key == k.Writers || key == k.Readers {
				e.do(t, "DEL", key)
			}
			e.do(t, "RPUSH", key, "x")
			info, err := look.Inspect(t.Context())
			if !errors.Is(err, ErrQuorum) || !strings.Contains(fmt.Sprint(err), "WRONGTYPE") || !strings.HasPrefix(fmt.Sprint(err), "netlock: node 0: ") {
				t.Errorf("%s a list: got error %v, want a node 0 error matching ErrQuorum that says WRONGTYPE", key, err)
			}
			if len(info.Nodes) != 1 || info.Nodes[0].Err == nil || info.Held || len(info.Readers) != 0 {
				t.Errorf("%s a list: got %+v, want one node with its error, nothing held", key, info)
			}
		}

		var zero NetRWMutex
		if _, err := zero.Inspect(t.Context()); !errors.Is(err, errZeroRW) {
			t.Errorf("zero NetRWMutex: got %v, want %v", err, errZeroRW)
		}
	})
}

// TestRWInspectFencingOff: with fencing off, Inspect reads no fence
// counter, and the writer's token is 0.
func TestRWInspectFencingOff(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		w := e.newRW(t, "doc", WithFencing(false))
		if err := w.LockCtx(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer w.Unlock()
		e.do(t, "RPUSH", keyspace.RW(DefaultPrefix, "doc", true).Fence, "x") // not read
		info := mustInspectRW(t, e.newRW(t, "doc", WithFencing(false)))
		if !info.Held || info.Token != 0 || info.Nodes[0].FenceCounter != 0 {
			t.Errorf("fencing off: got Held %v, Token %d, fence counter %d; want true, 0, 0", info.Held, info.Token, info.Nodes[0].FenceCounter)
		}
	})
}

// TestRWInspectQuorum: over three nodes, a writer holds when a quorum hold
// the writer key with one value, and a read lease counts when a quorum hold
// it; a node that does not answer leaves Inspect unable to tell when it
// could make the difference.
func TestRWInspectQuorum(t *testing.T) {
	for _, real := range []bool{false, true} {
		for _, client := range []string{"redigo", "rueidis"} {
			name := "miniredis/" + client
			if real {
				name = "redis/" + client
			}
			t.Run(name, func(t *testing.T) { testRWInspectQuorum(t, real, client) })
		}
	}
}

func testRWInspectQuorum(t *testing.T, real bool, client string) {
	envs := make([]*env, 3)
	nodes := make([]Backend, 3)
	for i := range envs {
		if real {
			s := redistest.Start(t)
			envs[i] = &env{server: s, client: client, addr: s.Addr()}
		} else {
			mini := miniredis.RunT(t)
			envs[i] = &env{mini: mini, client: client, addr: mini.Addr()}
		}
		nodes[i] = envs[i].backend(t)
	}
	look, err := NewRW("doc", nodes)
	if err != nil {
		t.Fatal(err)
	}

	w, err := NewRW("doc", nodes, WithHolderInfo("w"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.LockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	if info := mustInspectRW(t, look); !info.Held || info.Token != w.Token() || info.HolderInfo != "w" || info.TTL <= 0 || info.TTL > DefaultExpiry {
		t.Errorf("held by a writer: got %+v, want token %d, holder w", info, w.Token())
	}
	if err := w.UnlockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	r, err := NewRW("doc", nodes, WithHolderInfo("r"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RLockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
	if info := mustInspectRW(t, look); info.Held || len(info.Readers) != 1 || info.Readers[0].HolderInfo != "r" {
		t.Errorf("read by a process: got %+v, want one lease of holder r", info)
	}
	if err := r.RUnlockCtx(t.Context()); err != nil {
		t.Fatal(err)
	}

	k := keyspace.RW(DefaultPrefix, "doc", true)
	// lease puts a read lease on node i with ttl left; on miniredis, whose
	// Lua TIME is the real clock, the deadline is from now too.
	lease := func(i int, value string, ttl time.Duration) {
		envs[i].do(t, "ZADD", k.Leases, time.Now().Add(ttl).UnixMilli(), value)
	}
	stop := func(i int) {
		if real {
			envs[i].server.Stop()
		} else {
			envs[i].mini.Close()
		}
	}
	for _, step := range []struct {
		name    string
		do      func()
		readers []string // the leases' holders
		ttl     time.Duration
		err     string // unknown: an error matching ErrQuorum, that says it
	}{
		{"free", func() {}, nil, 0, ""},
		{"one node", func() { lease(0, "a+x", time.Minute) }, nil, 0, ""},
		{"two values", func() { lease(1, "b+y", time.Minute) }, nil, 0, ""},
		{"two nodes", func() { lease(1, "a+x", 30*time.Second) }, []string{"x"}, 30 * time.Second, ""},
		{"three nodes", func() { lease(2, "a+x", 45*time.Second) }, []string{"x"}, 45 * time.Second, ""},
		{"two leases", func() { lease(0, "b+y", 50*time.Second) }, []string{"x", "y"}, 45 * time.Second, ""},
		{"one down", func() { stop(2) }, []string{"x", "y"}, 30 * time.Second, ""},
		{"a lease on one node, one down", func() { envs[1].do(t, "ZREM", k.Leases, "a+x") }, []string{"y"}, 50 * time.Second,
			"netlock: cannot tell whether the lock is held: 2 of 3 nodes answered, 1 of them hold a read lease with one value, a quorum is 2; netlock: node 2: "},
		{"a writer key on one node, one down", func() { envs[0].do(t, "SET", k.Writer, "v:9", "PX", 60000) }, []string{"y"}, 50 * time.Second,
			"netlock: cannot tell whether the lock is held: 2 of 3 nodes answered, 1 of them hold the writer key with one value, a quorum is 2; netlock: node 2: "},
	} {
		step.do()
		t.Run(step.name, func(t *testing.T) {
			info, err := look.Inspect(t.Context())
			if len(info.Nodes) != 3 {
				t.Fatalf("got %d nodes, want 3 (error %v)", len(info.Nodes), err)
			}
			if step.err == "" && err != nil || step.err != "" && (!errors.Is(err, ErrQuorum) || !strings.HasPrefix(fmt.Sprint(err), step.err)) {
				t.Errorf("got error %v, want %q", err, step.err)
			}
			if got := leaseHolderInfos(info.Readers); !slices.Equal(got, step.readers) || info.Held {
				t.Errorf("got readers %q, Held %v; want %q, false", got, info.Held, step.readers)
			}
			if len(info.Readers) > 0 {
				if got := info.Readers[0].TTL; got > step.ttl || got < step.ttl-5*time.Second {
					t.Errorf("got the first lease's TTL %v, want about %v", got, step.ttl)
				}
			}
		})
	}
}

// TestRWInspectJudge: the quorum rules on hand-made nodes.
func TestRWInspectJudge(t *testing.T) {
	down := RWNodeInfo{NodeInfo: NodeInfo{Err: errors.New("down"), MaxMemory: -1}}
	leases := func(holders ...string) RWNodeInfo {
		n := RWNodeInfo{}
		for i, h := range holders {
			n.Leases = append(n.Leases, LeaseInfo{Holder: h, HolderInfo: "of " + h, TTL: time.Duration(i+1) * time.Second})
		}
		return n
	}
	for _, c := range []struct {
		name    string
		nodes   []RWNodeInfo
		readers []string
		err     bool
	}{
		{"one node", []RWNodeInfo{leases("a", "b")}, []string{"of a", "of b"}, false},
		{"one node down", []RWNodeInfo{down}, nil, true},
		{"quorum of 3", []RWNodeInfo{leases("a"), leases("a", "b"), leases("c")}, []string{"of a"}, false},
		{"short of a quorum, one down", []RWNodeInfo{leases("a"), leases("b"), down}, nil, true},
		{"a quorum and nothing else, one down", []RWNodeInfo{leases("a"), leases("a"), down}, []string{"of a"}, false},
		{"two down", []RWNodeInfo{leases("a"), down, down}, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			info, err := judgeRW(c.nodes, len(c.nodes)/2+1)
			if (err != nil) != c.err {
				t.Errorf("got error %v, want one: %v", err, c.err)
			}
			if got := leaseHolderInfos(info.Readers); !slices.Equal(got, c.readers) {
				t.Errorf("got readers %q, want %q", got, c.readers)
			}
		})
	}
}

// TestRWInspectReply: a reply that is not rw_inspect.lua's is an error
// naming the node, not a panic.
func TestRWInspectReply(t *testing.T) {
	good := []int64{1, 7, 5000, 0xabc, 0, 0, 7, 1, 0, 1, 'w', 1, 0xdef, 3000, 0}
	if n, ok := readRWInspect(good); !ok || n.HolderInfo != "w" || n.Token != 7 || len(n.Leases) != 1 || n.Leases[0].TTL != 3*time.Second || n.MaxMemoryPolicy != "noeviction" {
		t.Fatalf("a good reply: got %+v, %v", n, ok)
	}
	for _, bad := range [][]int64{
		nil,
		good[:9],
		good[:10],
		good[:11],
		good[:13],
		good[:14],
		append(slices.Clone(good), 1),
		append([]int64{3}, good[1:]...),
		{1, 7, 5000, 0xabc, 0, 0, 7, 1, 0, 8, 'w', 0},
		{0, 0, -2, 0, 0, 0, 0, -1, -1, 0, -1},
	} {
		n := rwNodeInfo(4, nodeReply{vals: bad})
		if n.Err == nil || !strings.HasPrefix(n.Err.Error(), "netlock: node 4: rw_inspect script: unexpected reply") || n.MaxMemory != -1 {
			t.Errorf("reply %v: got %+v, want node 4's error", bad, n)
		}
	}
}

// TestRWInspectPolicy: Inspect reports the server's maxmemory-policy as
// Inspect (the function) does.
func TestRWInspectPolicy(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		e.do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
		defer e.do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
		n := mustInspectRW(t, e.newRW(t, "doc")).Nodes[0]
		if n.MaxMemoryPolicy != "volatile-lru" || !n.Evicts() || n.MaxMemory != 0 {
			t.Errorf("got policy %q, evicts %v, maxmemory %d; want volatile-lru, true, 0", n.MaxMemoryPolicy, n.Evicts(), n.MaxMemory)
		}
	})
}
