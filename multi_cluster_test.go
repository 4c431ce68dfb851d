package netlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// TestMultiCluster runs MultiMutexes on a real 3-master Redis Cluster
// through cluster clients (rueidis and the registered ones: sharded
// pub/sub): names in one slot lock and wait by message in one script per
// attempt; names in several slots are taken one slot at a time (see
// slotGroups). The subtests share the cluster and use distinct names.
func TestMultiCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	t.Cleanup(func() { waitRueidisDelayedCloses(t) })
	t.Run("OneSlot", func(t *testing.T) { testMultiClusterOneSlot(t, cluster) })
	t.Run("NoClusterHub", func(t *testing.T) { testMultiClusterNoHub(t, cluster) })
	t.Run("SlotsExclude", func(t *testing.T) { testMultiSlotsExclude(t, cluster) })
	t.Run("SlotsHoldNothingWhileWaiting", func(t *testing.T) { testMultiSlotsHoldNothing(t, cluster) })
	t.Run("SlotsCancel", func(t *testing.T) { testMultiSlotsCancel(t, cluster) })
	t.Run("SlotsWaitingCost", func(t *testing.T) { testMultiSlotsWaitingCost(t, cluster) })
	t.Run("SlotsNodeDown", func(t *testing.T) { testMultiSlotsNodeDown(t, cluster) })
	t.Run("SlotsOutageIsNotBusy", func(t *testing.T) { testMultiSlotsOutageIsNotBusy(t, cluster) })
	t.Run("SlotsLost", func(t *testing.T) { testMultiSlotsLost(t, cluster) })
}

// A Backend that does not say it is a Cluster (redigo on one node) is not
// refused by NewMulti; the server's CROSSSLOT comes back at once.
func testMultiClusterNoHub(t *testing.T, cluster *redistest.Cluster) {
	plain, err := NewMulti([]string{"a", "b"}, []Backend{newBackend(t, "redigo", cluster.Addrs()[0])})
	if err != nil {
		t.Fatalf("NewMulti on a redigo Backend: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := plain.LockCtx(ctx); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") || ctx.Err() != nil {
		t.Errorf("LockCtx of names in two slots on a Cluster node: got %v, want the server's CROSSSLOT error at once", err)
	}
}

func testMultiClusterOneSlot(t *testing.T, cluster *redistest.Cluster) {
	backend := func() Backend { return NewRueidis(newClusterClient(t, cluster)) }
	names := []string{"{order:7}:stock", "{order:7}:payment", "{order:7}:mail"}
	var s section
	var wg sync.WaitGroup
	const rounds = 10
	for i := range 3 {
		ns := append([]string(nil), names...)
		if i%2 == 1 {
			ns[0], ns[2] = ns[2], ns[0]
		}
		mm, err := NewMulti(ns, []Backend{backend()})
		if err != nil {
			t.Fatalf("NewMulti(%q): %v", ns, err)
		}
		if _, ok := mm.m.(oneSlot); !ok {
			t.Fatalf("NewMulti(%q) of one slot: got %T, want one script per node", ns, mm.m)
		}
		wg.Go(func() {
			for range rounds {
				mustLockMulti(t, mm)
				s.run(100 * time.Microsecond)
				mm.Unlock()
			}
		})
	}
	m, err := New(names[1], []Backend{backend()})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for range rounds {
			mustLock(t, m)
			s.run(100 * time.Microsecond)
			m.Unlock()
		}
	})
	wg.Wait()
	s.check(t, 4*rounds)
	probe, err := NewMulti(names, []Backend{backend()})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := probe.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("TryLockCtx after the others: got %v, %v; want true, nil", ok, err)
	}
	probe.Unlock()
}

// slotNames returns names of prefix in several slots: one on each master,
// and two sharing a hash tag (one slot).
func slotNames(t *testing.T, cluster *redistest.Cluster, prefix string) []string {
	t.Helper()
	return append(namesOnEveryMaster(t, cluster, prefix), "{"+prefix+"}:a", "{"+prefix+"}:b")
}

