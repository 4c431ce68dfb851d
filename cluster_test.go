package netlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestCluster runs netlock on a real 3-master Redis Cluster through rueidis
// cluster clients. The subtests share the cluster and use distinct names.
func TestCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	// Runs after the subtests have closed their clients.
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	t.Run("ManyNames", func(t *testing.T) { testClusterManyNames(t, cluster) })
	t.Run("Fencing", func(t *testing.T) { testClusterFencing(t, cluster) })
	t.Run("MutualExclusion", func(t *testing.T) { testClusterMutualExclusion(t, cluster) })
	t.Run("ShardedWakeups", func(t *testing.T) { testClusterShardedWakeups(t, cluster) })
}

// failOnCrossSlot names a CROSSSLOT error, which would mean a script's keys
// were not all in one slot.
func failOnCrossSlot(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("%s: CROSSSLOT error: %v", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}

func testClusterManyNames(t *testing.T, cluster *redistest.Cluster) {
	client := newClusterClient(t, cluster)
	b := NewRueidis(client)
	const names = 50
	owners := map[string]int{}
	slots := map[uint16]bool{}
	for i := range names {
		name := fmt.Sprintf("many-%d", i)
		m, err := New(name, []Backend{b})
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		key := "netlock:{" + name + "}"
		if m.keys.lock != key {
			t.Fatalf("lock key of %q = %q, want %q", name, m.keys.lock, key)
		}
		slots[keySlot(key)] = true

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = m.LockCtx(ctx)
		cancel()
		failOnCrossSlot(t, "LockCtx("+name+")", err)
		if m.Token() == 0 {
			t.Errorf("%s: Token() = 0 with fencing on", name)
		}
		if n := clusterInt(t, client, client.B().Exists().Key(key).Build()); n != 1 {
			t.Fatalf("%s: EXISTS %s = %d while locked", name, key, n)
		}
		owners[ownerOf(t, cluster, key)]++

		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		err = m.ExtendCtx(ctx)
		cancel()
		failOnCrossSlot(t, "ExtendCtx("+name+")", err)
		if ms := clusterInt(t, client, client.B().Pttl().Key(key).Build()); ms <= 0 || ms > DefaultExpiry.Milliseconds() {
			t.Fatalf("%s: PTTL %s = %d after ExtendCtx, want in (0, %d]", name, key, ms, DefaultExpiry.Milliseconds())
		}

		failOnCrossSlot(t, "UnlockCtx("+name+")", m.UnlockCtx(context.Background()))
		if n := clusterInt(t, client, client.B().Exists().Key(key).Build()); n != 0 {
			t.Fatalf("%s: EXISTS %s = %d after unlock", name, key, n)
		}
	}
	if len(slots) < names-2 {
		t.Errorf("%d names fell in only %d slots", names, len(slots))
	}
	if len(owners) != len(cluster.Addrs()) {
		t.Errorf("names spread over %d nodes, want all %d: %v", len(owners), len(cluster.Addrs()), owners)
	}
	t.Logf("%d names in %d slots, per node: %v", names, len(slots), owners)
}

func testClusterFencing(t *testing.T, cluster *redistest.Cluster) {
	const name, clients, rounds = "fenced", 3, 10
	ms := make([]*NetMutex, clients)
	var check rueidis.Client
	for i := range ms {
		c := newClusterClient(t, cluster)
		check = c
		m, err := New(name, []Backend{NewRueidis(c)})
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		ms[i] = m
	}

	m := ms[0]
	lockSlot := clusterInt(t, check, check.B().ClusterKeyslot().Key(m.keys.lock).Build())
	fenceSlot := clusterInt(t, check, check.B().ClusterKeyslot().Key(m.keys.fence).Build())
	if lockSlot != fenceSlot || lockSlot != int64(keySlot(m.keys.lock)) {
		t.Fatalf("CLUSTER KEYSLOT: lock key %q in slot %d, fence key %q in slot %d; keySlot = %d",
			m.keys.lock, lockSlot, m.keys.fence, fenceSlot, keySlot(m.keys.lock))
	}
	if lockOwner, fenceOwner := ownerOf(t, cluster, m.keys.lock), ownerOf(t, cluster, m.keys.fence); lockOwner != fenceOwner {
		t.Fatalf("lock key on %s, fence key on %s", lockOwner, fenceOwner)
	}

	var last uint64
	for r := range rounds {
		for i, m := range ms {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := m.LockCtx(ctx)
			cancel()
			failOnCrossSlot(t, fmt.Sprintf("round %d, client %d: LockCtx", r, i), err)
			tok := m.Token()
			if tok <= last {
				t.Fatalf("round %d, client %d: token %d after %d, want strictly increasing", r, i, tok, last)
			}
			last = tok
			failOnCrossSlot(t, fmt.Sprintf("round %d, client %d: UnlockCtx", r, i), m.UnlockCtx(context.Background()))
		}
	}
	// Nothing else uses this slot meanwhile, so the counter is the last token.
	counter, err := check.Do(context.Background(), check.B().Get().Key(m.keys.fence).Build()).AsUint64()
	if err != nil || counter != last {
		t.Fatalf("GET %s = %d, %v; want the last token %d", m.keys.fence, counter, err, last)
	}
}

func testClusterMutualExclusion(t *testing.T, cluster *redistest.Cluster) {
	const name, clients, rounds = "excluded", 4, 20
	var s section
	var mu sync.Mutex
	var order []uint64 // tokens in the order of the critical sections
	var wg sync.WaitGroup
	for i := range clients {
		m, err := New(name, []Backend{NewRueidis(newClusterClient(t, cluster))})
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		wg.Go(func() {
			for r := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := m.LockCtx(ctx)
				cancel()
				if err != nil {
					t.Errorf("client %d, round %d: LockCtx: %v", i, r, err)
					return
				}
				mu.Lock()
				order = append(order, m.Token())
				mu.Unlock()
				s.run(200 * time.Microsecond)
				if err := m.UnlockCtx(context.Background()); err != nil {
					t.Errorf("client %d, round %d: UnlockCtx: %v", i, r, err)
					return
				}
			}
		})
	}
	redistest.Within(t, 60*time.Second, "4 clients x 20 rounds", wg.Wait)
	s.check(t, clients*rounds)
	for j := 1; j < len(order); j++ {
		if order[j] <= order[j-1] {
			t.Errorf("token %d granted after %d", order[j], order[j-1])
		}
	}
	client := newClusterClient(t, cluster)
	if n := clusterInt(t, client, client.B().Exists().Key("netlock:{"+name+"}").Build()); n != 0 {
		t.Errorf("lock key left behind after the last unlock")
	}
}

