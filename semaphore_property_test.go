package netlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/redistest"
)

// semPropMinSteps is how many actions TestSemProperty runs at least in a
// plain `go test` (rapid's checks are repeated, with fresh seeds, until it
// is reached). $NETLOCK_SEMPROP_SOAK (a duration such as 10m) repeats them
// for that long instead.
const semPropMinSteps = 20000

const semPropSoakEnv = "NETLOCK_SEMPROP_SOAK"

// TestSemProperty drives four processes (four Semaphores of one name, each
// on a Backend of its own) of a semaphore of random size 1..5 on one
// miniredis node through random sequences of TryAcquireCtx(n), Acquire(n)
// started on a goroutine of the process (up to two at once per process, so
// that a process's own waiters queue behind each other) and cancelled as
// another action, ReleaseCtx of permits a process holds (sometimes more:
// ErrNotHeld), processes crashing (nothing they send reaches the node any
// more; their lease and their waiter's place stay until they expire; a
// fresh process takes their place), time passing, and everyone leaving.
//
// Time. As in TestRWProperty, the node runs on a clock of its own (SetTime
// with ClockTTL: TIME, which the scripts read for the leases' deadlines and
// the waiters' places, and the keys' TTLs move together; FastForward would
// move only the TTLs), a microsecond per call. The processes' local clocks
// are the real clock: their leases are not auto-extended
// (WithAutoExtend(false)) and their expiry is long in real time, so that
// no lease lapses by the local clock during a check; when the node's clock
// moves (by whole seconds, at most an extend interval at once), every live
// process's lease is extended (as its watchdog would have done), and every
// waiter is told to look again (as its timer, set to the first lease's end,
// would have fired meanwhile), so that a crashed process's permits and
// place, once expired, go to the waiters that fit. Permits coming back by a
// release or a cancelled waiter are told by pub/sub alone.
//
// The model: after every action it predicts, by
// golang.org/x/sync/semaphore's rule over every process's waiters in order
// of arrival (the client's clock, read from the waiter itself), which
// waiters get in (as many at the head as fit, stopping at the first that
// does not or at a crashed process's place that has not expired), and waits
// (bounded) for exactly those to return. Releases grant in their scripts
// (see lua/sem_wake.lua): a wake reaching a crashed process's waiter that
// fits grants it (its permits stay out until the granted lease's deadline,
// the wake's time plus the expiry; its place is given up, or kept with "-"
// at its next waiter's arrival until it expires), or, if its entry no longer
// matches its lease (expired), tells it and goes on: the waiters after it
// then get in only by such a grant, never by their own attempts. Whether a
// wake ran is exact after a release (always) and after a waiter got in
// (its attempt or its grant woke), but not after a leave (it wakes only if
// its waiter was at the head, expired places included) or a refused attempt
// folding a grant in: there the model reads what was granted from Redis
// and checks it is sound (only entries a wake reaches, grantable crashed
// ones, never passing a live waiter that came first), and after a certain
// wake that every grantable crashed waiter a wake reaches was granted (see
// settle). It checks:
//   - no other waiter returned (a later waiter never passes an earlier one
//     still waiting; a cancelled one returns ErrNotObtained and
//     context.Canceled);
//   - TryAcquireCtx succeeds exactly when no waiter waits (here or in
//     Redis) and the permits fit;
//   - each live process's Held() is what the model says, and Lost() is
//     closed exactly when it holds none;
//   - the permits out in Redis (the live leases' counts and the grants
//     beside them, by the node's clock) never exceed the size and equal the
//     live processes' Held() plus the permits and grants of crashed
//     processes' leases not yet expired (those come back once the node's
//     clock passes their deadline);
//   - the queue in Redis holds, for each process with a waiter, its first
//     waiter's arrival, with an entry that says what it asks now (its
//     permits, its call's nonce, its next waiter's arrival: rewritten when
//     it changed, see queuedOK), and nothing else but crashed processes'
//     places, each where the model says (or kept with "-" once granted);
//   - everyone leaving (every waiter cancelled, every permit released, time
//     passing beyond every expiry and place) leaves no key behind, and a
//     fresh process takes every permit at once.
func TestSemProperty(t *testing.T) {
	soak := time.Duration(0)
	if v := os.Getenv(semPropSoakEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", semPropSoakEnv, v)
		}
		soak = d
	}
	var steps atomic.Int64
	stats := &propStats{m: map[string]int{}}
	start := time.Now()
	spent := func() bool {
		if soak > 0 {
			return time.Since(start) >= soak
		}
		return steps.Load() >= semPropMinSteps
	}
	failing := false
	for {
		rapid.Check(t, func(rt *rapid.T) {
			if spent() && !failing {
				return
			}
			rt.Cleanup(func() { failing = failing || rt.Failed() })
			checkSemModel(rt, stats, &steps)
		})
		if spent() || rapidReproducing() || t.Failed() {
			break
		}
	}
	redistest.Report(t, "Sem: %d steps explored in %v; outcomes %v", steps.Load(), time.Since(start).Round(time.Millisecond), stats)
}

// semPropOp is an Acquire running on a goroutine of its process.
type semPropOp struct {
	n       int64
	w       *localWaiter // the waiter in the process's local queue
	cancel  context.CancelFunc
	done    chan error
	started int // the order in which the model started it
}

// semPropProc is the model of one process (one Semaphore).
type semPropProc struct {
	id   int
	s    *Semaphore
	dead atomic.Bool
	pool *redis.Pool
	held int64
	ops  []*semPropOp // waiting Acquire calls, in the process's order
}