// newSlotsMulti returns NewMulti(names, []Backend{b}, opts...), checking
// that its names are taken one slot at a time.
func newSlotsMulti(t *testing.T, names []string, b Backend, opts ...Option) *MultiMutex {
	t.Helper()
	mm, err := NewMulti(names, []Backend{b}, opts...)
	if err != nil {
		t.Fatalf("NewMulti(%q): %v", names, err)
	}
	if _, ok := mm.m.(*slotGroups); !ok {
		t.Fatalf("NewMulti(%q) on a Cluster: got %T, want slot groups", names, mm.m)
	}
	return mm
}

// nameSections checks mutual exclusion per name, and that the tokens of
// each name's holds strictly increase in the order of its critical
// sections.
type nameSections struct {
	mu       sync.Mutex
	inside   map[string]bool
	tokens   map[string][]uint64
	overlaps int
	entered  int
}

func (s *nameSections) run(names []string, tokens []uint64) {
	s.mu.Lock()
	for i, n := range names {
		if s.inside[n] {
			s.overlaps++
		}
		s.inside[n] = true
		s.tokens[n] = append(s.tokens[n], tokens[i])
	}
	s.entered++
	s.mu.Unlock()
	time.Sleep(200 * time.Microsecond) // the section's length: an overlap shows
	s.mu.Lock()
	for _, n := range names {
		s.inside[n] = false
	}
	s.mu.Unlock()
}

// lockRounds locks l rounds times, each with a bound, and runs a section of
// names while it holds, with their tokens. what names l in errors.
func (s *nameSections) lockRounds(t *testing.T, what string, rounds int, l interface {
	LockCtx(context.Context) error
	UnlockCtx(context.Context) error
}, names []string, tokens func() []uint64) {
	for r := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := l.LockCtx(ctx)
		cancel()
		if err != nil {
			t.Errorf("%s, round %d: LockCtx: %v", what, r, err)
			return
		}
		s.run(names, tokens())
		if err := l.UnlockCtx(context.Background()); err != nil {
			t.Errorf("%s, round %d: UnlockCtx: %v", what, r, err)
		}
	}
}

func (s *nameSections) check(t *testing.T, want int) {
	t.Helper()
	if s.overlaps != 0 {
		t.Errorf("overlapping critical sections of one name: got %d, want 0", s.overlaps)
	}
	if s.entered != want {
		t.Errorf("critical sections: got %d, want %d", s.entered, want)
	}
	for n, toks := range s.tokens {
		for i := 1; i < len(toks); i++ {
			if toks[i] <= toks[i-1] {
				t.Errorf("%s: token %d after %d, want strictly increasing", n, toks[i], toks[i-1])
			}
		}
	}
}

// Several MultiMutexes of the same names in several slots, given in
// opposite orders, one shared by goroutines, and a NetMutex of each name,
// on cluster clients of every library: no two hold a name at once, none
// deadlocks, and each name's tokens strictly increase.
func testMultiSlotsExclude(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "excl")
	const rounds = 8
	s := &nameSections{inside: map[string]bool{}, tokens: map[string][]uint64{}}
	var wg sync.WaitGroup
	sections := 0
	for _, kind := range clusterKinds() {
		for i := range 2 {
			ns := slices.Clone(names)
			if i == 1 {
				slices.Reverse(ns)
			}
			mm := newSlotsMulti(t, ns, clusterBackend(t, kind, cluster))
			sections += rounds
			wg.Go(func() { s.lockRounds(t, fmt.Sprintf("%s MultiMutex %d", kind, i), rounds, mm, ns, mm.Tokens) })
		}
	}
	// Goroutines of one process sharing a MultiMutex queue for it locally.
	shared := newSlotsMulti(t, names, clusterBackend(t, "rueidis", cluster))
	for g := range 3 {
		sections += rounds
		wg.Go(func() {
			s.lockRounds(t, fmt.Sprintf("shared MultiMutex, goroutine %d", g), rounds, shared, names, shared.Tokens)
		})
	}
	for _, name := range names {
		m := newTestMutex(t, name, clusterBackend(t, "rueidis", cluster))
		sections += rounds
		tokens := func() []uint64 { return []uint64{m.Token()} }
		wg.Go(func() { s.lockRounds(t, "NetMutex "+name, rounds, m, []string{name}, tokens) })
	}
	redistest.Within(t, 90*time.Second, "every MultiMutex and NetMutex done", wg.Wait)
	s.check(t, sections)
	assertNothingHeld(t, cluster, names)
}