// Waiters of locks on every shard, on cluster clients of their own of each
// library, are woken by sharded messages: each Backend's Hub keeps one
// connection per master, subscribed (SSUBSCRIBE) to the channels of that
// master's slots; a release SPUBLISHes on the master it runs on, and no
// node runs PUBLISH. SPUBLISH counts the waiter's subscription there, so the
// release grants the head waiter the lock in its own script: no waiter
// attempts after its release.
func testClusterShardedWakeups(t *testing.T, cluster *redistest.Cluster) {
	names := namesOnEveryMaster(t, cluster, "sharded")
	opts := []Option{WithExpiry(30 * time.Second), WithRetryDelay(10*time.Second, 10*time.Second)}
	holder := clusterBackend(t, "rueidis", cluster)
	held := make([]*NetMutex, len(names))
	for i, name := range names {
		held[i] = newTestMutex(t, name, holder, opts...)
		mustLock(t, held[i])
	}
	type waiter struct {
		kind   string
		b      *countingBackend
		locked chan error
		m      *NetMutex
	}
	var ws []*waiter
	for _, kind := range clusterKinds() {
		b := counting(clusterBackend(t, kind, cluster))
		for _, name := range names {
			w := &waiter{kind: kind, b: b, locked: make(chan error, 1), m: newTestMutex(t, name, b, opts...)}
			go func() {
				err := w.m.LockCtx(context.Background())
				if err == nil {
					// Its release grants the lock to the next of the name's
					// waiters, whichever queued first.
					err = w.m.UnlockCtx(context.Background())
				}
				w.locked <- err
			}()
			ws = append(ws, w)
		}
	}
	eventually(t, 10*time.Second, "every waiter queued", func() bool {
		queued := 0
		for _, name := range names {
			for _, s := range cluster.Servers() {
				if v, err := s.Do("ZCARD", "netlock:{"+name+"}:waiters"); err == nil {
					n, _ := strconv.Atoi(v)
					queued += n
				}
			}
		}
		return queued == len(ws)
	})
	// One link per master on each waiting Backend, each subscribed to the
	// channels of its own master's slots.
	for i := 0; i < len(ws); i += len(names) { // one waiter of each Backend
		w := ws[i]
		h := w.b.Hub()
		h.mu.Lock()
		links := len(h.links)
		h.mu.Unlock()
		if links != len(names) {
			t.Errorf("%s: pub/sub links: got %d, want one per master, %d", w.kind, links, len(names))
		}
	}
	for _, w := range ws {
		owner := ownerOf(t, cluster, w.m.keys.lock)
		for _, s := range cluster.Servers() {
			want := "0"
			if s.Addr() == owner {
				want = "1"
			}
			if got, err := s.Do("PUBSUB", "SHARDNUMSUB", w.m.waitChan); err != nil || !strings.HasSuffix(got, "\n"+want) {
				t.Errorf("%s, %s: PUBSUB SHARDNUMSUB on %s: got %q, %v; want %s", w.kind, w.m.name, s.Addr(), got, err, want)
			}
		}
	}
	publish0, spublish0 := publishCalls(t, cluster)
	attempts := make([]int, len(ws))
	for i, w := range ws {
		attempts[i] = w.b.count("acquire")
	}
	for _, m := range held {
		mustUnlock(t, m)
	}
	// Each name's waiters lock in turn, each granted the lock by the
	// release of the one before.
	for i, w := range ws {
		redistest.Within(t, 10*time.Second, w.kind+" waiter of "+w.m.name, func() {
			if err := <-w.locked; err != nil {
				t.Errorf("%s, %s: LockCtx or UnlockCtx: %v", w.kind, w.m.name, err)
			}
		})
		if got := w.b.count("acquire") - attempts[i]; got != 0 {
			t.Errorf("%s, %s: attempts after the release: got %d, want 0 (a grant)", w.kind, w.m.name, got)
		}
	}
	publish, spublish := publishCalls(t, cluster)
	redistest.Report(t, "%d waiters on %d masters (%s): PUBLISH %d, SPUBLISH %d on the cluster's nodes while they were woken",
		len(ws), len(names), strings.Join(clusterKinds(), ", "), publish-publish0, spublish-spublish0)
	if publish != 0 || spublish-spublish0 < int64(len(ws)) {
		t.Errorf("PUBLISH %d since the cluster started, SPUBLISH %d while %d waiters were woken; want none, at least one each", publish, spublish-spublish0, len(ws))
	}
}