// semPropGone is what a crashed process left in Redis: its lease's permits
// until deadline, its waiter's place in the queue until place (ms, the
// node's clock), and what its entry says (see lua/sem_wake.lua). A wake
// (a release's, a leave's, a granted attempt's) that reaches its entry
// while it fits grants it, if its entry allows (the lease as its entry
// left it, no grant beside it): the permits go beside its lease (grant),
// whose deadline moves to the wake's time plus the expiry, and its place
// is given up, or kept (dash) at its next waiter's arrival, where it keeps
// every later waiter out until the place expires.
type semPropGone struct {
	id               int
	permits          int64 // its lease's count (taken-in grants included)
	grant            int64 // granted to its waiter after the crash
	deadline         int64
	member           string
	value, nonce     string // from its entry
	arrival, place   int64
	want             int64
	next             int64 // its entry's next waiter's arrival (0: none)
	flagG            bool  // its entry says its lease held permits
	hasG             bool  // a grant lies beside its lease (while it lives)
	dash             bool  // its place kept at next, flagged "-"
	queued, leaseSet bool
}

// semEntry parses a waiter's entry in the wants hash (the sequence number
// of the call that wrote it, a sixth field, is left out; a place kept with
// "-" has five).
func semEntry(w string) (n int64, value, nonce, flags string, next int64, ok bool) {
	f := strings.Split(w, ":")
	if len(f) != 5 && len(f) != 6 {
		return 0, "", "", "", 0, false
	}
	n, err1 := strconv.ParseInt(f[0], 10, 64)
	next, err2 := strconv.ParseInt(f[4], 10, 64)
	return n, f[1], f[2], f[3], next, err1 == nil && err2 == nil
}

// The model's constants.
const (
	semPropExpiry   = 20 * time.Second // model time; long in real time too
	semPropExpiryMS = int64(semPropExpiry / time.Millisecond)
	semPropPlaceMS  = int64(placeExpiries * semPropExpiry / time.Millisecond)
	semPropProcs    = 4
	semPropWait     = 10 * time.Second // bound on every wait for a goroutine
)

// checkSemModel runs one check of TestSemProperty: rapid draws the
// actions, and the invariants are checked after each.
func checkSemModel(rt *rapid.T, stats *propStats, steps *atomic.Int64) {
	mc := newSemMachine(rt, stats, steps)
	defer mc.close()
	rt.Repeat(mc.actions())
}

// semMachine is one check of TestSemProperty: the node, the processes, and
// the model every answer of theirs is checked against.
type semMachine struct {
	rt    *rapid.T
	stats *propStats
	steps *atomic.Int64 // the actions run, over every check

	size   int64
	node   *rwPropNode
	all    []*semPropProc // every process started, crashed ones included
	ps     []*semPropProc // the live processes, semPropProcs of them
	nextID int            // the next process's id
	nextOp int            // the next Acquire's order
	keys   []string       // leases, permits, queue, places, wants
	gone   []*semPropGone // what crashed processes left in Redis
	proc   *rapid.Generator[int]
	// lastQuiet: the node's clock when the model last settled; a grant made
	// since moved its lease's deadline to a time after it plus the expiry.
	lastQuiet int64
}

// newSemMachine starts the node and the processes of a semaphore of a
// drawn size.
func newSemMachine(rt *rapid.T, stats *propStats, steps *atomic.Int64) *semMachine {
	mc := &semMachine{rt: rt, stats: stats, steps: steps}
	mc.size = int64(rapid.IntRange(1, 5).Draw(rt, "size"))
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	mc.node = &rwPropNode{modelNode: &modelNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}, now: base}
	mc.node.srv.SetTime(base)
	mc.node.srv.ClockTTL(true)
	if err := mc.node.srv.Start(); err != nil {
		rt.Fatal(err)
	}
	mc.node.addr, mc.node.up = mc.node.srv.Addr(), true

	mc.ps = make([]*semPropProc, semPropProcs)
	for i := range mc.ps {
		mc.ps[i] = mc.newProc()
	}
	mc.keys = mc.ps[0].s.keys
	mc.lastQuiet = mc.nowMS()
	mc.proc = rapid.IntRange(0, semPropProcs-1)
	return mc
}

// close cancels every waiter, releases every permit, and stops the
// processes and the node.
func (mc *semMachine) close() {
	ctx := context.Background()
	for _, p := range mc.all {
		for _, op := range p.ops {
			op.cancel()
			select {
			case <-op.done:
			case <-time.After(semPropWait):
				mc.rt.Errorf("process %d: an Acquire did not return within %v of its cancel", p.id, semPropWait)
			}
		}
		if n := p.s.Held(); n > 0 {
			p.s.ReleaseCtx(ctx, n)
		}
		p.s.m.mu.Lock()
		lease := p.s.lease
		p.s.m.mu.Unlock()
		if lease != nil {
			lease.end()
		}
	}
	for _, p := range mc.all {
		p.pool.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range mc.all {
		for {
			p.s.m.reaper.mu.Lock()
			running := p.s.m.reaper.running
			p.s.m.reaper.mu.Unlock()
			p.s.m.mu.Lock()
			fixing := p.s.fixing
			p.s.m.mu.Unlock()
			if !running && !fixing {
				break
			}
			if time.Now().After(deadline) {
				mc.rt.Fatalf("process %d (dead %v): reaper running %v, resend queued %v after 10s (dirty %v, value %q, held %d)", p.id, p.dead.Load(), running, fixing, p.s.dirty, p.s.value, p.s.held)
			}
			time.Sleep(time.Millisecond) // between looks
		}
	}
	mc.node.srv.Close()
}

// actions are TestSemProperty's actions, by name, and its invariants ("").
func (mc *semMachine) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"TryAcquireCtx":   mc.tryAcquireCtx,
		"Acquire":         mc.acquire,
		"cancel a waiter": mc.cancelWaiter,
		"ReleaseCtx":      mc.releaseCtx,
		"crash a process": mc.crashProcess,
		"time passes":     mc.timePasses,
		"expiries pass":   mc.expiriesPass,
		"everyone leaves": mc.everyoneLeaves,
		"":                mc.check,
	}
}

