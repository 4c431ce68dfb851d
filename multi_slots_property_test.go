package netlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// TestMultiSlotsProperty is TestMultiProperty for MultiMutexes whose names
// are in several hash slots, taken by the protocol of slotGroups: every
// client's Backends say they are a Redis Cluster (a Hub made with
// HubConfig.Cluster, listening on the client's own pub/sub connection), on
// 1, 3 and 5 miniredis nodes, which run scripts over keys of any slot. So
// NewMulti groups the names by slot, and the code under test is
// multi_slots.go over the ordinary engine, as on a Cluster (where
// TestMultiCluster runs it).
//
// MultiMutexes of overlapping sets spanning two to four slots (one slot
// holding two names), given in different orders, a MultiMutex of the two
// names of one slot (one script), and NetMutexes of single names, each a
// client of its own, go through random sequences of: TryLockCtx; LockCtx
// with a short deadline while a name is held; LockCtx cancelled at a random
// moment while the holders of its names unlock, in random order; LockCtx
// waiting while those holders unlock one by one; two to four LockCtx at
// once, of locks sharing names, while the holders of their names unlock
// (every one must lock, run a critical section and unlock: no deadlock,
// whatever the orders); UnlockCtx; ExtendCtx; the servers' time moved by up
// to half the expiry, every holder extending after it; and a holder's
// process crashing (every call it makes refused) with its keys expiring,
// after which the lock is a new process's.
//
// The model knows which lock holds each name, and every answer is checked
// against it. After every step, on every node, each name's key holds
// exactly its holder's token (on a quorum of the nodes at least), or is
// absent: nothing is left by an Unlock, a refused TryLockCtx, a cancelled
// or cut LockCtx (all or nothing); every waiters' queue is empty but for a
// LockCtx cut short on its way; Lost is open exactly while held. Critical
// sections of one name never overlap, and each name's tokens strictly
// increase, whoever takes it.
func TestMultiSlotsProperty(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			stats := &propStats{m: map[string]int{}}
			var steps atomic.Int64
			start := time.Now()
			rapid.Check(t, func(rt *rapid.T) { newSlotsMachine(rt, n, stats, &steps).run(rt) })
			redistest.Report(t, "MultiMutex over several slots, N=%d: %d steps explored in %v; outcomes %v", n, steps.Load(), time.Since(start).Round(time.Millisecond), stats)
		})
	}
}

// slotsPropNames are the names of TestMultiSlotsProperty: a, b and c each
// in a slot of its own, {t}:x and {t}:y together in a fourth.
var slotsPropNames = []string{"a", "b", "c", "{t}:x", "{t}:y"}

// slotsPropSets are the lock objects of TestMultiSlotsProperty, by their
// names: sets of several names are MultiMutexes, single names NetMutexes.
var slotsPropSets = [][]string{
	{"a", "b"}, {"b", "a"}, {"c", "{t}:x", "a"}, {"{t}:y", "c", "{t}:x", "b"}, {"b", "{t}:x", "a", "{t}:y", "c"},
	{"{t}:y", "{t}:x"}, // one slot: one script per node
	{"a"}, {"c"}, {"{t}:x"},
}

// slotsMachine is the model of TestMultiSlotsProperty, and the locks it
// drives.
type slotsMachine struct {
	nodes  []*miniredis.Miniredis
	pools  []*redis.Pool // every lock's, crashed or not
	locks  []*slotsPropLock
	gone   []*slotsPropLock  // crashed
	holder map[string]int    // name -> index in locks of its holder
	last   map[string]uint64 // name -> highest token seen
	stats  *propStats
	steps  *atomic.Int64
}

// A slotsPropLock is one lock object of the model (a MultiMutex or a
// NetMutex), of a process that may crash: then it is made again, as a new
// process's.
type slotsPropLock struct {
	names  []string
	try    func(context.Context) (bool, error)
	lock   func(context.Context) error
	unlock func(context.Context) error
	extend func(context.Context) error
	tokens func() []uint64
	lost   func() <-chan struct{}
	// waiters are the waiter ids of its engines (one per slot group),
	// which begin its members of the waiters' queues.
	waiters []string
	crashed *atomic.Bool // its Backends refuse every call
	held    bool
	cut     bool // a LockCtx of it was cut short by its ctx
}

