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
	w       *semWaiter // the waiter in the process's local queue
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

func checkSemModel(rt *rapid.T, stats *propStats, steps *atomic.Int64) {
	const (
		expiry = 20 * time.Second // model time; long in real time too
		procs  = 4
		wait   = 10 * time.Second // bound on every wait for a goroutine
	)
	second := time.Second
	placeMS := int64(placeExpiries * expiry / time.Millisecond)
	ctx := context.Background()
	size := int64(rapid.IntRange(1, 5).Draw(rt, "size"))
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	node := &rwPropNode{modelNode: &modelNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}, now: base}
	node.srv.SetTime(base)
	node.srv.ClockTTL(true)
	if err := node.srv.Start(); err != nil {
		rt.Fatal(err)
	}
	node.addr, node.up = node.srv.Addr(), true

	var all []*semPropProc
	nextID, nextOp := 0, 0
	newProc := func(rt *rapid.T) *semPropProc {
		p := &semPropProc{id: nextID}
		nextID++
		p.pool = node.newPool()
		s, err := NewSemaphore("semprop", size, []Backend{&rwPropBackend{inner: NewRedigo(p.pool), node: node, dead: &p.dead}},
			WithExpiry(expiry), WithAutoExtend(false), WithNodeTimeout(5*time.Second),
			WithRetryDelay(time.Millisecond, 2*time.Millisecond))
		if err != nil {
			rt.Fatal(err)
		}
		p.s = s
		all = append(all, p)
		return p
	}
	ps := make([]*semPropProc, procs)
	for i := range ps {
		ps[i] = newProc(rt)
	}
	keys := ps[0].s.keys // leases, permits, queue, places, wants
	var gone []*semPropGone

	var dump func() string
	waitOp := func(rt *rapid.T, op *semPropOp, what string) error {
		select {
		case err := <-op.done:
			op.done <- err // for a later look
			return err
		case <-time.After(wait):
			rt.Fatalf("%s: the Acquire did not return within %v; %s", what, wait, dump())
		}
		return nil
	}
	defer func() {
		for _, p := range all {
			for _, op := range p.ops {
				op.cancel()
				select {
				case <-op.done:
				case <-time.After(wait):
					rt.Errorf("process %d: an Acquire did not return within %v of its cancel", p.id, wait)
				}
			}
			if n := p.s.Held(); n > 0 {
				p.s.ReleaseCtx(ctx, n)
			}
			p.s.mu.Lock()
			lease := p.s.lease
			p.s.mu.Unlock()
			if lease != nil {
				lease.end()
			}
		}
		for _, p := range all {
			p.pool.Close()
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, p := range all {
			for {
				p.s.m.reaper.mu.Lock()
				running := p.s.m.reaper.running
				p.s.m.reaper.mu.Unlock()
				p.s.mu.Lock()
				fixing := p.s.fixing
				p.s.mu.Unlock()
				if !running && !fixing {
					break
				}
				if time.Now().After(deadline) {
					rt.Fatalf("process %d (dead %v): reaper running %v, fix running %v after 10s (dirty %v, value %q, held %d)", p.id, p.dead.Load(), running, fixing, p.s.dirty, p.s.value, p.s.held)
				}
				time.Sleep(time.Millisecond)
			}
		}
		node.srv.Close()
	}()

	step := func(name string) {
		steps.Add(1)
		stats.add(name)
	}
	nowMS := func() int64 { return node.nowMS() }

	// modelOut: the permits out by the model: the live processes' and the
	// crashed processes' leases not yet expired.
	modelOut := func() int64 {
		var out int64
		for _, p := range ps {
			out += p.held
		}
		now := nowMS()
		for _, g := range gone {
			if g.leaseSet && g.deadline > now {
				out += g.permits + g.grant
			}
		}
		return out
	}
	// redisOut: the permits out in Redis: the live leases' counts and the
	// grants beside them, "<nonce>:<n>" (see lua/sem_wake.lua).
	redisOut := func(rt *rapid.T) int64 {
		members, _ := node.srv.ZMembers(keys[0])
		now := nowMS()
		var out int64
		for _, v := range members {
			dl, err := node.srv.ZScore(keys[0], v)
			if err != nil || int64(dl) <= now {
				continue
			}
			n, _ := strconv.ParseInt(node.srv.HGet(keys[1], v), 10, 64)
			out += n
			if g := node.srv.HGet(keys[1], v+"#g"); g != "" {
				_, c, _ := strings.Cut(g, ":")
				n, _ := strconv.ParseInt(c, 10, 64)
				out += n
			}
		}
		return out
	}
	// ghostsLive: crashed processes' places in the queue not yet expired.
	ghostsLive := func() []*semPropGone {
		var gs []*semPropGone
		now := nowMS()
		for _, g := range gone {
			if g.queued && g.place > now {
				gs = append(gs, g)
			}
		}
		return gs
	}
	modelDump := func() string {
		var b strings.Builder
		for _, p := range ps {
			p.s.mu.Lock()
			fmt.Fprintf(&b, "process %d (member %s, lease %s held %d, Held %d, local queue %d): ", p.id, p.s.m.waiterID, p.s.value, p.held, p.s.held, len(p.s.queue))
			p.s.mu.Unlock()
			for _, op := range p.ops {
				fmt.Fprintf(&b, "#%d Acquire(%d) at %d; ", op.started, op.n, op.w.arrival)
			}
		}
		for _, g := range gone {
			fmt.Fprintf(&b, "crashed %d: %+v; ", g.id, *g)
		}
		return b.String()
	}
	dump = func() string {
		return fmt.Sprintf("Redis (now %d): %s; model: %s", nowMS(), semDump(node.srv, keys), modelDump())
	}
	anyWaiter := func() bool {
		if len(ghostsLive()) > 0 {
			return true
		}
		for _, p := range ps {
			if len(p.ops) > 0 {
				return true
			}
		}
		return false
	}

	// predict: the waiters that get in now, by x/sync's rule over every
	// process's waiters in order of arrival.
	type entry struct {
		arrival int64
		op      *semPropOp
		p       *semPropProc
		ghost   bool
	}
	predict := func() []entry {
		var es []entry
		for _, p := range ps {
			for _, op := range p.ops {
				es = append(es, entry{arrival: op.w.arrival, op: op, p: p})
			}
		}
		for _, g := range ghostsLive() {
			es = append(es, entry{arrival: g.arrival, ghost: true})
		}
		slices.SortStableFunc(es, func(a, b entry) int {
			switch {
			case a.arrival < b.arrival:
				return -1
			case a.arrival > b.arrival:
				return 1
			}
			return 0
		})
		out := modelOut()
		var in []entry
		for _, e := range es {
			if e.ghost || out+e.op.n > size {
				break
			}
			out += e.op.n
			in = append(in, e)
		}
		return in
	}
	removeOp := func(p *semPropProc, op *semPropOp) {
		p.ops = slices.DeleteFunc(p.ops, func(o *semPropOp) bool { return o == op })
	}
	checkErr := func(rt *rapid.T, what string, err error) {
		if !documented(err) {
			rt.Fatalf("%s: error %v matches no documented sentinel", what, err)
		}
	}
	// grantedLive reports whether a wake granted p's first waiter (by the
	// model, still waiting): its process took the grant in (or its call
	// returned), or it lies in Redis beside the lease, under a nonce other
	// than that of a grant taken in already.
	grantedLive := func(p *semPropProc) bool {
		if len(p.ops) == 0 {
			return false
		}
		select {
		case err := <-p.ops[0].done:
			p.ops[0].done <- err
			return true
		default:
		}
		p.s.mu.Lock()
		value := p.s.value
		p.s.mu.Unlock()
		gv := node.srv.HGet(keys[1], value+"#g")
		p.s.mu.Lock()
		sheld, fold := p.s.held, p.s.fold
		p.s.mu.Unlock()
		return sheld > p.held || value != "" && gv != "" && !strings.HasPrefix(gv, fold+":")
	}
	// queuedOK reports whether the queue in Redis holds, for every live
	// process with a waiter, its first waiter's arrival with a live place,
	// and an entry that says what it asks now: its first waiter's permits,
	// the lease value and nonce of its call, its next waiter's arrival (0
	// if none), not a place kept with "-" (its next waiter, first now,
	// rewrites it at its attempt). The entry is rewritten when it changed
	// (flag "w"), so a stale one here is one left unwritten.
	queuedOK := func() (bool, string) {
		now := nowMS()
		for _, p := range ps {
			if len(p.ops) == 0 || grantedLive(p) {
				continue
			}
			sc, err := node.srv.ZScore(keys[2], p.s.m.waiterID)
			if err != nil {
				return false, fmt.Sprintf("process %d's waiter (of %d permits) not queued in Redis", p.id, p.ops[0].n)
			}
			if int64(sc) != p.ops[0].w.arrival {
				return false, fmt.Sprintf("process %d queued with arrival %d, its first waiter's is %d", p.id, int64(sc), p.ops[0].w.arrival)
			}
			if pl, err := node.srv.ZScore(keys[3], p.s.m.waiterID); err != nil || int64(pl) <= now {
				return false, fmt.Sprintf("process %d's place: %v (%v), now %d", p.id, int64(pl), err, now)
			}
			raw := node.srv.HGet(keys[4], p.s.m.waiterID)
			n, value, nonce, flags, next, ok := semEntry(raw)
			var wantNext int64
			if len(p.ops) > 1 {
				wantNext = p.ops[1].w.arrival
			}
			p.s.mu.Lock()
			sv, sn := p.s.value, p.s.nonce
			p.s.mu.Unlock()
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
	grantable := func(g *semPropGone) bool {
		now := nowMS()
		live := g.leaseSet && g.deadline > now
		return g.queued && !g.dash && g.place > now && g.value != "" && g.nonce != "" &&
			g.flagG == live && !(g.hasG && live)
	}
	// reach: the entries a wake would reach now, in the order of the queue:
	// each fits in what is left, none is a place kept with "-", none comes
	// after the next waiter of a process reached before (lua/sem_wake.lua,
	// wake). A live process's entry is its first waiter's.
	type wEntry struct {
		arrival, n, next int64
		dash             bool
		p                *semPropProc
		g                *semPropGone
	}
	reach := func() (map[*semPropGone]bool, map[*semPropProc]bool) {
		var es []wEntry
		for _, p := range ps {
			if len(p.ops) > 0 {
				e := wEntry{arrival: p.ops[0].w.arrival, n: p.ops[0].n, p: p}
				if len(p.ops) > 1 {
					e.next = p.ops[1].w.arrival
				}
				es = append(es, e)
			}
		}
		for _, g := range ghostsLive() {
			es = append(es, wEntry{arrival: g.arrival, n: g.want, next: g.next, dash: g.dash, g: g})
		}
		slices.SortStableFunc(es, func(a, b wEntry) int {
			switch {
			case a.arrival < b.arrival:
				return -1
			case a.arrival > b.arrival:
				return 1
			}
			return 0
		})
		gs, pss := map[*semPropGone]bool{}, map[*semPropProc]bool{}
		free, after := size-modelOut(), int64(0)
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
	// lastQuiet: the node's clock when the model last settled; a grant made
	// since moved its lease's deadline to a time after it plus the expiry.
	lastQuiet := nowMS()
	expiryMS := int64(expiry / time.Millisecond)
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
	settle := func(rt *rapid.T, what string, woke bool) {
		deadline := time.Now().Add(wait)
		for {
			progress := false
			for _, e := range predict() {
				err := waitOp(rt, e.op, fmt.Sprintf("%s: process %d's Acquire(%d), which fits and comes first", what, e.p.id, e.op.n))
				if err != nil {
					rt.Fatalf("%s: process %d's Acquire(%d), which fits and comes first: %v", what, e.p.id, e.op.n, err)
				}
				e.p.held += e.op.n
				removeOp(e.p, e.op)
				stats.add("acquire/in")
				progress, woke = true, true
			}
			if progress {
				continue
			}
			// Every live waiter's entry written (its attempts, and the
			// wakes they ran, are over).
			for {
				ok, why := queuedOK()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					rt.Fatalf("%s: %s after %v; Redis (now %d): %s; model: %s", what, why, wait, nowMS(), semDump(node.srv, keys), modelDump())
				}
				time.Sleep(200 * time.Microsecond)
			}
			// What wakes granted: live processes' first waiters (taken in
			// by their processes, or about to be), then crashed ones'.
			rg, rp := reach()
			now := nowMS()
			var in []*semPropProc
			for _, p := range ps {
				if grantedLive(p) {
					in = append(in, p)
				}
			}
			waits := func(arrival int64) *semPropProc {
				for _, q := range ps {
					if len(q.ops) > 0 && q.ops[0].w.arrival < arrival && !slices.Contains(in, q) {
						return q
					}
				}
				return nil
			}
			for _, p := range in {
				op := p.ops[0]
				if !rp[p] {
					rt.Fatalf("%s: process %d's Acquire(%d) (arrival %d) got in; the model says it waits and no wake reaches it; %s", what, p.id, op.n, op.w.arrival, dump())
				}
				if q := waits(op.w.arrival); q != nil {
					rt.Fatalf("%s: FIFO: process %d's Acquire(%d) (arrival %d) was granted while process %d's, which came first (%d), waits; %s", what, p.id, op.n, op.w.arrival, q.id, q.ops[0].w.arrival, dump())
				}
			}
			for _, g := range ghostsLive() {
				if g.dash || g.hasG && g.leaseSet && g.deadline > now {
					continue
				}
				gv := node.srv.HGet(keys[1], g.value+"#g")
				if g.nonce == "" || gv != g.nonce+":"+strconv.FormatInt(g.want, 10) {
					continue
				}
				if !rg[g] || !grantable(g) {
					rt.Fatalf("%s: crashed process %d's waiter (of %d permits, arrival %d) was granted; the model says no wake reaches it (reached %v) or it is not grantable; %s", what, g.id, g.want, g.arrival, rg[g], dump())
				}
				if q := waits(g.arrival); q != nil {
					rt.Fatalf("%s: FIFO: crashed process %d's waiter (arrival %d) was granted while process %d's, which came first (%d), waits; %s", what, g.id, g.arrival, q.id, q.ops[0].w.arrival, dump())
				}
				dl, err := node.srv.ZScore(keys[0], g.value)
				if err != nil || int64(dl) < lastQuiet+expiryMS || int64(dl) > now+expiryMS || g.leaseSet && int64(dl) < g.deadline {
					rt.Fatalf("%s: crashed process %d granted: its lease's deadline %v (%v), want within [%d, %d] and not before %d; %s", what, g.id, int64(dl), err, lastQuiet+expiryMS, now+expiryMS, g.deadline, dump())
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
				stats.add(fmt.Sprintf("grant/crashed/woke=%v", woke))
				progress, woke = true, true
			}
			for _, p := range in {
				op := p.ops[0]
				if err := waitOp(rt, op, fmt.Sprintf("%s: process %d's granted Acquire(%d)", what, p.id, op.n)); err != nil {
					rt.Fatalf("%s: process %d's granted Acquire(%d): %v", what, p.id, op.n, err)
				}
				p.held += op.n
				removeOp(p, op)
				stats.add("acquire/in by a grant behind a crashed place")
				progress, woke = true, true
			}
			if !progress {
				break
			}
		}
		if woke {
			rg, _ := reach()
			for g := range rg {
				if grantable(g) {
					rt.Fatalf("%s: a wake ran, yet crashed process %d's waiter (of %d permits, arrival %d), which fits and is reached, was not granted; %s", what, g.id, g.want, g.arrival, dump())
				}
			}
		}
		for _, p := range ps {
			for _, op := range p.ops {
				select {
				case err := <-op.done:
					rt.Fatalf("%s: process %d's Acquire(%d) (started #%d) returned %v while the model says it waits (out %d of %d, Redis %d); %s",
						what, p.id, op.n, op.started, err, modelOut(), size, redisOut(rt), dump())
				default:
				}
			}
		}
		lastQuiet = nowMS()
	}
	// advance moves the node's clock by d in steps of at most an extend
	// interval; after each, every live lease is extended and every waiter
	// looks again.
	advance := func(rt *rapid.T, d time.Duration) {
		for d > 0 {
			s := min(d, 6*second)
			d -= s
			node.advance(s)
			for _, p := range ps {
				p.s.mu.Lock()
				lease := p.s.lease
				p.s.mu.Unlock()
				if p.held == 0 {
					// (It may have got in by now: its timer, set to the
					// first lease's end, fired after the clock moved.)
					continue
				}
				if lease == nil {
					rt.Fatalf("process %d holds %d permits but has no lease", p.id, p.held)
				}
				if err := p.s.m.extendRound(ctx, lease); err != nil {
					rt.Fatalf("process %d: extend of its lease: %v", p.id, err)
				}
			}
			for _, p := range ps {
				if len(p.ops) > 0 {
					node.srv.Publish(p.s.channel, "w")
				}
			}
			// Each waiter looks again, renewing its place if half its time
			// is gone, before the clock moves on (as its timer would).
			deadline := time.Now().Add(wait)
			for _, p := range ps {
				for len(p.ops) > 0 {
					pl, err := node.srv.ZScore(keys[3], p.s.m.waiterID)
					if err == nil && int64(pl)-nowMS() >= placeMS/2 {
						break
					}
					select {
					case err := <-p.ops[0].done:
						p.ops[0].done <- err // in: settle takes it
					default:
						if time.Now().After(deadline) {
							rt.Fatalf("time passes: process %d's waiter did not renew its place within %v; %s", p.id, wait, dump())
						}
						time.Sleep(100 * time.Microsecond)
						continue
					}
					break
				}
			}
			settle(rt, fmt.Sprintf("time passes %v", s), false)
		}
	}
	crash := func(rt *rapid.T, i int) {
		p := ps[i]
		p.dead.Store(true)
		for _, op := range p.ops {
			op.cancel()
			err := waitOp(rt, op, fmt.Sprintf("crashed process %d", p.id))
			if err == nil {
				rt.Fatalf("crashed process %d: its cancelled Acquire(%d) got in", p.id, op.n)
			}
		}
		g := &semPropGone{id: p.id, permits: p.held}
		p.s.mu.Lock()
		value := p.s.value
		p.s.mu.Unlock()
		if p.held > 0 {
			dl, err := node.srv.ZScore(keys[0], value)
			if err != nil {
				rt.Fatalf("crashed process %d holds %d but its lease is not in Redis: %v", p.id, p.held, err)
			}
			g.deadline, g.leaseSet = int64(dl), true
			g.hasG = node.srv.HGet(keys[1], value+"#g") != "" // taken in, not folded
		}
		if len(p.ops) > 0 {
			g.member, g.want = p.s.m.waiterID, p.ops[0].n
			sc, err := node.srv.ZScore(keys[2], g.member)
			if err != nil {
				rt.Fatalf("crashed process %d's waiter not queued: %v", p.id, err)
			}
			pl, err := node.srv.ZScore(keys[3], g.member)
			if err != nil {
				rt.Fatalf("crashed process %d's waiter has no place: %v", p.id, err)
			}
			g.arrival, g.place, g.queued = int64(sc), int64(pl), true
			// Its entry, as settle left it (see queuedOK).
			raw := node.srv.HGet(keys[4], g.member)
			n, v, nonce, flags, next, ok := semEntry(raw)
			if !ok || n != g.want || flags == "-" {
				rt.Fatalf("crashed process %d's entry %q, want one of %d permits; %s", p.id, raw, g.want, dump())
			}
			g.value, g.nonce, g.flagG, g.next = v, nonce, strings.Contains(flags, "g"), next
		}
		if g.leaseSet || g.queued {
			gone = append(gone, g)
		}
		step(fmt.Sprintf("crash/held=%v/waiting=%v", p.held > 0, len(p.ops) > 0))
		p.ops = nil
		ps[i] = newProc(rt)
	}
	// prune forgets what crashed processes left once it expired.
	prune := func() {
		now := nowMS()
		gone = slices.DeleteFunc(gone, func(g *semPropGone) bool {
			return !(g.leaseSet && g.deadline > now) && !(g.queued && g.place > now)
		})
	}
	proc := rapid.IntRange(0, procs-1)
	holder := func(rt *rapid.T) int {
		var is []int
		for i, p := range ps {
			if p.held > 0 {
				is = append(is, i)
			}
		}
		if len(is) == 0 || rapid.IntRange(0, 5).Draw(rt, "any process") == 0 {
			return proc.Draw(rt, "process")
		}
		return is[rapid.IntRange(0, len(is)-1).Draw(rt, "holder")]
	}

	rt.Repeat(map[string]func(*rapid.T){
		"TryAcquireCtx": func(rt *rapid.T) {
			i := proc.Draw(rt, "process")
			p := ps[i]
			n := int64(rapid.IntRange(0, int(size)).Draw(rt, "n"))
			want := n == 0 || !anyWaiter() && modelOut()+n <= size
			ok, err := p.s.TryAcquireCtx(ctx, n)
			if err != nil {
				rt.Fatalf("process %d TryAcquireCtx(%d): %v", p.id, n, err)
			}
			if ok != want {
				rt.Fatalf("process %d TryAcquireCtx(%d): got %v, want %v (out %d of %d, waiters %v, own waiters %d)", p.id, n, ok, want, modelOut(), size, anyWaiter(), len(p.ops))
			}
			if ok {
				p.held += n
			}
			settle(rt, "TryAcquireCtx", false)
			step(fmt.Sprintf("tryacquire/%v", ok))
		},
		"Acquire": func(rt *rapid.T) {
			i := proc.Draw(rt, "process")
			p := ps[i]
			n := int64(rapid.IntRange(0, int(size)).Draw(rt, "n"))
			if n == 0 {
				if err := p.s.Acquire(ctx, 0); err != nil {
					rt.Fatalf("process %d Acquire(0): %v", p.id, err)
				}
				step("acquire/0")
				return
			}
			if len(p.ops) >= 2 {
				step("acquire/busy")
				return
			}
			actx, cancel := context.WithCancel(ctx)
			op := &semPropOp{n: n, cancel: cancel, done: make(chan error, 1), started: nextOp}
			nextOp++
			s := p.s
			s.mu.Lock()
			before := slices.Clone(s.queue)
			s.mu.Unlock()
			go func() { op.done <- s.Acquire(actx, n) }()
			// Wait for it in the local queue (its arrival is then set),
			// or for its return.
			deadline := time.Now().Add(wait)
			for op.w == nil {
				s.mu.Lock()
				for _, w := range s.queue {
					if !slices.Contains(before, w) {
						op.w = w
					}
				}
				s.mu.Unlock()
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
					op.w = &semWaiter{n: n, arrival: time.Now().UnixMicro()}
				default:
				}
				if time.Now().After(deadline) {
					rt.Fatalf("process %d Acquire(%d) neither queued nor returned within %v", p.id, n, wait)
				}
				time.Sleep(50 * time.Microsecond)
			}
			p.ops = append(p.ops, op)
			settle(rt, fmt.Sprintf("process %d Acquire(%d)", p.id, n), false)
			if slices.Contains(p.ops, op) {
				step("acquire/waits")
			} else {
				step("acquire/in at once")
			}
		},
		"cancel a waiter": func(rt *rapid.T) {
			var is []int
			for i, p := range ps {
				if len(p.ops) > 0 {
					is = append(is, i)
				}
			}
			if len(is) == 0 {
				step("cancel/none")
				return
			}
			p := ps[is[rapid.IntRange(0, len(is)-1).Draw(rt, "waiting process")]]
			k := rapid.IntRange(0, len(p.ops)-1).Draw(rt, "waiter")
			op := p.ops[k]
			op.cancel()
			err := waitOp(rt, op, fmt.Sprintf("process %d's cancelled Acquire(%d)", p.id, op.n))
			if err == nil {
				rt.Fatalf("process %d's cancelled Acquire(%d) got in, while the model says it waits", p.id, op.n)
			}
			checkErr(rt, "cancelled Acquire", err)
			if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
				rt.Fatalf("process %d's cancelled Acquire(%d): %v, want ErrNotObtained and context.Canceled", p.id, op.n, err)
			}
			removeOp(p, op)
			settle(rt, fmt.Sprintf("process %d's Acquire(%d) cancelled", p.id, op.n), false)
			step(fmt.Sprintf("cancel/first=%v", k == 0))
		},
		"ReleaseCtx": func(rt *rapid.T) {
			p := ps[holder(rt)]
			if p.held == 0 || rapid.IntRange(0, 9).Draw(rt, "too many") == 0 {
				n := p.held + 1
				if err := p.s.ReleaseCtx(ctx, n); !errors.Is(err, ErrNotHeld) {
					rt.Fatalf("process %d ReleaseCtx(%d) holding %d: %v, want ErrNotHeld", p.id, n, p.held, err)
				}
				step("release/notheld")
				return
			}
			n := int64(rapid.IntRange(1, int(p.held)).Draw(rt, "n"))
			if err := p.s.ReleaseCtx(ctx, n); err != nil {
				rt.Fatalf("process %d ReleaseCtx(%d) holding %d: %v", p.id, n, p.held, err)
			}
			p.held -= n
			settle(rt, fmt.Sprintf("process %d ReleaseCtx(%d)", p.id, n), true)
			step(fmt.Sprintf("release/all=%v", p.held == 0))
		},
		"crash a process": func(rt *rapid.T) {
			crash(rt, proc.Draw(rt, "process"))
			settle(rt, "crash", false)
		},
		"time passes": func(rt *rapid.T) {
			d := time.Duration(rapid.IntRange(1, 6).Draw(rt, "seconds")) * second
			advance(rt, d)
			prune()
			step("time passes")
		},
		"expiries pass": func(rt *rapid.T) {
			// Beyond a lease's expiry; sometimes beyond a place's.
			d := expiry + second
			if rapid.Bool().Draw(rt, "places too") {
				d = placeExpiries*expiry + second
			}
			advance(rt, d)
			prune()
			step(fmt.Sprintf("expiries pass/%v", d))
		},
		"everyone leaves": func(rt *rapid.T) {
			// The last arrived first: a waiter leaving wakes nobody
			// behind it then.
			for {
				var last *semPropOp
				var lp *semPropProc
				for _, p := range ps {
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
				if err := waitOp(rt, last, "everyone leaves"); err == nil {
					rt.Fatalf("everyone leaves: process %d's cancelled Acquire(%d) got in", lp.id, last.n)
				}
				removeOp(lp, last)
			}
			released := false
			for _, p := range ps {
				if p.held > 0 {
					released = true
					if err := p.s.ReleaseCtx(ctx, p.held); err != nil {
						rt.Fatalf("everyone leaves: process %d ReleaseCtx(%d): %v", p.id, p.held, err)
					}
					p.held = 0
				}
			}
			settle(rt, "everyone leaves", released)
			advance(rt, placeExpiries*expiry+expiry+second)
			prune()
			if len(gone) > 0 {
				rt.Fatalf("everyone leaves: %d crashed processes' leases or places left in the model", len(gone))
			}
			for _, k := range keys {
				if node.srv.Exists(k) {
					rt.Fatalf("everyone leaves: key %s left behind after every expiry and place", k)
				}
			}
			p := ps[proc.Draw(rt, "fresh")]
			ok, err := p.s.TryAcquireCtx(ctx, size)
			if !ok || err != nil {
				rt.Fatalf("everyone leaves: TryAcquireCtx(%d) of a free semaphore: %v, %v (stranded?)", size, ok, err)
			}
			p.held = size
			settle(rt, "everyone leaves, then a fresh TryAcquireCtx", false)
			step("everyone leaves")
		},
		"": func(rt *rapid.T) {
			for _, p := range ps {
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
			out, want := redisOut(rt), modelOut()
			if out > size {
				rt.Fatalf("%d permits out in Redis, size %d", out, size)
			}
			if out != want {
				rt.Fatalf("%d permits out in Redis, the model says %d (live processes hold %v)", out, want, heldOf(ps))
			}
			if ok, why := queuedOK(); !ok {
				rt.Fatal(why)
			}
			// Nothing else queued but crashed processes' places.
			members, _ := node.srv.ZMembers(keys[2])
			now := nowMS()
			for _, m := range members {
				known := false
				for _, p := range ps {
					known = known || len(p.ops) > 0 && p.s.m.waiterID == m
				}
				for _, g := range gone {
					known = known || g.queued && g.member == m
				}
				if pl, err := node.srv.ZScore(keys[3], m); !known && err == nil && int64(pl) > now {
					rt.Fatalf("waiter %s queued in Redis with a live place, but nobody waits", m)
				}
			}
			// Crashed processes' places not yet expired: where the model
			// says, as their entries were left, or kept with "-" at their
			// next waiter's arrival once granted.
			for _, g := range ghostsLive() {
				sc, err := node.srv.ZScore(keys[2], g.member)
				pl, err2 := node.srv.ZScore(keys[3], g.member)
				raw := node.srv.HGet(keys[4], g.member)
				n, _, _, flags, next, _ := semEntry(raw)
				switch {
				case err != nil || err2 != nil || int64(sc) != g.arrival || int64(pl) != g.place:
					rt.Fatalf("crashed process %d's place: queued at %v (%v) until %v (%v), the model says at %d until %d; %s", g.id, int64(sc), err, int64(pl), err2, g.arrival, g.place, dump())
				case g.dash && raw != "0:::-:0":
					rt.Fatalf("crashed process %d's place kept for its next waiter: entry %q, want \"0:::-:0\"", g.id, raw)
				case !g.dash && (n != g.want || next != g.next || flags == "-"):
					rt.Fatalf("crashed process %d's entry %q, the model says %d permits, next %d", g.id, raw, g.want, g.next)
				}
			}
		},
	})
}

func heldOf(ps []*semPropProc) []int64 {
	var hs []int64
	for _, p := range ps {
		hs = append(hs, p.held)
	}
	return hs
}

// semDump describes the semaphore's keys on srv, for a failure's message.
func semDump(srv *miniredis.Miniredis, keys []string) string {
	var b strings.Builder
	for i, k := range keys {
		switch i {
		case 1, 4:
			fmt.Fprintf(&b, "%s=%v ", k, hashOf(srv, k))
		default:
			ms, _ := srv.ZMembers(k)
			fmt.Fprintf(&b, "%s=[", k)
			for _, m := range ms {
				sc, _ := srv.ZScore(k, m)
				fmt.Fprintf(&b, "%s:%d ", m, int64(sc))
			}
			b.WriteString("] ")
		}
	}
	return b.String()
}

func hashOf(srv *miniredis.Miniredis, k string) map[string]string {
	fs, _ := srv.HKeys(k)
	m := map[string]string{}
	for _, f := range fs {
		m[f] = srv.HGet(k, f)
	}
	return m
}