// tryAcquireCtx: a process's TryAcquireCtx(n), n from 0 to the size.
func (mc *semMachine) tryAcquireCtx(rt *rapid.T) {
	ctx := context.Background()
	i := mc.proc.Draw(rt, "process")
	p := mc.ps[i]
	n := int64(rapid.IntRange(0, int(mc.size)).Draw(rt, "n"))
	want := n == 0 || !mc.anyWaiter() && mc.modelOut()+n <= mc.size
	ok, err := p.s.TryAcquireCtx(ctx, n)
	if err != nil {
		rt.Fatalf("process %d TryAcquireCtx(%d): %v", p.id, n, err)
	}
	if ok != want {
		rt.Fatalf("process %d TryAcquireCtx(%d): got %v, want %v (out %d of %d, waiters %v, own waiters %d)", p.id, n, ok, want, mc.modelOut(), mc.size, mc.anyWaiter(), len(p.ops))
	}
	if ok {
		p.held += n
	}
	mc.settle("TryAcquireCtx", false)
	mc.step(fmt.Sprintf("tryacquire/%v", ok))
}

// acquire: a process's Acquire(n) on a goroutine of its own (at most two
// at once per process), or Acquire(0).
func (mc *semMachine) acquire(rt *rapid.T) {
	ctx := context.Background()
	i := mc.proc.Draw(rt, "process")
	p := mc.ps[i]
	n := int64(rapid.IntRange(0, int(mc.size)).Draw(rt, "n"))
	if n == 0 {
		if err := p.s.Acquire(ctx, 0); err != nil {
			rt.Fatalf("process %d Acquire(0): %v", p.id, err)
		}
		mc.step("acquire/0")
		return
	}
	if len(p.ops) >= 2 {
		mc.step("acquire/busy")
		return
	}
	actx, cancel := context.WithCancel(ctx)
	op := &semPropOp{n: n, cancel: cancel, done: make(chan error, 1), started: mc.nextOp}
	mc.nextOp++
	s := p.s
	s.m.mu.Lock()
	before := s.line()
	s.m.mu.Unlock()
	go func() { op.done <- s.Acquire(actx, n) }()
	// Wait for it in the local queue (its arrival is then set),
	// or for its return.
	deadline := time.Now().Add(semPropWait)
	for op.w == nil {
		s.m.mu.Lock()
		for _, w := range s.line() {
			if !slices.Contains(before, w) {
				op.w = w
			}
		}
		s.m.mu.Unlock()
		if op.w != nil {
			break
		}
		select {
		case err := <-op.done:
			op.done <- err
			// In and out already: it arrived last.
			if err != nil {
				rt.Fatalf("process %d Acquire(%d): %v", p.id, n, err)
			}
			op.w = &localWaiter{n: n, arrival: time.Now().UnixMicro()}
		default:
		}
		if time.Now().After(deadline) {
			rt.Fatalf("process %d Acquire(%d) neither queued nor returned within %v", p.id, n, semPropWait)
		}
		time.Sleep(50 * time.Microsecond) // between looks
	}
	p.ops = append(p.ops, op)
	mc.settle(fmt.Sprintf("process %d Acquire(%d)", p.id, n), false)
	if slices.Contains(p.ops, op) {
		mc.step("acquire/waits")
	} else {
		mc.step("acquire/in at once")
	}
}

// cancelWaiter cancels a waiting Acquire.
func (mc *semMachine) cancelWaiter(rt *rapid.T) {
	var is []int
	for i, p := range mc.ps {
		if len(p.ops) > 0 {
			is = append(is, i)
		}
	}
	if len(is) == 0 {
		mc.step("cancel/none")
		return
	}
	p := mc.ps[is[rapid.IntRange(0, len(is)-1).Draw(rt, "waiting process")]]
	k := rapid.IntRange(0, len(p.ops)-1).Draw(rt, "waiter")
	op := p.ops[k]
	op.cancel()
	err := mc.waitOp(op, fmt.Sprintf("process %d's cancelled Acquire(%d)", p.id, op.n))
	if err == nil {
		rt.Fatalf("process %d's cancelled Acquire(%d) got in, while the model says it waits", p.id, op.n)
	}
	mc.checkErr("cancelled Acquire", err)
	if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
		rt.Fatalf("process %d's cancelled Acquire(%d): %v, want ErrNotObtained and context.Canceled", p.id, op.n, err)
	}
	mc.removeOp(p, op)
	mc.settle(fmt.Sprintf("process %d's Acquire(%d) cancelled", p.id, op.n), false)
	mc.step(fmt.Sprintf("cancel/first=%v", k == 0))
}

// releaseCtx: a process's ReleaseCtx of permits it holds, or of more
// (ErrNotHeld).
func (mc *semMachine) releaseCtx(rt *rapid.T) {
	ctx := context.Background()
	p := mc.ps[mc.holder()]
	if p.held == 0 || rapid.IntRange(0, 9).Draw(rt, "too many") == 0 {
		n := p.held + 1
		if err := p.s.ReleaseCtx(ctx, n); !errors.Is(err, ErrNotHeld) {
			rt.Fatalf("process %d ReleaseCtx(%d) holding %d: %v, want ErrNotHeld", p.id, n, p.held, err)
		}
		mc.step("release/notheld")
		return
	}
	n := int64(rapid.IntRange(1, int(p.held)).Draw(rt, "n"))
	if err := p.s.ReleaseCtx(ctx, n); err != nil {
		rt.Fatalf("process %d ReleaseCtx(%d) holding %d: %v", p.id, n, p.held, err)
	}
	p.held -= n
	mc.settle(fmt.Sprintf("process %d ReleaseCtx(%d)", p.id, n), true)
	mc.step(fmt.Sprintf("release/all=%v", p.held == 0))
}