func newSlotsMachine(rt *rapid.T, n int, stats *propStats, steps *atomic.Int64) *slotsMachine {
	if slot("a") == slot("b") || slot("a") == slot("c") || slot("b") == slot("c") || slot("{t}:x") != slot("{t}:y") || slices.Contains([]uint16{slot("a"), slot("b"), slot("c")}, slot("{t}:x")) {
		rt.Fatalf("slots of %q: want a, b, c and {t}:* each in its own", slotsPropNames)
	}
	mc := &slotsMachine{holder: map[string]int{}, last: map[string]uint64{}, stats: stats, steps: steps}
	for range n {
		s := miniredis.NewMiniRedis()
		if err := s.Start(); err != nil {
			rt.Fatal(err)
		}
		rt.Cleanup(s.Close)
		mc.nodes = append(mc.nodes, s)
	}
	// One cleanup, after the servers' (so it runs before them), unlocks
	// what is held and stops the crashed locks' watchdogs, then closes the
	// pools: an unlock on a closed pool would leave a release to reap.
	rt.Cleanup(func() {
		for _, l := range mc.locks {
			if l.held {
				l.unlock(context.Background())
			}
		}
		for _, l := range mc.gone {
			l.unlock(context.Background())
		}
		for _, p := range mc.pools {
			p.Close()
		}
	})
	for _, names := range slotsPropSets {
		mc.locks = append(mc.locks, mc.newLock(rt, names))
	}
	return mc
}

// newLock returns the lock object of names, as a process of its own: its
// own connections to every node.
func (mc *slotsMachine) newLock(rt *rapid.T, names []string) *slotsPropLock {
	l := &slotsPropLock{names: names, crashed: new(atomic.Bool)}
	backends := make([]Backend, len(mc.nodes))
	for j, s := range mc.nodes {
		addr := s.Addr()
		pool := &redis.Pool{MaxIdle: 4, DialContext: func(ctx context.Context) (redis.Conn, error) { return redis.DialContext(ctx, "tcp", addr) }}
		mc.pools = append(mc.pools, pool)
		b := NewRedigo(pool)
		backends[j] = slotsBackend{hubBackend: hubBackend{Backend: b, hub: NewHub(HubConfig{Listen: b.(Subscriber).Hub().listen, Cluster: true})}, crashed: l.crashed}
	}
	// A crashed process's releases are refused, and reported at Warn.
	opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
	if len(names) == 1 {
		m, err := New(names[0], backends, opts...)
		if err != nil {
			rt.Fatal(err)
		}
		l.try, l.lock, l.unlock, l.extend, l.lost = m.TryLockCtx, m.LockCtx, m.UnlockCtx, m.ExtendCtx, m.Lost
		l.tokens = func() []uint64 { return []uint64{m.Token()} }
		l.waiters = []string{m.waiterID}
		return l
	}
	mm, err := NewMulti(names, backends, opts...)
	if err != nil {
		rt.Fatal(err)
	}
	switch e := mm.m.(type) {
	case *slotGroups:
		for _, g := range e.groups {
			l.waiters = append(l.waiters, g.waiterID)
		}
	case oneSlot:
		l.waiters = []string{e.waiterID}
	}
	if several := slices.ContainsFunc(names, func(n string) bool { return slot(n) != slot(names[0]) }); several != (len(l.waiters) > 1) {
		rt.Fatalf("NewMulti(%q) on a Cluster: %d engines, want one per slot", names, len(l.waiters))
	}
	l.try, l.lock, l.unlock, l.extend, l.tokens, l.lost = mm.TryLockCtx, mm.LockCtx, mm.UnlockCtx, mm.ExtendCtx, mm.Tokens, mm.Lost
	return l
}

// slot returns the hash slot of name's lock key.
func slot(name string) uint16 { return keyspace.Slot(keyspace.New(DefaultPrefix, name, true).Lock) }

func (mc *slotsMachine) run(rt *rapid.T) {
	actions := map[string]func(*rapid.T){
		"tryLock":        mc.tryLock,
		"lockShort":      mc.lockShort,
		"lockCancelled":  mc.lockCancelled,
		"lockWhileFreed": mc.lockWhileFreed,
		"contend":        mc.contend,
		"unlock":         mc.unlock,
		"extend":         mc.extend,
		"moveTime":       mc.moveTime,
		"crash":          mc.crash,
	}
	for name, fn := range actions {
		actions[name] = func(rt *rapid.T) {
			fn(rt)
			mc.steps.Add(1)
			mc.stats.add(name)
		}
	}
	actions[""] = mc.check
	rt.Repeat(actions)
}