// assertNothingHeld fails the test if a lock key or a waiters' queue of
// names is left on the cluster.
func assertNothingHeld(t *testing.T, cluster *redistest.Cluster, names []string) {
	t.Helper()
	c := newClusterClient(t, cluster)
	for _, n := range names {
		for _, key := range []string{"netlock:{" + n + "}", "netlock:{" + n + "}:waiters"} {
			if clusterInt(t, c, c.B().Exists().Key(key).Build()) != 0 {
				t.Errorf("%s left behind", key)
			}
		}
	}
}

// heldKey reports whether name's lock key exists.
func heldKey(t testing.TB, cluster *redistest.Cluster, name string) bool {
	t.Helper()
	return heldOn(t, serverOf(t, cluster, "netlock:{"+name+"}"), name)
}

// heldOn reports whether name's lock key exists on s, the node that
// serves it.
func heldOn(t testing.TB, s *redistest.Server, name string) bool {
	t.Helper()
	key := "netlock:{" + name + "}"
	v, err := s.Do("EXISTS", key)
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return v == "1"
}

// queuedOn returns how many waiters are queued for name.
func queuedOn(t testing.TB, cluster *redistest.Cluster, name string) int {
	t.Helper()
	key := "netlock:{" + name + "}:waiters"
	v, err := serverOf(t, cluster, key).Do("ZCARD", key)
	if err != nil {
		t.Fatalf("ZCARD %s: %v", key, err)
	}
	n, _ := strconv.Atoi(v)
	return n
}

// serverOf returns the node of cluster that serves key.
func serverOf(t testing.TB, cluster *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	addr := ownerOf(t, cluster, key)
	for _, s := range cluster.Servers() {
		if s.Addr() == addr {
			return s
		}
	}
	t.Fatalf("no server %s", addr)
	return nil
}

// A MultiMutex waiting for a later slot's name, held by a NetMutex, holds
// none of the earlier slots' names meanwhile: a NetMutex of the first name
// locks at once, however long the wait.
func testMultiSlotsHoldNothing(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "fair")
	mm := newSlotsMulti(t, names, clusterBackend(t, "rueidis", cluster))
	groups := groupsOf(mm)
	first, second := groups[0][0], groups[1][0]
	later := newTestMutex(t, second, clusterBackend(t, "rueidis", cluster), WithExpiry(30*time.Second))
	mustLock(t, later)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- mm.LockCtx(ctx)
	}()
	eventually(t, 10*time.Second, "the MultiMutex queued for "+second, func() bool { return queuedOn(t, cluster, second) == 1 })
	for _, n := range groups[0] {
		if heldKey(t, cluster, n) {
			t.Errorf("%s held while the MultiMutex waits for %s", n, second)
		}
	}
	earlier := newTestMutex(t, first, clusterBackend(t, "rueidis", cluster))
	if ok, err := earlier.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("NetMutex %s TryLockCtx while the MultiMutex waits for %s: got %v, %v; want true, nil", first, second, ok, err)
	}
	mustUnlock(t, later)
	// The MultiMutex takes the second group by message, then finds first
	// held: it lets the second group go and waits for the first.
	eventually(t, 10*time.Second, "the MultiMutex queued for "+first, func() bool { return queuedOn(t, cluster, first) == 1 })
	for _, n := range groups[1] {
		if heldKey(t, cluster, n) {
			t.Errorf("%s held while the MultiMutex waits for %s", n, first)
		}
	}
	mustUnlock(t, earlier)
	redistest.Within(t, 10*time.Second, "the MultiMutex locked", func() {
		if err := <-done; err != nil {
			t.Fatalf("LockCtx: %v", err)
		}
	})
	for _, n := range names {
		if !heldKey(t, cluster, n) {
			t.Errorf("MultiMutex locked, but %s not held", n)
		}
	}
	toks := mm.Tokens()
	if len(toks) != len(names) || slices.Contains(toks, 0) {
		t.Errorf("Tokens: got %v, want %d non-zero tokens", toks, len(names))
	}
	if err := mm.UnlockCtx(context.Background()); err != nil {
		t.Fatalf("UnlockCtx: %v", err)
	}
	assertNothingHeld(t, cluster, names)
}