// crashProcess crashes a process (see crash).
func (mc *semMachine) crashProcess(rt *rapid.T) {
	mc.crash(mc.proc.Draw(rt, "process"))
	mc.settle("crash", false)
}

// timePasses moves the node's clock by 1 to 6 seconds.
func (mc *semMachine) timePasses(rt *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 6).Draw(rt, "seconds")) * time.Second
	mc.advance(d)
	mc.prune()
	mc.step("time passes")
}

// expiriesPass moves the node's clock beyond a lease's expiry, sometimes
// beyond a place's.
func (mc *semMachine) expiriesPass(rt *rapid.T) {
	d := semPropExpiry + time.Second
	if rapid.Bool().Draw(rt, "places too") {
		d = placeExpiries*semPropExpiry + time.Second
	}
	mc.advance(d)
	mc.prune()
	mc.step(fmt.Sprintf("expiries pass/%v", d))
}

// everyoneLeaves cancels every waiter (the last arrived first: a waiter
// leaving wakes nobody behind it then), releases every permit, and lets
// every expiry and place pass: no key is left, and a fresh process takes
// every permit at once.
func (mc *semMachine) everyoneLeaves(rt *rapid.T) {
	ctx := context.Background()
	for {
		var last *semPropOp
		var lp *semPropProc
		for _, p := range mc.ps {
			for _, op := range p.ops {
				if last == nil || op.w.arrival > last.w.arrival {
					last, lp = op, p
				}
			}
		}
		if last == nil {
			break
		}
		last.cancel()
		if err := mc.waitOp(last, "everyone leaves"); err == nil {
			rt.Fatalf("everyone leaves: process %d's cancelled Acquire(%d) got in", lp.id, last.n)
		}
		mc.removeOp(lp, last)
	}
	released := false
	for _, p := range mc.ps {
		if p.held > 0 {
			released = true
			if err := p.s.ReleaseCtx(ctx, p.held); err != nil {
				rt.Fatalf("everyone leaves: process %d ReleaseCtx(%d): %v", p.id, p.held, err)
			}
			p.held = 0
		}
	}
	mc.settle("everyone leaves", released)
	mc.advance(placeExpiries*semPropExpiry + semPropExpiry + time.Second)
	mc.prune()
	if len(mc.gone) > 0 {
		rt.Fatalf("everyone leaves: %d crashed processes' leases or places left in the model", len(mc.gone))
	}
	for _, k := range mc.keys {
		if mc.node.srv.Exists(k) {
			rt.Fatalf("everyone leaves: key %s left behind after every expiry and place", k)
		}
	}
	p := mc.ps[mc.proc.Draw(rt, "fresh")]
	ok, err := p.s.TryAcquireCtx(ctx, mc.size)
	if !ok || err != nil {
		rt.Fatalf("everyone leaves: TryAcquireCtx(%d) of a free semaphore: %v, %v (stranded?)", mc.size, ok, err)
	}
	p.held = mc.size
	mc.settle("everyone leaves, then a fresh TryAcquireCtx", false)
	mc.step("everyone leaves")
}

// check checks the invariants: each process's Held and Lost, the permits
// out in Redis, and the queue and the entries in it.
func (mc *semMachine) check(rt *rapid.T) {
	for _, p := range mc.ps {
		if got := p.s.Held(); got != p.held {
			rt.Fatalf("process %d Held() %d, model says %d", p.id, got, p.held)
		}
		lost := false
		select {
		case <-p.s.Lost():
			lost = true
		default:
		}
		if lost != (p.held == 0) {
			rt.Fatalf("process %d: Lost() closed %v, holding %d", p.id, lost, p.held)
		}
	}
	out, want := mc.redisOut(), mc.modelOut()
	if out > mc.size {
		rt.Fatalf("%d permits out in Redis, size %d", out, mc.size)
	}
	if out != want {
		rt.Fatalf("%d permits out in Redis, the model says %d (live processes hold %v)", out, want, heldOf(mc.ps))
	}
	if ok, why := mc.queuedOK(); !ok {
		rt.Fatal(why)
	}
	// Nothing else queued but crashed processes' places.
	members, _ := mc.node.srv.ZMembers(mc.keys[2])
	now := mc.nowMS()
	for _, m := range members {
		known := false
		for _, p := range mc.ps {
			known = known || len(p.ops) > 0 && p.s.m.waiterID == m
		}
		for _, g := range mc.gone {
			known = known || g.queued && g.member == m
		}
		if pl, err := mc.node.srv.ZScore(mc.keys[3], m); !known && err == nil && int64(pl) > now {
			rt.Fatalf("waiter %s queued in Redis with a live place, but nobody waits", m)
		}
	}
	// Crashed processes' places not yet expired: where the model
	// says, as their entries were left, or kept with "-" at their
	// next waiter's arrival once granted.
	for _, g := range mc.ghostsLive() {
		sc, err := mc.node.srv.ZScore(mc.keys[2], g.member)
		pl, err2 := mc.node.srv.ZScore(mc.keys[3], g.member)
		raw := mc.node.srv.HGet(mc.keys[4], g.member)
		n, _, _, flags, next, _ := semEntry(raw)
		switch {
		case err != nil || err2 != nil || int64(sc) != g.arrival || int64(pl) != g.place:
			rt.Fatalf("crashed process %d's place: queued at %v (%v) until %v (%v), the model says at %d until %d; %s", g.id, int64(sc), err, int64(pl), err2, g.arrival, g.place, mc.dump())
		case g.dash && raw != "0:::-:0":
			rt.Fatalf("crashed process %d's place kept for its next waiter: entry %q, want \"0:::-:0\"", g.id, raw)
		case !g.dash && (n != g.want || next != g.next || flags == "-"):
			rt.Fatalf("crashed process %d's entry %q, the model says %d permits, next %d", g.id, raw, g.want, g.next)
		}
	}
}