func (mc *slotsMachine) pick(rt *rapid.T) (int, *slotsPropLock) {
	i := rapid.IntRange(0, len(mc.locks)-1).Draw(rt, "lock")
	return i, mc.locks[i]
}

// blockers returns the locks that hold a name of names.
func (mc *slotsMachine) blockers(names []string) []int {
	var bs []int
	for _, name := range names {
		if h, ok := mc.holder[name]; ok && !slices.Contains(bs, h) {
			bs = append(bs, h)
		}
	}
	return bs
}

// took records that lock i now holds its names, and checks its tokens.
func (mc *slotsMachine) took(rt *rapid.T, i int) {
	l := mc.locks[i]
	l.held = true
	toks := l.tokens()
	if len(toks) != len(l.names) {
		rt.Fatalf("lock %d %q: Tokens() %v", i, l.names, toks)
	}
	for k, name := range l.names {
		if toks[k] <= mc.last[name] {
			rt.Fatalf("lock %d %q: token %d of %q after %d: must strictly increase", i, l.names, toks[k], name, mc.last[name])
		}
		if h, ok := mc.holder[name]; ok {
			rt.Fatalf("lock %d %q took %q, held by lock %d in the model", i, l.names, name, h)
		}
		mc.last[name] = toks[k]
		mc.holder[name] = i
	}
}

func (mc *slotsMachine) released(i int) {
	l := mc.locks[i]
	l.held = false
	for _, name := range l.names {
		delete(mc.holder, name)
	}
}

// unlockAll unlocks the locks bs in random order.
func (mc *slotsMachine) unlockAll(rt *rapid.T, bs []int) {
	for _, k := range rapid.Permutation(bs).Draw(rt, "unlock order") {
		if err := mc.locks[k].unlock(context.Background()); err != nil {
			rt.Fatalf("lock %d %q UnlockCtx: %v", k, mc.locks[k].names, err)
		}
		mc.released(k)
	}
}

func (mc *slotsMachine) tryLock(rt *rapid.T) {
	i, l := mc.pick(rt)
	if l.held {
		rt.Skip("held")
	}
	want := len(mc.blockers(l.names)) == 0
	ok, err := l.try(context.Background())
	if ok != want || err != nil {
		rt.Fatalf("lock %d %q TryLockCtx: got %v, %v; want %v, nil", i, l.names, ok, err, want)
	}
	if ok {
		mc.took(rt, i)
	}
}

func (mc *slotsMachine) lockShort(rt *rapid.T) {
	i, l := mc.pick(rt)
	if l.held || len(mc.blockers(l.names)) == 0 {
		rt.Skip("held, or free")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rapid.IntRange(1, 30).Draw(rt, "ms"))*time.Millisecond)
	defer cancel()
	// A deadline of a few milliseconds may pass before Redis answers on a
	// loaded machine: then the error says Redis could not be asked in time.
	if err := l.lock(ctx); !errors.Is(err, context.DeadlineExceeded) || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrQuorum)) {
		rt.Fatalf("lock %d %q LockCtx while held elsewhere: got %v, want DeadlineExceeded, and ErrNotObtained or ErrQuorum", i, l.names, err)
	}
	l.cut = true
}

// lockCancelled starts a LockCtx, cancels its ctx after a random time while
// the holders of its names (if any) unlock in random order: it either
// holds every name or none.
func (mc *slotsMachine) lockCancelled(rt *rapid.T) {
	i, l := mc.pick(rt)
	if l.held {
		rt.Skip("held")
	}
	bs := mc.blockers(l.names)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.lock(ctx) }()
	after := time.Duration(rapid.IntRange(0, 3000).Draw(rt, "cancel after µs")) * time.Microsecond
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		time.Sleep(after) // the moment of the cancel, not an ordering
		cancel()
	}()
	mc.unlockAll(rt, bs)
	err := within(rt, 10*time.Second, "a cancelled LockCtx returns", done)
	<-cancelled
	switch {
	case err == nil:
		mc.took(rt, i)
	case errors.Is(err, ErrNotObtained) && errors.Is(err, context.Canceled):
		l.cut = true
		mc.stats.add("lockCancelled: not obtained")
	default:
		rt.Fatalf("lock %d %q LockCtx cancelled: got %v, want nil or ErrNotObtained and Canceled", i, l.names, err)
	}
}

