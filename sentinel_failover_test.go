package netlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

// The load of TestSentinelFailoverUnderLoad, per client library: workers
// that contend on a few names, and a probe that acquires names nobody
// else holds.
const (
	loadNames   = 8 // names the workers contend on
	loadWorkers = 6 // contending workers per client library
	// loadExpiry outlasts the outage of a SIGKILL (under 4s here, see
	// docs/deployments.md): a hold taken before the fault is then lost
	// only if the promoted replica misses it, not because no extend could
	// reach Redis in time.
	loadExpiry = 10 * time.Second
	// loadOutage lets a waiter ride out the whole failover.
	loadOutage = 30 * time.Second
	// Deadlines of the callers' contexts: a contending worker's LockCtx,
	// the probe's LockCtx, an ExtendCtx and an UnlockCtx.
	loadLockWait    = 5 * time.Second
	loadProbeWait   = 10 * time.Second
	loadExtendWait  = time.Second
	loadUnlockWait  = 2 * time.Second
	loadWork        = 100 * time.Millisecond // a critical section is up to this long
	loadPause       = 20 * time.Millisecond  // between a failed call and the next try
	loadSettleAfter = 500 * time.Millisecond // load kept on after recovery
	loadDeadline    = 40 * time.Second       // for the load to recover after the fault
	// loadLate bounds how long after its context's deadline a call may
	// return: a scheduler's delay on a loaded 2-core machine under -race,
	// not a node timeout (500ms) or an outage.
	loadLate = 500 * time.Millisecond
	// loadRecoveryMargin is what a recovery may take beyond Sentinel's
	// down-after-milliseconds (see recoveryBound).
	loadRecoveryMargin = 5 * time.Second
)

// loadClients are the Sentinel-aware client libraries of the load, all
// running at once against the same servers, as processes on different
// clients would.
var loadClients = []string{"rueidis", "goredis"}

// TestSentinelFailoverUnderLoad: a primary with two replicas and three
// sentinels, and clients on rueidis and go-redis Sentinel clients (one
// client per worker, as separate processes would have) holding and
// waiting on a few names while Sentinel fails the primary over, by
// SENTINEL FAILOVER or after a SIGKILL of the primary, with and without
// WithSyncReplicas(1). Each holder writes to an in-memory resource that
// sees every critical section of its name, then confirms its hold with
// ExtendCtx, riding out errors, before it leaves, and unlocks: a hold that
// Redis acknowledged before its client moved to the new primary is checked
// there by the confirming extend or the release. A probe per client
// library acquires names nobody else holds.
//
// It reports per scenario and client: holds that overlapped another
// client's (a hold missing on the promoted replica, given again), tokens
// the resource refused, holds lost, the time from the fault until a free
// name is acquired on the new primary, the longest wait for a free name,
// and the errors callers saw by kind. It asserts that no call returns
// more than loadLate after its context's deadline, that free names are
// acquired on the new primary, and waited for, within recoveryBound, and,
// after a SIGKILL with WithSyncReplicas(1), that no holds overlapped, no
// token was refused and no hold was gone on the new primary. A SENTINEL
// FAILOVER promotes a replica while the old primary still takes writes,
// which the other replica acknowledges until Sentinel moves it (see
// WithSyncReplicas): there its figures are reported, not asserted.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	for _, kind := range []string{forced, killed} {
		for _, replicas := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/replicas=%d", kind, replicas), func(t *testing.T) {
				l := runLoad(t, kind, replicas)
				for _, client := range loadClients {
					t.Run(client, func(t *testing.T) { l.check(t, client) })
				}
			})
		}
	}
}

// whoami replies with the port of the server it runs on: a probe runs it
// on its Backend to learn which server its client sends to.
var whoami = netlock.NewScript("whoami", `return {tonumber(string.match(redis.call('INFO', 'server'), 'tcp_port:(%d+)'))}`)

// loadRun is one scenario of TestSentinelFailoverUnderLoad.
type loadRun struct {
	kind     string
	replicas int
	names    []string
	res      map[string]*resource
	servers  map[string]*redistest.Server // by port

	mu      sync.Mutex
	fault   time.Time // zero until the fault
	primary string    // the new primary's port, once Sentinel names it
	named   chan struct{}
	clients map[string]*clientLoad
	again   string // what the sentinels said at the end, if not the primary of the failover
}