// newProc starts a process, on a pool of its own.
func (mc *semMachine) newProc() *semPropProc {
	p := &semPropProc{id: mc.nextID}
	mc.nextID++
	p.pool = mc.node.newPool()
	s, err := NewSemaphore("semprop", mc.size, []Backend{&rwPropBackend{wrapper: wrapper{Backend: NewRedigo(p.pool)}, node: mc.node, dead: &p.dead}},
		WithExpiry(semPropExpiry), WithAutoExtend(false), WithNodeTimeout(5*time.Second),
		WithRetryDelay(time.Millisecond, 2*time.Millisecond))
	if err != nil {
		mc.rt.Fatal(err)
	}
	p.s = s
	mc.all = append(mc.all, p)
	return p
}

// waitOp waits (bounded) for op to return, and returns its error.
func (mc *semMachine) waitOp(op *semPropOp, what string) error {
	select {
	case err := <-op.done:
		op.done <- err // for a later look
		return err
	case <-time.After(semPropWait):
		mc.rt.Fatalf("%s: the Acquire did not return within %v; %s", what, semPropWait, mc.dump())
	}
	return nil
}

// step counts an action done, by its outcome.
func (mc *semMachine) step(name string) {
	mc.steps.Add(1)
	mc.stats.add(name)
}

// nowMS is the node's clock, in ms.
func (mc *semMachine) nowMS() int64 {
	return mc.node.nowMS()
}

// modelOut: the permits out by the model: the live processes' and the
// crashed processes' leases not yet expired.
func (mc *semMachine) modelOut() int64 {
	var out int64
	for _, p := range mc.ps {
		out += p.held
	}
	now := mc.nowMS()
	for _, g := range mc.gone {
		if g.leaseSet && g.deadline > now {
			out += g.permits + g.grant
		}
	}
	return out
}

// redisOut: the permits out in Redis: the live leases' counts and the
// grants beside them, "<nonce>:<n>" (see lua/sem_wake.lua).
func (mc *semMachine) redisOut() int64 {
	members, _ := mc.node.srv.ZMembers(mc.keys[0])
	now := mc.nowMS()
	var out int64
	for _, v := range members {
		dl, err := mc.node.srv.ZScore(mc.keys[0], v)
		if err != nil || int64(dl) <= now {
			continue
		}
		n, _ := strconv.ParseInt(mc.node.srv.HGet(mc.keys[1], v), 10, 64)
		out += n
		if g := mc.node.srv.HGet(mc.keys[1], v+"#g"); g != "" {
			_, c, _ := strings.Cut(g, ":")
			n, _ := strconv.ParseInt(c, 10, 64)
			out += n
		}
	}
	return out
}

// ghostsLive: crashed processes' places in the queue not yet expired.
func (mc *semMachine) ghostsLive() []*semPropGone {
	var gs []*semPropGone
	now := mc.nowMS()
	for _, g := range mc.gone {
		if g.queued && g.place > now {
			gs = append(gs, g)
		}
	}
	return gs
}

// modelDump describes the model, for a failure's message.
func (mc *semMachine) modelDump() string {
	var b strings.Builder
	for _, p := range mc.ps {
		p.s.m.mu.Lock()
		fmt.Fprintf(&b, "process %d (member %s, lease %s held %d, Held %d, local queue %d): ", p.id, p.s.m.waiterID, p.s.value, p.held, p.s.held, len(p.s.line()))
		p.s.m.mu.Unlock()
		for _, op := range p.ops {
			fmt.Fprintf(&b, "#%d Acquire(%d) at %d; ", op.started, op.n, op.w.arrival)
		}
	}
	for _, g := range mc.gone {
		fmt.Fprintf(&b, "crashed %d: %+v; ", g.id, *g)
	}
	return b.String()
}

// dump describes Redis and the model, for a failure's message.
func (mc *semMachine) dump() string {
	return fmt.Sprintf("Redis (now %d): %s; model: %s", mc.nowMS(), semDump(mc.node.srv, mc.keys), mc.modelDump())
}

// anyWaiter reports whether a process waits, or a crashed process's
// place that has not expired is queued.
func (mc *semMachine) anyWaiter() bool {
	if len(mc.ghostsLive()) > 0 {
		return true
	}
	for _, p := range mc.ps {
		if len(p.ops) > 0 {
			return true
		}
	}
	return false
}

// predict: the waiters that get in now, by x/sync's rule over every
// process's waiters in order of arrival.
func (mc *semMachine) predict() []semPropEntry {
	var es []semPropEntry
	for _, p := range mc.ps {
		for _, op := range p.ops {
			es = append(es, semPropEntry{arrival: op.w.arrival, op: op, p: p})
		}
	}
	for _, g := range mc.ghostsLive() {
		es = append(es, semPropEntry{arrival: g.arrival, ghost: true})
	}
	slices.SortStableFunc(es, func(a, b semPropEntry) int {
		switch {
		case a.arrival < b.arrival:
			return -1
		case a.arrival > b.arrival:
			return 1
		}
		return 0
	})
	out := mc.modelOut()
	var in []semPropEntry
	for _, e := range es {
		if e.ghost || out+e.op.n > mc.size {
			break
		}
		out += e.op.n
		in = append(in, e)
	}
	return in
}

// removeOp forgets op, returned, from p's waiting calls.
func (mc *semMachine) removeOp(p *semPropProc, op *semPropOp) {
	p.ops = slices.DeleteFunc(p.ops, func(o *semPropOp) bool { return o == op })
}

// checkErr fails the check unless err matches a documented sentinel.
func (mc *semMachine) checkErr(what string, err error) {
	if !documented(err) {
		mc.rt.Fatalf("%s: error %v matches no documented sentinel", what, err)
	}
}