// A MultiMutex cancelled while it waits for its second slot's name leaves
// nothing: no name held, no place in a queue; and the names are free to
// take afterwards.
func testMultiSlotsCancel(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "cancel")
	mm := newSlotsMulti(t, names, clusterBackend(t, "rueidis", cluster))
	second := groupsOf(mm)[1][0]
	later := newTestMutex(t, second, clusterBackend(t, "rueidis", cluster), WithExpiry(30*time.Second))
	mustLock(t, later)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mm.LockCtx(ctx) }()
	eventually(t, 10*time.Second, "the MultiMutex queued for "+second, func() bool { return queuedOn(t, cluster, second) == 1 })
	cancel()
	var err error
	redistest.Within(t, 5*time.Second, "LockCtx returns after cancel", func() { err = <-done })
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNotObtained) {
		t.Errorf("LockCtx cancelled: got %v, want an error matching context.Canceled and ErrNotObtained", err)
	}
	if mm.Tokens() != nil {
		t.Errorf("Tokens after a cancelled LockCtx: got %v, want nil", mm.Tokens())
	}
	for _, n := range names {
		if n != second && heldKey(t, cluster, n) {
			t.Errorf("%s held after a cancelled LockCtx", n)
		}
		if q := queuedOn(t, cluster, n); q != 0 {
			t.Errorf("%s: %d queued after a cancelled LockCtx, want 0", n, q)
		}
	}
	mustUnlock(t, later)
	if ok, err := mm.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("TryLockCtx after the cancel: got %v, %v; want true, nil", ok, err)
	}
	mm.Unlock()
	assertNothingHeld(t, cluster, names)
}

// MultiMutexes waiting for a later slot's name wait by message: each costs
// the cluster at most one command per second (as TestWaitingCost counts
// them), and they all get in, one after the other, once the holder leaves.
func testMultiSlotsWaitingCost(t *testing.T, cluster *redistest.Cluster) {
	const waiters = 10
	window := DefaultExpiry + 2*time.Second
	names := slotNames(t, cluster, "cost")
	kinds := clusterKinds()
	mms := make([]*MultiMutex, waiters)
	for i := range mms {
		mms[i] = newSlotsMulti(t, names, clusterBackend(t, kinds[i%len(kinds)], cluster), WithRetryDelay(10*time.Second, 10*time.Second))
	}
	groups := groupsOf(mms[0])
	last := groups[len(groups)-1][0] // waited for after the others are taken and given back
	holder := newTestMutex(t, last, clusterBackend(t, "rueidis", cluster))
	mustLock(t, holder)
	var wg sync.WaitGroup
	var locked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, mm := range mms {
		wg.Go(func() {
			if err := mm.LockCtx(ctx); err != nil {
				t.Errorf("waiter %d: LockCtx: %v", i, err)
				return
			}
			locked.Add(1)
			mm.Unlock()
		})
	}
	eventually(t, 10*time.Second, "all waiters queued", func() bool { return queuedOn(t, cluster, last) == waiters })
	servers := cluster.Servers()
	total0, lib0 := commandCounts(t, servers)
	time.Sleep(window) // the window the commands are counted over
	total1, lib1 := commandCounts(t, servers)
	lib := lib1 - lib0
	ran := total1 - total0 - int64(len(servers)) - lib
	per := float64(ran) / waiters / window.Seconds()
	redistest.Report(t, "%d MultiMutexes of %d names in %d slots waiting for %v: %d commands of netlock's on the cluster, %.2f per waiter-second; the client libraries' own: %d",
		waiters, len(names), len(groups), window, ran, per, lib)
	if per > 1 {
		t.Errorf("waiting cost: got %.2f commands per waiter-second, want at most 1", per)
	}
	start := time.Now()
	mustUnlock(t, holder)
	redistest.Within(t, 20*time.Second, "every waiter locked in turn", wg.Wait)
	if locked.Load() != waiters {
		t.Errorf("waiters locked: got %d, want %d", locked.Load(), waiters)
	}
	// With a retry delay of 10s and an expiry of 8s, only messages let ten
	// waiters in one after the other this fast.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d waiters locked in %v after the release, want by message (well under the retry delay)", waiters, d)
	}
	assertNothingHeld(t, cluster, names)
}