// clientLoad is what the workers and the probe of one client library saw.
type clientLoad struct {
	acquired   int // contending holds
	heldAfter  int // of those, begun after the new primary was named
	overlaps   int // holds begun while another client held the name and had not been told it lost it
	refused    int // holds whose token the resource refused: not above the highest it had seen
	spanned    int // holds begun before the fault and ended after it
	lost       int // holds lost: Lost closed, or ExtendCtx or UnlockCtx returned ErrLockLost
	spanLost   int // of spanned, lost
	reasons    map[netlock.LostReason]int
	errs       map[string]int // callers' errors by kind
	firstOther error          // the first error of kind "other"
	late       time.Duration  // the latest a call returned after its context's deadline
	lateCall   string
	probes     []probe
}

// probe is one acquire of a name nobody else holds.
type probe struct {
	start, acquired time.Time // start: the first attempt for the name
	// onNew: made after the fault, on the new primary: the probe's client
	// sent to it right after, and the key is there.
	onNew bool
}

// resource stands for what a lock protects: it sees every critical
// section of its name and, as a fenced resource would, refuses a token
// not above the highest it has seen.
type resource struct {
	mu      sync.Mutex
	holding []*section
	highest uint64
}

// section is one critical section.
type section struct {
	token uint64
	lost  <-chan struct{}
}

// enter begins h's critical section. It reports whether another client
// held the name then, not yet told it had lost it (an overlap: netlock
// closes Lost when a hold ends, so a holder whose Lost is closed is only
// late to leave), and whether h's token is refused.
func (r *resource) enter(h *section) (overlap, refused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.holding {
		select {
		case <-o.lost:
		default:
			overlap = true
		}
	}
	r.holding = append(r.holding, h)
	if h.token <= r.highest {
		return overlap, true
	}
	r.highest = h.token
	return overlap, false
}

func (r *resource) leave(h *section) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holding = slices.DeleteFunc(r.holding, func(o *section) bool { return o == h })
}

// errKind names what a caller's error matches, ErrNotReplicated first (it
// also matches ErrQuorum). ErrNotObtained is a wait for a held name that
// its deadline ended.
func errKind(err error) string {
	switch {
	case errors.Is(err, netlock.ErrNotReplicated):
		return "ErrNotReplicated"
	case errors.Is(err, netlock.ErrLockLost):
		return "ErrLockLost"
	case errors.Is(err, netlock.ErrQuorum):
		return "ErrQuorum"
	case errors.Is(err, netlock.ErrNotObtained):
		return "ErrNotObtained"
	}
	return "other"
}

var errKinds = []string{"ErrQuorum", "ErrNotReplicated", "ErrLockLost", "ErrNotObtained", "other"}