// grantedLive reports whether a wake granted p's first waiter (by the
// model, still waiting): its process took the grant in (or its call
// returned), or it lies in Redis beside the lease, under a nonce other
// than that of a grant taken in already.
func (mc *semMachine) grantedLive(p *semPropProc) bool {
	if len(p.ops) == 0 {
		return false
	}
	select {
	case err := <-p.ops[0].done:
		p.ops[0].done <- err
		return true
	default:
	}
	p.s.m.mu.Lock()
	value := p.s.value
	p.s.m.mu.Unlock()
	gv := mc.node.srv.HGet(mc.keys[1], value+"#g")
	p.s.m.mu.Lock()
	sheld, fold := p.s.held, p.s.fold
	p.s.m.mu.Unlock()
	return sheld > p.held || value != "" && gv != "" && !strings.HasPrefix(gv, fold+":")
}

// queuedOK reports whether the queue in Redis holds, for every live
// process with a waiter, its first waiter's arrival with a live place,
// and an entry that says what it asks now: its first waiter's permits,
// the lease value and nonce of its call, its next waiter's arrival (0
// if none), not a place kept with "-" (its next waiter, first now,
// rewrites it at its attempt). The entry is rewritten when it changed
// (flag "w"), so a stale one here is one left unwritten.
func (mc *semMachine) queuedOK() (bool, string) {
	now := mc.nowMS()
	for _, p := range mc.ps {
		if len(p.ops) == 0 || mc.grantedLive(p) {
			continue
		}
		sc, err := mc.node.srv.ZScore(mc.keys[2], p.s.m.waiterID)
		if err != nil {
			return false, fmt.Sprintf("process %d's waiter (of %d permits) not queued in Redis", p.id, p.ops[0].n)
		}
		if int64(sc) != p.ops[0].w.arrival {
			return false, fmt.Sprintf("process %d queued with arrival %d, its first waiter's is %d", p.id, int64(sc), p.ops[0].w.arrival)
		}
		if pl, err := mc.node.srv.ZScore(mc.keys[3], p.s.m.waiterID); err != nil || int64(pl) <= now {
			return false, fmt.Sprintf("process %d's place: %v (%v), now %d", p.id, int64(pl), err, now)
		}
		raw := mc.node.srv.HGet(mc.keys[4], p.s.m.waiterID)
		n, value, nonce, flags, next, ok := semEntry(raw)
		var wantNext int64
		if len(p.ops) > 1 {
			wantNext = p.ops[1].w.arrival
		}
		p.s.m.mu.Lock()
		sv, sn := p.s.value, p.s.nonce
		p.s.m.mu.Unlock()
		// (Its value and flag "g" may tell of a lease the process has
		// given up since: a wake then tells it rather than grant it, and
		// its next attempt writes them anew.)
		if !ok || flags == "-" || n != p.ops[0].n || next != wantNext || nonce != sn || value != sv && !strings.Contains(flags, "g") {
			return false, fmt.Sprintf("process %d's entry %q, want %d permits, value %s, nonce %s, next %d (local waiters %d)", p.id, raw, p.ops[0].n, sv, sn, wantNext, len(p.ops))
		}
	}
	return true, ""
}

// grantable: a wake that reaches g's entry while it fits grants it (see
// lua/sem_wake.lua): its entry has a value and nonce, says its lease
// held permits exactly when it still does, and no grant lies beside it.
func (mc *semMachine) grantable(g *semPropGone) bool {
	now := mc.nowMS()
	live := g.leaseSet && g.deadline > now
	return g.queued && !g.dash && g.place > now && g.value != "" && g.nonce != "" &&
		g.flagG == live && !(g.hasG && live)
}

// reach: the entries a wake would reach now, in the order of the queue:
// each fits in what is left, none is a place kept with "-", none comes
// after the next waiter of a process reached before (lua/sem_wake.lua,
// wake). A live process's entry is its first waiter's.
func (mc *semMachine) reach() (map[*semPropGone]bool, map[*semPropProc]bool) {
	var es []semWakeEntry
	for _, p := range mc.ps {
		if len(p.ops) > 0 {
			e := semWakeEntry{arrival: p.ops[0].w.arrival, n: p.ops[0].n, p: p}
			if len(p.ops) > 1 {
				e.next = p.ops[1].w.arrival
			}
			es = append(es, e)
		}
	}
	for _, g := range mc.ghostsLive() {
		es = append(es, semWakeEntry{arrival: g.arrival, n: g.want, next: g.next, dash: g.dash, g: g})
	}
	slices.SortStableFunc(es, func(a, b semWakeEntry) int {
		switch {
		case a.arrival < b.arrival:
			return -1
		case a.arrival > b.arrival:
			return 1
		}
		return 0
	})
	gs, pss := map[*semPropGone]bool{}, map[*semPropProc]bool{}
	free, after := mc.size-mc.modelOut(), int64(0)
	for _, e := range es {
		if e.dash || after > 0 && e.arrival > after || e.n > free {
			break
		}
		free -= e.n
		if e.next > 0 {
			after = e.next
		}
		if e.g != nil {
			gs[e.g] = true
		} else {
			pss[e.p] = true
		}
	}
	return gs, pss
}