// A MultiMutex whose second slot's master stops answering while it
// acquires rides the outage out until its ctx ends, then returns an error
// matching ErrQuorum and holds no name: the first slot's, taken, was
// released at once; the second's, which the master may run once it
// answers again, is released then.
func testMultiSlotsNodeDown(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "down")
	// A call to a stopped node that finds rueidis dialing it again (after
	// a call that timed out) waits for the dial, whatever its own context
	// says: with rueidis's defaults, up to ten seconds. Bounded here.
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:      cluster.Addrs(),
		DisableCache:     true,
		Dialer:           net.Dialer{Timeout: 300 * time.Millisecond},
		ConnWriteTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	mm := newSlotsMulti(t, names, NewRueidis(c), WithExpiry(3*time.Second), WithNodeTimeout(200*time.Millisecond))
	groups := groupsOf(mm)
	servers := map[string]*redistest.Server{} // asked before one is stopped
	for _, n := range names {
		servers[n] = serverOf(t, cluster, "netlock:{"+n+"}")
	}
	var stopped *redistest.Server
	var name string
	for _, g := range groups[1:] {
		if s := servers[g[0]]; s != servers[groups[0][0]] {
			stopped, name = s, g[0]
			break
		}
	}
	stopped.Pause()
	paused := true
	t.Cleanup(func() {
		if paused {
			stopped.Resume()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err = mm.LockCtx(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrQuorum) {
		t.Errorf("LockCtx with %s's master stopped: got %v, want an error matching context.DeadlineExceeded and ErrQuorum", name, err)
	}
	for _, n := range groups[0] {
		if heldOn(t, servers[n], n) {
			t.Errorf("%s held after the failed LockCtx", n)
		}
	}
	stopped.Resume()
	paused = false
	eventually(t, 10*time.Second, "no name held once the master answers", func() bool {
		for _, n := range names {
			if heldKey(t, cluster, n) || queuedOn(t, cluster, n) != 0 {
				return false
			}
		}
		return true
	})
	if ok, err := mm.TryLockCtx(context.Background()); !ok || err != nil {
		t.Fatalf("TryLockCtx once the master answers: got %v, %v; want true, nil", ok, err)
	}
	mm.Unlock()
}

// boundedRueidis returns a rueidis cluster client of its own whose dials
// and writes to a stopped master are bounded (see testMultiSlotsNodeDown).
func boundedRueidis(t *testing.T, cluster *redistest.Cluster) Backend {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:      cluster.Addrs(),
		DisableCache:     true,
		Dialer:           net.Dialer{Timeout: 300 * time.Millisecond},
		ConnWriteTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return NewRueidis(c)
}

// A MultiMutex over several slots tells an outage from a busy name as a
// NetMutex does (TestOutageIsNotBusy), by what its last attempt met: a
// LockCtx whose ctx ends while a name is held elsewhere matches
// ErrNotObtained, not ErrQuorum, also after an outage it rode out; one
// whose ctx ends while a slot's master does not answer matches ErrQuorum,
// not ErrNotObtained, also when it had found a name held before; and
// TryLockCtx with a master down matches ErrQuorum.
func testMultiSlotsOutageIsNotBusy(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "outage")
	b := boundedRueidis(t, cluster)
	mm := newSlotsMulti(t, names, b, WithExpiry(3*time.Second), WithNodeTimeout(200*time.Millisecond))
	groups := groupsOf(mm)
	master := func(name string) *redistest.Server { return serverOf(t, cluster, "netlock:{"+name+"}") }
	busy := groups[len(groups)-1][0] // held by a NetMutex
	var down *redistest.Server       // a master that does not serve busy
	for _, g := range groups {
		if s := master(g[0]); s != master(busy) {
			down = s
		}
	}
	holder := newTestMutex(t, busy, clusterBackend(t, "rueidis", cluster), WithExpiry(30*time.Second))
	lockFor := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return mm.LockCtx(ctx)
	}
	paused := false
	pause := func() { down.Pause(); paused = true }
	resume := func() { down.Resume(); paused = false }
	t.Cleanup(func() {
		if paused {
			down.Resume()
		}
	})

	mustLock(t, holder)
	wantErrs(t, "held elsewhere", lockFor(300*time.Millisecond), []error{ErrNotObtained, context.DeadlineExceeded}, []error{ErrQuorum})
	mustUnlock(t, holder)

	pause()
	wantErrs(t, "a master down", lockFor(2*time.Second), []error{ErrQuorum, context.DeadlineExceeded}, []error{ErrNotObtained})
	ok, err := mm.TryLockCtx(context.Background())
	if ok {
		t.Fatal("TryLockCtx with a master down: got true")
	}
	wantErrs(t, "TryLockCtx, a master down", err, []error{ErrQuorum}, []error{ErrNotObtained})
	resume()

	// Held, then the master down: the last attempt met the outage.
	mustLock(t, holder)
	done := make(chan error, 1)
	go func() { done <- lockFor(2500 * time.Millisecond) }()
	eventually(t, 5*time.Second, "the MultiMutex queued for "+busy, func() bool { return queuedOn(t, cluster, busy) == 1 })
	pause()
	mustUnlock(t, holder)
	wantErrs(t, "held elsewhere, then a master down", <-done, []error{ErrQuorum, context.DeadlineExceeded}, []error{ErrNotObtained})
	resume()

	// The master down, then back while a name is held: the last attempt
	// met the holder.
	pause()
	go func() { done <- lockFor(3 * time.Second) }()
	time.Sleep(800 * time.Millisecond) // the outage's length, not an ordering
	mustLock(t, holder)
	resume()
	wantErrs(t, "a master down, then back with a name held elsewhere", <-done, []error{ErrNotObtained, context.DeadlineExceeded}, []error{ErrQuorum})
	mustUnlock(t, holder)

	eventually(t, 10*time.Second, "no name held or queued for", func() bool {
		for _, n := range names {
			if heldKey(t, cluster, n) || queuedOn(t, cluster, n) != 0 {
				return false
			}
		}
		return true
	})
}