// lockWhileFreed starts a LockCtx of a lock whose names are held, waits
// until it has queued (on one node), then unlocks the holders one by one in
// random order: it must get in.
func (mc *slotsMachine) lockWhileFreed(rt *rapid.T) {
	i, l := mc.pick(rt)
	bs := mc.blockers(l.names)
	if l.held || len(bs) == 0 {
		rt.Skip("held, or free")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- l.lock(ctx) }()
	if len(mc.nodes) == 1 {
		// Over a quorum a waiter may not queue (see TestMultiProperty).
		eventually(rt, 5*time.Second, "the waiter queued", mc.queued)
	}
	mc.unlockAll(rt, bs)
	if err := <-done; err != nil {
		rt.Fatalf("lock %d %q LockCtx once its names were freed: %v", i, l.names, err)
	}
	mc.took(rt, i)
}

// contend starts LockCtx of two to four locks at once (sharing names,
// given in different orders), then unlocks the holders of their names in
// random order. Each must lock, run a critical section and unlock, within
// a bound: no deadlock, no two inside one name's section at once, and each
// name's tokens increasing in the order of the sections.
func (mc *slotsMachine) contend(rt *rapid.T) {
	var free []int
	for i, l := range mc.locks {
		if !l.held {
			free = append(free, i)
		}
	}
	if len(free) < 2 {
		rt.Skip("fewer than two locks free")
	}
	free = rapid.Permutation(free).Draw(rt, "contenders")
	free = free[:rapid.IntRange(2, min(4, len(free))).Draw(rt, "how many")]
	var union []string
	for _, i := range free {
		union = append(union, mc.locks[i].names...)
	}
	bs := mc.blockers(union)
	var mu sync.Mutex // guards inside, last and failures
	inside := map[string]int{}
	last := map[string]uint64{}
	for _, n := range slotsPropNames {
		last[n] = mc.last[n]
		if h, ok := mc.holder[n]; ok {
			inside[n] = h
		}
	}
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, i := range free {
		l := mc.locks[i]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := l.lock(ctx); err != nil {
				fail("lock %d %q LockCtx contended: %v", i, l.names, err)
				return
			}
			toks := l.tokens()
			mu.Lock()
			for k, n := range l.names {
				if h, ok := inside[n]; ok {
					failures = append(failures, fmt.Sprintf("lock %d %q entered %q, inside lock %d's section", i, l.names, n, h))
				}
				if toks[k] <= last[n] {
					failures = append(failures, fmt.Sprintf("lock %d %q: token %d of %q after %d", i, l.names, toks[k], n, last[n]))
				}
				inside[n], last[n] = i, toks[k]
			}
			mu.Unlock()
			time.Sleep(200 * time.Microsecond) // the section's length: an overlap shows
			mu.Lock()
			for _, n := range l.names {
				delete(inside, n)
			}
			mu.Unlock()
			if err := l.unlock(context.Background()); err != nil {
				fail("lock %d %q UnlockCtx contended: %v", i, l.names, err)
			}
		})
	}
	for _, k := range rapid.Permutation(bs).Draw(rt, "unlock order") {
		mu.Lock()
		for _, n := range mc.locks[k].names {
			delete(inside, n) // before the release: an overlap is never seen where there is none
		}
		mu.Unlock()
		if err := mc.locks[k].unlock(context.Background()); err != nil {
			rt.Fatalf("lock %d %q UnlockCtx: %v", k, mc.locks[k].names, err)
		}
		mc.released(k)
	}
	ended := make(chan error)
	go func() { wg.Wait(); close(ended) }()
	within(rt, 30*time.Second, "every contender locked and unlocked", ended)
	for _, f := range failures {
		rt.Error(f)
	}
	if len(failures) > 0 {
		rt.FailNow()
	}
	for n, tok := range last {
		mc.last[n] = tok
	}
}

func (mc *slotsMachine) unlock(rt *rapid.T) {
	i, l := mc.pick(rt)
	err := l.unlock(context.Background())
	switch {
	case l.held && err != nil:
		rt.Fatalf("lock %d %q UnlockCtx: %v", i, l.names, err)
	case !l.held && !errors.Is(err, ErrNotHeld):
		rt.Fatalf("lock %d %q UnlockCtx not held: got %v, want ErrNotHeld", i, l.names, err)
	}
	if l.held {
		mc.released(i)
	}
}