// settle waits for the waiters that get in by the model to return,
// and for every other waiter to be queued in Redis; then checks that
// no other waiter returned.
//
// Which waiters get in: the model predicts exactly those that fit and
// come before every crashed process's place that has not expired (by
// x/sync's rule). Behind such a place, waiters get in only by a wake's
// grant: a crashed process's waiter that fits when a wake reaches it is
// granted (grantable), and the wake goes on to the next; one that
// cannot be (its lease expired since its entry was written) is told and
// passed over by the wake, yet keeps out every later waiter's own
// attempt. Whether a wake ran since a place became reachable is not
// always the model's to know (a leave wakes only if its waiter was at
// the head of the queue, expired places included; a refused attempt
// that folds a grant in wakes too), so what it granted is read from
// Redis and checked to be sound: only entries a wake reaches now
// (reach), grantable ones for the crashed, never passing a live waiter
// that came first. woke says a wake certainly ran since the last
// action (a release): then, as when a waiter got in (its attempt or the
// grant that let it in woke), every grantable crashed waiter a wake
// reaches must have been granted.
func (mc *semMachine) settle(what string, woke bool) {
	deadline := time.Now().Add(semPropWait)
	for {
		progress := false
		for _, e := range mc.predict() {
			err := mc.waitOp(e.op, fmt.Sprintf("%s: process %d's Acquire(%d), which fits and comes first", what, e.p.id, e.op.n))
			if err != nil {
				mc.rt.Fatalf("%s: process %d's Acquire(%d), which fits and comes first: %v", what, e.p.id, e.op.n, err)
			}
			e.p.held += e.op.n
			mc.removeOp(e.p, e.op)
			mc.stats.add("acquire/in")
			progress, woke = true, true
		}
		if progress {
			continue
		}
		// Every live waiter's entry written (its attempts, and the
		// wakes they ran, are over).
		for {
			ok, why := mc.queuedOK()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				mc.rt.Fatalf("%s: %s after %v; Redis (now %d): %s; model: %s", what, why, semPropWait, mc.nowMS(), semDump(mc.node.srv, mc.keys), mc.modelDump())
			}
			time.Sleep(200 * time.Microsecond) // between looks
		}
		// What wakes granted: live processes' first waiters (taken in
		// by their processes, or about to be), then crashed ones'.
		rg, rp := mc.reach()
		now := mc.nowMS()
		var in []*semPropProc
		for _, p := range mc.ps {
			if mc.grantedLive(p) {
				in = append(in, p)
			}
		}
		waits := func(arrival int64) *semPropProc {
			for _, q := range mc.ps {
				if len(q.ops) > 0 && q.ops[0].w.arrival < arrival && !slices.Contains(in, q) {
					return q
				}
			}
			return nil
		}
		for _, p := range in {
			op := p.ops[0]
			if !rp[p] {
				mc.rt.Fatalf("%s: process %d's Acquire(%d) (arrival %d) got in; the model says it waits and no wake reaches it; %s", what, p.id, op.n, op.w.arrival, mc.dump())
			}
			if q := waits(op.w.arrival); q != nil {
				mc.rt.Fatalf("%s: FIFO: process %d's Acquire(%d) (arrival %d) was granted while process %d's, which came first (%d), waits; %s", what, p.id, op.n, op.w.arrival, q.id, q.ops[0].w.arrival, mc.dump())
			}
		}
		for _, g := range mc.ghostsLive() {
			if g.dash || g.hasG && g.leaseSet && g.deadline > now {
				continue
			}
			gv := mc.node.srv.HGet(mc.keys[1], g.value+"#g")
			if g.nonce == "" || gv != g.nonce+":"+strconv.FormatInt(g.want, 10) {
				continue
			}
			if !rg[g] || !mc.grantable(g) {
				mc.rt.Fatalf("%s: crashed process %d's waiter (of %d permits, arrival %d) was granted; the model says no wake reaches it (reached %v) or it is not grantable; %s", what, g.id, g.want, g.arrival, rg[g], mc.dump())
			}
			if q := waits(g.arrival); q != nil {
				mc.rt.Fatalf("%s: FIFO: crashed process %d's waiter (arrival %d) was granted while process %d's, which came first (%d), waits; %s", what, g.id, g.arrival, q.id, q.ops[0].w.arrival, mc.dump())
			}
			dl, err := mc.node.srv.ZScore(mc.keys[0], g.value)
			if err != nil || int64(dl) < mc.lastQuiet+semPropExpiryMS || int64(dl) > now+semPropExpiryMS || g.leaseSet && int64(dl) < g.deadline {
				mc.rt.Fatalf("%s: crashed process %d granted: its lease's deadline %v (%v), want within [%d, %d] and not before %d; %s", what, g.id, int64(dl), err, mc.lastQuiet+semPropExpiryMS, now+semPropExpiryMS, g.deadline, mc.dump())
			}
			if !(g.leaseSet && g.deadline > now) {
				g.permits = 0 // its lease expired: a new one, for the grant alone
			}
			g.grant, g.hasG, g.leaseSet, g.deadline = g.want, true, true, int64(dl)
			if g.next > 0 {
				g.dash, g.arrival = true, g.next
			} else {
				g.queued = false
			}
			mc.stats.add(fmt.Sprintf("grant/crashed/woke=%v", woke))
			progress, woke = true, true
		}
		for _, p := range in {
			op := p.ops[0]
			if err := mc.waitOp(op, fmt.Sprintf("%s: process %d's granted Acquire(%d)", what, p.id, op.n)); err != nil {
				mc.rt.Fatalf("%s: process %d's granted Acquire(%d): %v", what, p.id, op.n, err)
			}
			p.held += op.n
			mc.removeOp(p, op)
			mc.stats.add("acquire/in by a grant behind a crashed place")
			progress, woke = true, true
		}
		if !progress {
			break
		}
	}
	if woke {
		rg, _ := mc.reach()
		for g := range rg {
			if mc.grantable(g) {
				mc.rt.Fatalf("%s: a wake ran, yet crashed process %d's waiter (of %d permits, arrival %d), which fits and is reached, was not granted; %s", what, g.id, g.want, g.arrival, mc.dump())
			}
		}
	}
	for _, p := range mc.ps {
		for _, op := range p.ops {
			select {
			case err := <-op.done:
				mc.rt.Fatalf("%s: process %d's Acquire(%d) (started #%d) returned %v while the model says it waits (out %d of %d, Redis %d); %s",
					what, p.id, op.n, op.started, err, mc.modelOut(), mc.size, mc.redisOut(), mc.dump())
			default:
			}
		}
	}
	mc.lastQuiet = mc.nowMS()
}