// One watchdog extends every slot's names; when one slot's master stops
// answering, that slot's hold is lost at its deadline and Lost is closed;
// Unlock reports ErrLockLost and releases the others.
func testMultiSlotsLost(t *testing.T, cluster *redistest.Cluster) {
	names := slotNames(t, cluster, "lost")
	const expiry = time.Second
	mm := newSlotsMulti(t, names, clusterBackend(t, "rueidis", cluster), WithExpiry(expiry), WithNodeTimeout(100*time.Millisecond))
	mustLockMulti(t, mm)
	lost := mm.Lost()
	// Held for twice the expiry: extended.
	select {
	case <-lost:
		t.Fatalf("Lost closed within %v of a hold extended by its watchdog", 2*expiry)
	case <-time.After(2 * expiry): // the hold's length, not an ordering
	}
	for _, n := range names {
		if !heldKey(t, cluster, n) {
			t.Errorf("%s not held after %v: not extended", n, 2*expiry)
		}
	}
	groups := groupsOf(mm)
	stopped := serverOf(t, cluster, "netlock:{"+groups[len(groups)-1][0]+"}")
	stopped.Pause()
	paused := true
	t.Cleanup(func() {
		if paused {
			stopped.Resume()
		}
	})
	redistest.Within(t, 3*expiry, "Lost closed", func() { <-lost })
	stopped.Resume()
	paused = false
	if err := mm.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Errorf("UnlockCtx after a slot was lost: got %v, want ErrLockLost", err)
	}
	eventually(t, 5*time.Second, "no name held after Unlock", func() bool {
		for _, n := range names {
			if heldKey(t, cluster, n) {
				return false
			}
		}
		return true
	})
}