// runLoad starts the servers and the load, makes the fault, waits until
// the load has recovered on the new primary, and returns what it saw.
func runLoad(t *testing.T, kind string, replicas int) *loadRun {
	redistest.RequireSentinel(t)
	const master = "netlock"
	noDiskless := []string{"--repl-diskless-sync", "no"} // see sentinelRun
	p := redistest.Start(t, noDiskless...)
	l := &loadRun{kind: kind, replicas: replicas, res: map[string]*resource{}, servers: map[string]*redistest.Server{},
		named: make(chan struct{}), clients: map[string]*clientLoad{}}
	l.servers[portOf(p.Addr())] = p
	for range 2 {
		r := redistest.StartReplica(t, p.Addr(), noDiskless...)
		l.servers[portOf(r.Addr())] = r
	}
	s := redistest.StartSentinels(t, 3, master, p.Addr(), 2)

	for i := range loadNames {
		name := "load-" + strconv.Itoa(i)
		l.names = append(l.names, name)
		l.res[name] = &resource{}
	}
	for _, client := range loadClients {
		l.clients[client] = &clientLoad{reasons: map[netlock.LostReason]int{}, errs: map[string]int{}}
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	for _, client := range loadClients {
		for range loadWorkers {
			b := sentinelBackend(t, client, s.Addrs(), master)
			ms := map[string]*netlock.NetMutex{}
			for _, name := range l.names {
				ms[name] = l.mutex(t, client, name, b)
			}
			wg.Go(func() { l.contend(ctx, client, ms) })
		}
		b := sentinelBackend(t, client, s.Addrs(), master)
		wg.Go(func() { l.probe(ctx, client, b) })
	}

	// Load on the old primary first: every client has held names (as
	// many as it has workers) and acquired a free one.
	l.waitFor(t, "before the fault", func() bool {
		for _, c := range l.clients {
			if c.acquired < loadWorkers || len(c.probes) == 0 {
				return false
			}
		}
		return true
	})

	old := p.Addr()
	if kind == forced {
		// Sentinel refuses until it counts both replicas good: asked
		// every 100ms.
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			at := time.Now()
			err := s.Failover()
			if err == nil {
				l.setFault(at)
				break
			}
			if time.Since(start) > 20*time.Second {
				t.Fatalf("SENTINEL FAILOVER: %v", err)
			}
		}
	} else {
		l.setFault(time.Now())
		p.Kill()
	}
	next, err := s.WaitPrimary(old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.primary = portOf(next)
	l.mu.Unlock()
	close(l.named)

	// Recovered: every probe has acquired a free name on the new primary,
	// and every client has held a name since it was named.
	l.waitFor(t, "after the fault", func() bool {
		for _, c := range l.clients {
			if _, ok := c.recovery(l.fault); !ok || c.heldAfter == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(loadSettleAfter) // more load on the new primary
	stop()
	wg.Wait()
	// Sentinel may have failed the new primary over in its turn: a
	// primary that does not answer within down-after-milliseconds, on a
	// loaded machine, is down to it.
	if last, err := s.Primary(); err != nil || last != next {
		l.again = fmt.Sprintf("; Sentinel named %s (%v) at the end, not %s", last, err, next)
	}
	return l
}

// portOf returns the port of addr, "127.0.0.1:PORT".
func portOf(addr string) string {
	_, p, _ := strings.Cut(addr, ":")
	return p
}

// mutex returns a NetMutex of the load for name on b.
func (l *loadRun) mutex(t *testing.T, client, name string, b netlock.Backend) *netlock.NetMutex {
	t.Helper()
	m, err := l.newMutex(client, name, b, true)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// newMutex returns a NetMutex of the load for name on b, telling lost
// holds to client's figures if observe.
func (l *loadRun) newMutex(client, name string, b netlock.Backend, observe bool) (*netlock.NetMutex, error) {
	opts := []netlock.Option{
		netlock.WithSyncReplicas(l.replicas), netlock.WithExpiry(loadExpiry),
		netlock.WithOutageWindow(loadOutage), netlock.WithLogger(slog.New(slog.DiscardHandler)),
	}
	if observe {
		opts = append(opts, netlock.WithObserver(netlock.Observer{Lost: func(h netlock.LostHold) {
			l.mu.Lock()
			l.clients[client].reasons[h.Reason]++
			l.mu.Unlock()
		}}))
	}
	return netlock.New(name, []netlock.Backend{b}, opts...)
}

func (l *loadRun) setFault(at time.Time) {
	l.mu.Lock()
	l.fault = at
	l.mu.Unlock()
}

// waitFor polls done (called with l.mu held) until it holds, failing the
// test after loadDeadline.
func (l *loadRun) waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(loadDeadline)
	for {
		l.mu.Lock()
		ok := done()
		l.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the load did not get on within %v", what, loadDeadline)
		}
		time.Sleep(10 * time.Millisecond) // between looks
	}
}

// call records how a call whose context had deadline returned.
func (l *loadRun) call(client, what string, deadline time.Time, err error) {
	late := time.Since(deadline)
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.clients[client]
	if late > c.late {
		c.late, c.lateCall = late, fmt.Sprintf("%s: %v", what, err)
	}
	if err == nil {
		return
	}
	k := errKind(err)
	c.errs[k]++
	if k == "other" && c.firstOther == nil {
		c.firstOther = err
	}
}

// contend is a worker: it locks one of the names at random, holds it and
// unlocks it, until ctx ends.
func (l *loadRun) contend(ctx context.Context, client string, ms map[string]*netlock.NetMutex) {
	for ctx.Err() == nil {
		name := l.names[rand.N(len(l.names))]
		m := ms[name]
		lctx, cancel := context.WithTimeout(ctx, loadLockWait)
		err := m.LockCtx(lctx)
		deadline, _ := lctx.Deadline()
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.call(client, "LockCtx", deadline, err)
				time.Sleep(loadPause) // before the next try
			}
			continue
		}
		l.call(client, "LockCtx", deadline, nil)
		l.hold(client, name, m)
	}
}

// hold runs one critical section of name, held by m: it writes to the
// name's resource, works, confirms the hold, and unlocks.
func (l *loadRun) hold(client, name string, m *netlock.NetMutex) {
	h := &section{token: m.Token(), lost: m.Lost()}
	overlap, refused := l.res[name].enter(h)
	l.mu.Lock()
	c := l.clients[client]
	c.acquired++
	if l.primary != "" {
		c.heldAfter++
	}
	if overlap {
		c.overlaps++
	}
	if refused {
		c.refused++
	}
	before := l.fault.IsZero()
	l.mu.Unlock()

	work := time.NewTimer(rand.N(loadWork))
	select {
	case <-work.C:
	case <-h.lost:
		work.Stop()
	}
	lost := l.confirm(client, m, h.lost)
	l.res[name].leave(h)
	uctx, cancel := context.WithTimeout(context.Background(), loadUnlockWait)
	err := m.UnlockCtx(uctx)
	deadline, _ := uctx.Deadline()
	cancel()
	if lost && errors.Is(err, netlock.ErrLockLost) {
		err = nil // counted once, by confirm
	}
	l.call(client, "UnlockCtx", deadline, err)
	lost = lost || errors.Is(err, netlock.ErrLockLost)

	l.mu.Lock()
	defer l.mu.Unlock()
	if lost {
		c.lost++
	}
	if before && !l.fault.IsZero() {
		c.spanned++
		if lost {
			c.spanLost++
		}
	}
}

// confirm extends m's hold until an extend succeeds or the hold is lost,
// riding out errors (Redis down, replicas not acknowledging), so that a
// hold made on the old primary and held through the outage is checked on
// the new one. It reports whether the hold was lost. It ends by the hold's
// local deadline at the latest: ExtendCtx then returns ErrLockLost.
func (l *loadRun) confirm(client string, m *netlock.NetMutex, lost <-chan struct{}) bool {
	seen := map[string]bool{} // kinds of error: each counted once per confirm
	for {
		select {
		case <-lost:
			return true
		default:
		}
		ectx, cancel := context.WithTimeout(context.Background(), loadExtendWait)
		err := m.ExtendCtx(ectx)
		deadline, _ := ectx.Deadline()
		cancel()
		if err != nil && seen[errKind(err)] {
			l.call(client, "ExtendCtx", deadline, nil) // only how late it returned
		} else {
			l.call(client, "ExtendCtx", deadline, err)
		}
		if err != nil {
			seen[errKind(err)] = true
		}
		switch {
		case err == nil:
			return false
		case errors.Is(err, netlock.ErrLockLost):
			return true
		}
		time.Sleep(loadPause) // before the next try
	}
}

// probe acquires names nobody else holds, one after another, until ctx
// ends, riding out errors for each, and records when each was first tried
// and when it was acquired.
func (l *loadRun) probe(ctx context.Context, client string, b netlock.Backend) {
	for i := 0; ctx.Err() == nil; i++ {
		name := fmt.Sprintf("free-%s-%d", client, i)
		m, err := l.newMutex(client, name, b, false)
		if err != nil {
			l.call(client, "New", time.Now(), err)
			return
		}
		start := time.Now()
		for {
			lctx, cancel := context.WithTimeout(ctx, loadProbeWait)
			err = m.LockCtx(lctx)
			deadline, _ := lctx.Deadline()
			cancel()
			if ctx.Err() != nil {
				if err == nil {
					m.UnlockCtx(context.Background())
				}
				return
			}
			l.call(client, "probe LockCtx", deadline, err)
			if err == nil {
				break
			}
			time.Sleep(loadPause) // before the next try
		}
		pr := probe{start: start, acquired: time.Now()}
		l.mu.Lock()
		after := !l.fault.IsZero() && l.fault.Before(pr.start)
		l.mu.Unlock()
		if after {
			pr.onNew = l.onNew(ctx, b, "netlock:{"+name+"}")
		}
		l.mu.Lock()
		l.clients[client].probes = append(l.clients[client].probes, pr)
		l.mu.Unlock()
		uctx, cancel := context.WithTimeout(context.Background(), loadUnlockWait)
		err = m.UnlockCtx(uctx)
		deadline, _ := uctx.Deadline()
		cancel()
		l.call(client, "probe UnlockCtx", deadline, err)
		time.Sleep(loadPause) // between names
	}
}

// onNew reports whether the probe holding key made its acquire on the new
// primary: b's client sends to it right after, and the key is there. It
// asks b's client at once, before a switch to the new primary could make
// an acquire on the old one look made there, then waits for Sentinel to
// name the new primary.
func (l *loadRun) onNew(ctx context.Context, b netlock.Backend, key string) bool {
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	reply, err := b.Eval(wctx, whoami, nil, nil)
	cancel()
	if err != nil || len(reply) != 1 {
		return false
	}
	select {
	case <-l.named:
	case <-ctx.Done():
		return false
	}
	l.mu.Lock()
	primary := l.primary
	l.mu.Unlock()
	if strconv.FormatInt(reply[0], 10) != primary {
		return false
	}
	n, err := l.servers[primary].Do("EXISTS", key)
	return err == nil && n == "1"
}

// recovery returns the time from the fault until the first acquire of a
// free name on the new primary, and false if there was none yet. The
// caller holds l.mu.
func (c *clientLoad) recovery(fault time.Time) (time.Duration, bool) {
	for _, p := range c.probes {
		if p.onNew {
			return p.acquired.Sub(fault), true
		}
	}
	return 0, false
}

// longestWait returns the longest a probe waited for a free name, from its
// first try to the acquire.
func (c *clientLoad) longestWait() time.Duration {
	var longest time.Duration
	for _, p := range c.probes {
		longest = max(longest, p.acquired.Sub(p.start))
	}
	return longest
}

// recoveryBound bounds the time from the fault until a free name is
// acquired on the new primary. After a SIGKILL, the sentinels first wait
// SentinelDownAfter without an answer. Then loadRecoveryMargin: the
// sentinels agree the primary is down (they ask one another once a
// second), the one elected starts the failover after a random delay of up
// to a second, and it learns of the promotion and of the other replica
// following the new primary from INFO, once a second each, before it
// announces +switch-master; a client then reconnects, and with
// WithSyncReplicas the other replica resyncs before WAIT counts it. Here
// it all takes about 2.5s (docs/deployments.md).
func recoveryBound(kind string) time.Duration {
	if kind == killed {
		return redistest.SentinelDownAfter + loadRecoveryMargin
	}
	return loadRecoveryMargin
}

// check reports what client saw in l and asserts what must hold.
func (l *loadRun) check(t *testing.T, client string) {
	c := l.clients[client]
	recovery, recovered := c.recovery(l.fault)
	gone := c.reasons[netlock.LostExtend] + c.reasons[netlock.LostRelease]
	var errs []string
	for _, k := range errKinds {
		errs = append(errs, fmt.Sprintf("%s %d", k, c.errs[k]))
	}
	redistest.Report(t, "%s, WithSyncReplicas(%d), %s: %d holds, %d overlapping another client's, %d tokens refused, "+
		"%d lost (key gone on the new primary %d, deadline passed %d; of %d holds across the fault, %d); "+
		"a free name acquired on the new primary %v after the fault, longest wait for a free name %v; "+
		"errors: %s; latest return after a context's deadline %v%s",
		client, l.replicas, l.kind, c.acquired, c.overlaps, c.refused,
		c.lost, gone, c.reasons[netlock.LostDeadline], c.spanned, c.spanLost,
		recovery.Round(time.Millisecond), c.longestWait().Round(time.Millisecond),
		strings.Join(errs, ", "), c.late.Round(time.Millisecond), l.again)
	if c.firstOther != nil {
		t.Errorf("an error of no kind netlock names: %v", c.firstOther)
	}
	if c.late > loadLate {
		t.Errorf("a call returned %v after its context's deadline (%s), want at most %v", c.late, c.lateCall, loadLate)
	}
	bound := recoveryBound(l.kind)
	if !recovered || recovery > bound {
		t.Errorf("a free name acquired on the new primary %v after the fault (found: %v), want within %v", recovery, recovered, bound)
	}
	if wait := c.longestWait(); wait > bound {
		t.Errorf("a wait for a free name took %v, want at most %v", wait, bound)
	}
	// A hold lost at its deadline is not one the failover lost: with the
	// option, an extend that no replica acknowledges does not count, and
	// after a second failover (see runLoad) the new primary has no replica
	// until Sentinel converts the old one, seconds later.
	if l.kind == killed && l.replicas > 0 && (c.overlaps > 0 || c.refused > 0 || gone > 0) {
		t.Errorf("with WithSyncReplicas(%d), after a SIGKILL: %d holds overlapping another client's, %d tokens refused, %d holds gone on the new primary; want 0, 0 and 0",
			l.replicas, c.overlaps, c.refused, gone)
	}
}