// advance moves the node's clock by d in steps of at most an extend
// interval; after each, every live lease is extended and every waiter
// looks again.
func (mc *semMachine) advance(d time.Duration) {
	ctx := context.Background()
	for d > 0 {
		s := min(d, 6*time.Second)
		d -= s
		mc.node.advance(s)
		for _, p := range mc.ps {
			p.s.m.mu.Lock()
			lease := p.s.lease
			p.s.m.mu.Unlock()
			if p.held == 0 {
				// (It may have got in by now: its timer, set to the
				// first lease's end, fired after the clock moved.)
				continue
			}
			if lease == nil {
				mc.rt.Fatalf("process %d holds %d permits but has no lease", p.id, p.held)
			}
			if err := p.s.m.extendRound(ctx, lease); err != nil {
				mc.rt.Fatalf("process %d: extend of its lease: %v", p.id, err)
			}
		}
		for _, p := range mc.ps {
			if len(p.ops) > 0 {
				mc.node.srv.Publish(p.s.m.waitChan, "w")
			}
		}
		// Each waiter looks again, renewing its place if half its time
		// is gone, before the clock moves on (as its timer would).
		deadline := time.Now().Add(semPropWait)
		for _, p := range mc.ps {
			for len(p.ops) > 0 {
				pl, err := mc.node.srv.ZScore(mc.keys[3], p.s.m.waiterID)
				if err == nil && int64(pl)-mc.nowMS() >= semPropPlaceMS/2 {
					break
				}
				select {
				case err := <-p.ops[0].done:
					p.ops[0].done <- err // in: settle takes it
				default:
					if time.Now().After(deadline) {
						mc.rt.Fatalf("time passes: process %d's waiter did not renew its place within %v; %s", p.id, semPropWait, mc.dump())
					}
					time.Sleep(100 * time.Microsecond) // between looks
					continue
				}
				break
			}
		}
		mc.settle(fmt.Sprintf("time passes %v", s), false)
	}
}

func (mc *semMachine) crash(i int) {
	p := mc.ps[i]
	p.dead.Store(true)
	for _, op := range p.ops {
		op.cancel()
		err := mc.waitOp(op, fmt.Sprintf("crashed process %d", p.id))
		if err == nil {
			mc.rt.Fatalf("crashed process %d: its cancelled Acquire(%d) got in", p.id, op.n)
		}
	}
	g := &semPropGone{id: p.id, permits: p.held}
	p.s.m.mu.Lock()
	value := p.s.value
	p.s.m.mu.Unlock()
	if p.held > 0 {
		dl, err := mc.node.srv.ZScore(mc.keys[0], value)
		if err != nil {
			mc.rt.Fatalf("crashed process %d holds %d but its lease is not in Redis: %v", p.id, p.held, err)
		}
		g.deadline, g.leaseSet = int64(dl), true
		g.hasG = mc.node.srv.HGet(mc.keys[1], value+"#g") != "" // taken in, not folded
	}
	if len(p.ops) > 0 {
		g.member, g.want = p.s.m.waiterID, p.ops[0].n
		sc, err := mc.node.srv.ZScore(mc.keys[2], g.member)
		if err != nil {
			mc.rt.Fatalf("crashed process %d's waiter not queued: %v", p.id, err)
		}
		pl, err := mc.node.srv.ZScore(mc.keys[3], g.member)
		if err != nil {
			mc.rt.Fatalf("crashed process %d's waiter has no place: %v", p.id, err)
		}
		g.arrival, g.place, g.queued = int64(sc), int64(pl), true
		// Its entry, as settle left it (see queuedOK).
		raw := mc.node.srv.HGet(mc.keys[4], g.member)
		n, v, nonce, flags, next, ok := semEntry(raw)
		if !ok || n != g.want || flags == "-" {
			mc.rt.Fatalf("crashed process %d's entry %q, want one of %d permits; %s", p.id, raw, g.want, mc.dump())
		}
		g.value, g.nonce, g.flagG, g.next = v, nonce, strings.Contains(flags, "g"), next
	}
	if g.leaseSet || g.queued {
		mc.gone = append(mc.gone, g)
	}
	mc.step(fmt.Sprintf("crash/held=%v/waiting=%v", p.held > 0, len(p.ops) > 0))
	p.ops = nil
	mc.ps[i] = mc.newProc()
}

// prune forgets what crashed processes left once it expired.
func (mc *semMachine) prune() {
	now := mc.nowMS()
	mc.gone = slices.DeleteFunc(mc.gone, func(g *semPropGone) bool {
		return !(g.leaseSet && g.deadline > now) && !(g.queued && g.place > now)
	})
}

// holder draws a process, most often one that holds permits.
func (mc *semMachine) holder() int {
	var is []int
	for i, p := range mc.ps {
		if p.held > 0 {
			is = append(is, i)
		}
	}
	if len(is) == 0 || rapid.IntRange(0, 5).Draw(mc.rt, "any process") == 0 {
		return mc.proc.Draw(mc.rt, "process")
	}
	return is[rapid.IntRange(0, len(is)-1).Draw(mc.rt, "holder")]
}

// semPropEntry is a waiter in the order predict puts them in.
type semPropEntry struct {
	arrival int64
	op      *semPropOp
	p       *semPropProc
	ghost   bool
}

// semWakeEntry is an entry of the queue, as a wake walks it (see reach).
type semWakeEntry struct {
	arrival, n, next int64
	dash             bool
	p                *semPropProc
	g                *semPropGone
}

func heldOf(ps []*semPropProc) []int64 {
	var hs []int64
	for _, p := range ps {
		hs = append(hs, p.held)
	}
	return hs
}