func (mc *slotsMachine) extend(rt *rapid.T) {
	i, l := mc.pick(rt)
	err := l.extend(context.Background())
	switch {
	case l.held && err != nil:
		rt.Fatalf("lock %d %q ExtendCtx: %v", i, l.names, err)
	case !l.held && !errors.Is(err, ErrNotHeld):
		rt.Fatalf("lock %d %q ExtendCtx not held: got %v, want ErrNotHeld", i, l.names, err)
	}
}

// moveTime moves every server's time on by up to half the expiry, and every
// holder extends: each keeps its names.
func (mc *slotsMachine) moveTime(rt *rapid.T) {
	d := time.Duration(rapid.Int64Range(1, int64(DefaultExpiry/2/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond
	for _, s := range mc.nodes {
		s.FastForward(d)
	}
	for i, l := range mc.locks {
		if !l.held {
			continue
		}
		if err := l.extend(context.Background()); err != nil {
			rt.Fatalf("lock %d %q ExtendCtx after the servers' time moved %v: %v", i, l.names, d, err)
		}
	}
}

// crash makes a holder's process die: its calls are refused from now on,
// and its keys expire (their TTL run down on every node). The lock object
// is a new process's afterwards. The old one is unlocked when the test
// ends, which stops its watchdog (its releases refused, as a dead
// process's).
func (mc *slotsMachine) crash(rt *rapid.T) {
	i, l := mc.pick(rt)
	if !l.held {
		rt.Skip("not held")
	}
	l.crashed.Store(true)
	for _, s := range mc.nodes {
		for _, n := range l.names {
			if key := keyspace.New(DefaultPrefix, n, true).Lock; s.Exists(key) {
				s.SetTTL(key, time.Millisecond)
			}
		}
		s.FastForward(time.Millisecond)
	}
	mc.gone = append(mc.gone, l)
	mc.released(i)
	mc.locks[i] = mc.newLock(rt, l.names)
}

// queued reports whether some name's waiters' queue has a member on the
// first node.
func (mc *slotsMachine) queued() bool {
	for _, name := range slotsPropNames {
		if members, _ := mc.nodes[0].ZMembers(keyspace.New(DefaultPrefix, name, true).Waiters); len(members) > 0 {
			return true
		}
	}
	return false
}

// unexplained reports whether member, found in a waiters' queue between
// steps, is not explained by a LockCtx cut short by its ctx (see
// multiMachine.unexplained).
func (mc *slotsMachine) unexplained(member string) bool {
	id, _, _ := strings.Cut(member, "+")
	for _, l := range mc.locks {
		if slices.Contains(l.waiters, id) {
			return !l.cut
		}
	}
	return true
}

// check compares every node's keys with the model (see TestMultiProperty's
// check).
func (mc *slotsMachine) check(rt *rapid.T) {
	for _, name := range slotsPropNames {
		ks := keyspace.New(DefaultPrefix, name, true)
		h, held := mc.holder[name]
		on := 0
		for j, s := range mc.nodes {
			v, err := s.Get(ks.Lock)
			switch {
			case !held && err == nil:
				rt.Fatalf("node %d: %s = %q, held by none in the model", j, ks.Lock, v)
			case held && err == nil:
				on++
				if f := strings.Split(v, ":"); len(f) < 2 || f[1] != strconv.FormatUint(mc.last[name], 10) { // "<value>:<token>:<holder>"
					rt.Fatalf("node %d: %s = %q, want token %d", j, ks.Lock, v, mc.last[name])
				}
			}
			if members, _ := s.ZMembers(ks.Waiters); slices.ContainsFunc(members, mc.unexplained) {
				rt.Fatalf("node %d: %s = %q between steps, want empty", j, ks.Waiters, members)
			}
		}
		if held && on < len(mc.nodes)/2+1 {
			rt.Fatalf("%s on %d of %d nodes, held by lock %d in the model", ks.Lock, on, len(mc.nodes), h)
		}
	}
	for i, l := range mc.locks {
		if l.held != isOpen(l.lost()) {
			rt.Fatalf("lock %d %q: held %v, Lost() open %v", i, l.names, l.held, isOpen(l.lost()))
		}
	}
}

// within returns what c gives, failing the test if it gives nothing within
// d: a hang becomes a failure that says what was awaited.
func within(rt *rapid.T, d time.Duration, what string, c <-chan error) error {
	rt.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-c:
		return err
	case <-t.C:
		rt.Fatalf("%s: not within %v", what, d)
		return nil
	}
}
