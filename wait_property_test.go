package netlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Bounds and sizes of TestPropertyWaiting.
const (
	// waitExpiry is short, so that the key of a holder that died expires
	// within a step; the node timeout is a fraction of it, as it would be in
	// production. Auto-extend is on (the default): a live holder never
	// expires, a dead one within an expiry.
	waitExpiry      = 500 * time.Millisecond
	waitNodeTimeout = 100 * time.Millisecond
	// waitPrompt bounds a turn that comes by message: the release names (or
	// grants) the next waiter, which holds within a round trip or two, about
	// a millisecond on loopback. The bound is generous for a loaded 2-core
	// CI box running -race.
	waitPrompt = 300 * time.Millisecond
	// waitLive bounds a turn that comes by the slowest legal path, the
	// holder's TTL: a holder that died releases nothing, so its key lives
	// for up to an expiry after its last extend, and each waiter looks again
	// when the TTL it last read runs out (plus a sixteenth of jitter).
	waitLive = 2*waitExpiry + 500*time.Millisecond
	// waitLateReturn is how long after its deadline a hold may be when the
	// goroutine that called LockCtx looks at it: a scheduling delay.
	waitLateReturn = 50 * time.Millisecond
	// waitSettle bounds what takes a few round trips and no TTL: a waiter
	// that starts waiting is queued and listening, a cancelled LockCtx
	// returns, the server notices a killed process's connections are gone.
	waitSettle = 2 * time.Second
	// waitProcs live processes in each check (spawn replaces the dead), of
	// at most waitMaxProcs in all.
	waitProcs    = 5
	waitMaxProcs = 8
	// waitMinSteps is how many actions TestPropertyWaiting runs in a plain
	// `go test`, in checks of waitMinCheckSteps to waitMaxCheckSteps actions
	// each (every check starts new processes on a lock of its own).
	waitMinSteps      = 250
	waitMinCheckSteps = 8
	waitMaxCheckSteps = 20
)

// TestPropertyWaiting drives the waiting protocol (see waiter) on a real
// redis-server through random sequences of waits, unlocks and faults.
// TestProperty models every call exactly on miniredis and never blocks; this
// one does not predict each outcome, it has blocked waiters and checks what
// must hold whatever the interleaving.
//
// Each check runs a few processes on one lock name: each a NetMutex on a
// client of its own (the client libraries of testClients in turn) whose
// every connection goes through a proxy of its own, so that killing the
// process is closing its proxy: all its connections die at once, as for a
// SIGKILLed process.
// A killed process's LockCtx goes on failing and riding out the outage, and
// its hold (if it had one) is lost when its local deadline passes; it never
// counts as a holder again.
//
// Actions: a live idle process starts waiting (LockCtx in a goroutine); the
// holder unlocks, plainly, or while a waiter gives up (its ctx cancelled
// before, during or just after the release: as its turn may be coming), or
// with every pub/sub connection killed right after the release (its message
// may be lost), or with the next release message dropped by the client as
// if lost in flight while the connection stays up (beyond what TCP loses:
// only the waiters' look at the holder's TTL, and a granted waiter's next
// attempt, recover it); a waiting process (often the one whose turn is
// next) or the holding one is killed; one or every pub/sub connection is
// killed on the server (CLIENT KILL); the waiters' queue is deleted
// (eviction, FLUSHALL); a waiter (often the next) gives up; a new process
// replaces a dead one; time passes (up to an expiry) while the holder holds
// and the waiters wait, so that their last look at the lock is older when
// their turn comes.
//
// After every action:
//   - at most one process, live or dead, holds a hold whose local deadline
//     has not passed, and the lock key holds its value and token; checked
//     also the moment each LockCtx returns, with the fencing token above
//     every earlier hold's, and the hold returned still valid (its deadline
//     not passed by more than a scheduling delay, waitLateReturn);
//   - liveness: while no live process holds and live processes wait, one of
//     them holds within waitLive of the action (the holder's TTL being the
//     slowest legal path); and after an unlock that must hand the turn on by
//     message (a live waiter listens and is queued behind at most dead ones,
//     and no message is dropped), within waitPrompt, with the release's
//     message delivered;
//   - a waiter that starts waiting is queued and listening within
//     waitSettle; one whose pub/sub connection was killed, within waitPrompt
//     (the failure wakes it); one whose queue entry was lost, within
//     waitLive (its next look at the holder's TTL);
//   - a LockCtx that is not cancelled never fails while its process lives;
//     a cancelled one returns within waitSettle, an error matching both
//     ErrNotObtained and context.Canceled unless it held first, and then
//     holds nothing: no hold, no entry in the queue, no lock key of its
//     values (unless its reaper is still delivering the release);
//   - the queue holds only waiting or dead processes' entries, and neither
//     it nor the lock key is ever without a TTL.
//
// At the end of each check every LockCtx is cancelled and every hold
// unlocked; the lock key must be gone within an expiry (a dead holder's
// expires), and no goroutine may be left (goleak).
func TestPropertyWaiting(t *testing.T) {
	// Registered first, so run last: after the server and the proxies stop.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	s := redistest.Start(t)
	admin, err := redis.Dial("tcp", s.Addr(), redis.DialReadTimeout(5*time.Second), redis.DialWriteTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("dial %s: %v", s.Addr(), err)
	}
	defer admin.Close()

	stats := &waitStats{counts: map[string]int{}}
	start := time.Now()
	failing := false
	for !t.Failed() {
		rapid.Check(t, func(rt *rapid.T) {
			if stats.steps >= waitMinSteps && !failing {
				return // the budget is spent: the rest of rapid's checks pass at once
			}
			rt.Cleanup(func() { failing = failing || rt.Failed() })
			stats.checks++
			mc := newWaitMachine(t, rt, s.Addr(), admin, fmt.Sprintf("wait%d", stats.checks), stats)
			mc.run()
		})
		if stats.steps >= waitMinSteps || rapidReproducing() {
			break
		}
	}
	redistest.Report(t, "%d steps in %d checks in %v; %v", stats.steps, stats.checks, time.Since(start).Round(time.Millisecond), stats)
}

// waitClients returns the client libraries the processes use, in turn.
func waitClients() []string { return testClients() }

// procState is what the model knows of a process of TestPropertyWaiting.
type procState int

const (
	procIdle       procState = iota // alive, not waiting, not holding
	procWaiting                     // its LockCtx runs
	procCancelling                  // its LockCtx runs, its ctx cancelled
	procHolding                     // its LockCtx returned nil; not unlocked yet
	procDead                        // killed: its proxy is closed
)

func (s procState) String() string {
	return [...]string{"idle", "waiting", "cancelling", "holding", "dead"}[s]
}

// waitProc is one process: a NetMutex on a client of its own, connected
// through a proxy of its own.
type waitProc struct {
	n      int // index in the machine, as failure messages name it
	client string
	proxy  *redistest.Proxy
	probe  *probeBackend
	m      *NetMutex
	close  func() // closes the client

	state  procState
	cancel context.CancelFunc // the running LockCtx's ctx
	result chan waitResult    // the running LockCtx's result; nil when none runs
	began  time.Time          // when the running LockCtx began
}

// waitResult is what one LockCtx came to.
type waitResult struct {
	err  error
	at   time.Time // when it returned
	kind string    // with err nil, how the turn came: "free", "message" or "ttl"
}

// waitStats are the figures TestPropertyWaiting reports.
type waitStats struct {
	steps, checks int
	counts        map[string]int  // actions, faults and outcomes, by name
	prompt        []time.Duration // turns by message: unlock to the next hold
	slow          []time.Duration // turns by the TTL path: fault to the next hold
}

func (s *waitStats) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(s.counts)) {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", k, s.counts[k])
	}
	quantiles := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			return
		}
		ds = slices.Clone(ds)
		slices.Sort(ds)
		fmt.Fprintf(&b, "; %s (%d): p50 %v, max %v", name, len(ds), ds[len(ds)/2].Round(10*time.Microsecond), ds[len(ds)-1].Round(10*time.Microsecond))
	}
	quantiles("hand-over by message", s.prompt)
	quantiles("turn by the TTL path", s.slow)
	return b.String()
}

// waitMachine is one check of TestPropertyWaiting.
type waitMachine struct {
	t        *testing.T // owns the proxies
	rt       *rapid.T
	addr     string
	admin    redis.Conn
	name     string
	stats    *waitStats
	offset   int // the first process's client: waitClients()[offset]
	lockKey  string
	queueKey string

	// step describes the action under way, steps counts those done, for
	// the log and failure messages.
	step  string
	steps int
	// lastTurn is when the latest collected LockCtx of a live waiter
	// returned nil.
	lastTurn time.Time

	// mu guards procs (appended by spawn, read by LockCtx goroutines),
	// lastToken, stale and violations.
	mu         sync.Mutex
	procs      []*waitProc
	lastToken  uint64   // the token of the latest hold checked when it came
	stale      int      // holds just over when their LockCtx returned
	violations []string // found by LockCtx goroutines; reported by check
}

func newWaitMachine(t *testing.T, rt *rapid.T, addr string, admin redis.Conn, name string, stats *waitStats) *waitMachine {
	mc := &waitMachine{t: t, rt: rt, addr: addr, admin: admin, name: name, stats: stats}
	mc.offset = rapid.IntRange(0, len(waitClients())-1).Draw(rt, "first client")
	rt.Cleanup(mc.close)
	for range waitProcs {
		mc.spawn()
	}
	mc.lockKey, mc.queueKey = mc.procs[0].m.keys.lock, mc.procs[0].m.keys.waiters
	return mc
}

// spawn starts a new process.
func (mc *waitMachine) spawn() *waitProc {
	n := len(mc.procs)
	clients := waitClients()
	p := &waitProc{n: n, client: clients[(n+mc.offset)%len(clients)]}
	p.proxy = redistest.StartProxy(mc.t, mc.addr)
	var b Backend
	switch p.client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle: 16,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", p.proxy.Addr())
			},
		}
		b, p.close = NewRedigo(pool), func() { pool.Close() }
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{p.proxy.Addr()}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			p.proxy.Close()
			mc.rt.Fatalf("rueidis.NewClient(%s): %v", p.proxy.Addr(), err)
		}
		b, p.close = NewRueidis(c), c.Close
	default:
		open := registeredClient(p.client)
		if open == nil {
			p.proxy.Close()
			mc.rt.Fatalf("unknown client %q", p.client)
		}
		var err error
		if b, p.close, err = open(TestClientConfig{Addr: p.proxy.Addr()}); err != nil {
			p.proxy.Close()
			mc.rt.Fatalf("%s client on %s: %v", p.client, p.proxy.Addr(), err)
		}
	}
	p.probe = newProbe(b)
	m, err := New(mc.name, []Backend{p.probe}, WithExpiry(waitExpiry), WithNodeTimeout(waitNodeTimeout))
	if err != nil {
		p.close()
		p.proxy.Close()
		mc.rt.Fatalf("New: %v", err)
	}
	p.m = m
	mc.mu.Lock()
	mc.procs = append(mc.procs, p)
	mc.mu.Unlock()
	return p
}

// run draws and runs the actions of one check, checking the invariants
// after each, then ends every wait and hold and checks nothing is left.
func (mc *waitMachine) run() {
	rt := mc.rt
	steps := rapid.IntRange(waitMinCheckSteps, waitMaxCheckSteps).Draw(rt, "steps")
	for range steps {
		action := rapid.SampledFrom(mc.actions()).Draw(rt, "action")
		mc.stats.counts[action]++
		mc.step = action
		mc.do(action)
		mc.check()
		rt.Logf("step %d: %s", mc.steps+1, mc.step)
		mc.steps++
		mc.stats.steps++
	}
	mc.finish()
}

// actions lists the actions that apply now, each as many times as its
// weight.
func (mc *waitMachine) actions() []string {
	idle, waiting, holding := mc.in(procIdle), mc.in(procWaiting), mc.in(procHolding)
	var as []string
	add := func(ok bool, name string, weight int) {
		for range weight {
			if ok {
				as = append(as, name)
			}
		}
	}
	// Unlocks and kills of the holder are likelier with more waiters
	// behind it: the hand-over is what is under test.
	add(len(idle) > 0, "start", 4)
	add(len(holding) > 0, "unlock", 1+min(len(waiting), 3))
	add(len(holding) > 0 && len(waiting) > 0, "unlock+cancel", 2)
	add(len(holding) > 0 && len(waiting) > 0, "unlock+drop", 1)
	add(len(holding) > 0 && len(waiting) > 0, "unlock+mute", 1)
	add(len(waiting) > 0, "kill waiter", 2)
	add(len(holding) > 0, "kill holder", 1+min(len(waiting), 1))
	add(len(waiting) > 0, "drop all", 1)
	add(len(waiting) > 0, "drop one", 1)
	add(len(waiting) > 0, "delete queue", 1)
	add(len(waiting) > 0, "cancel", 2)
	add(len(mc.procs)-len(mc.in(procDead)) < waitProcs && len(mc.procs) < waitMaxProcs, "spawn", 2)
	add(true, "time passes", 3)
	if len(as) == 0 {
		as = append(as, "spawn") // cannot happen: some process is idle, holding or waiting
	}
	return as
}

func (mc *waitMachine) do(action string) {
	rt := mc.rt
	pick := func(ps []*waitProc, what string) *waitProc {
		p := ps[rapid.IntRange(0, len(ps)-1).Draw(rt, what)]
		mc.step += fmt.Sprintf(" %s=%d", what, p.n)
		return p
	}
	// pickWaiter picks a waiting process, often the one whose turn is
	// next: a release must then skip it if it died, and it passes the turn
	// on if it gives up.
	pickWaiter := func(what string) *waitProc {
		if rapid.Bool().Draw(rt, what+" at the head") {
			for _, member := range mc.queue() {
				if p := mc.byMember(member); p != nil && p.state == procWaiting {
					mc.step += fmt.Sprintf(" %s=%d (head)", what, p.n)
					return p
				}
			}
		}
		return pick(mc.in(procWaiting), what)
	}
	switch action {
	case "start":
		p := pick(mc.in(procIdle), "process")
		mc.start(p)
		mc.awaitQueued([]*waitProc{p}, waitSettle, fmt.Sprintf("process %d started waiting", p.n))
		mc.settle(p.began, waitLive, fmt.Sprintf("process %d started waiting", p.n))
	case "unlock":
		mc.unlock(pick(mc.in(procHolding), "process"), "plain", nil)
	case "unlock+cancel":
		mc.unlock(pick(mc.in(procHolding), "process"), "cancel", pickWaiter("quitter"))
	case "unlock+drop":
		mc.unlock(pick(mc.in(procHolding), "process"), "drop", nil)
	case "unlock+mute":
		mc.unlock(pick(mc.in(procHolding), "process"), "mute", nil)
	case "kill waiter":
		p := pickWaiter("process")
		p.proxy.Close()
		p.state = procDead
		// Wait until the server has noticed: a release must then skip the
		// dead waiter's entry (PUBLISH reaches nobody).
		mc.eventually(waitSettle, fmt.Sprintf("the server dropping killed process %d's subscription", p.n), func() bool {
			return mc.numsub(p.m.waitChan) == 0
		})
	case "kill holder":
		p := pick(mc.in(procHolding), "process")
		start := time.Now()
		p.proxy.Close()
		p.state = procDead
		if mc.settle(start, waitLive, fmt.Sprintf("holder %d killed", p.n)) {
			mc.stats.slow = append(mc.stats.slow, mc.lastTurn.Sub(start))
		}
	case "drop all":
		mc.do1("CLIENT", "KILL", "TYPE", "pubsub")
		// A waiter whose connection fails is woken: it watches again (and
		// attempts) at once, not at its next look at the holder's TTL.
		mc.awaitQueued(mc.in(procWaiting), waitPrompt, "every pub/sub connection killed")
	case "drop one":
		ids := mc.pubsubClients()
		if len(ids) == 0 {
			mc.stats.counts["drop one: none to drop"]++
			return
		}
		id := ids[rapid.IntRange(0, len(ids)-1).Draw(rt, "connection")]
		mc.do1("CLIENT", "KILL", "ID", id)
		mc.awaitQueued(mc.in(procWaiting), waitPrompt, "a pub/sub connection killed")
	case "delete queue":
		mc.do1("DEL", mc.queueKey)
		// A waiter missing from the queue joins it again with its next
		// attempt, at the latest when the holder's TTL it read runs out.
		mc.awaitQueued(mc.in(procWaiting), waitLive, "the waiters' queue deleted")
	case "cancel":
		p := pickWaiter("process")
		p.state = procCancelling
		p.cancel()
		mc.awaitResult(p)
	case "spawn":
		mc.spawn()
	case "time passes":
		// Holds last, and waiters wait, for a while: a waiter's last look at
		// the lock is then that much older when its turn comes.
		d := time.Duration(rapid.IntRange(0, int(waitExpiry/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond
		mc.step += fmt.Sprintf(" %v", d)
		time.Sleep(d) // time passing is the action
	default:
		mc.fatalf("unknown action %q", action)
	}
}

// start starts p's LockCtx in a goroutine of its own. The goroutine checks
// the hold the moment LockCtx returns it (see acquired).
func (mc *waitMachine) start(p *waitProc) {
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan waitResult, 1)
	p.state, p.cancel, p.result, p.began = procWaiting, cancel, res, time.Now()
	rounds0, msgs0 := p.probe.rounds.Load(), p.probe.msgs.Load()
	go func() {
		err := p.m.LockCtx(ctx)
		r := waitResult{err: err, at: time.Now()}
		if err == nil {
			mc.acquired(p)
			switch {
			case p.probe.msgs.Load() > msgs0:
				r.kind = "message"
			case p.probe.rounds.Load()-rounds0 <= 1:
				r.kind = "free"
			default:
				r.kind = "ttl"
			}
		}
		res <- r
	}()
}

// acquired checks the hold p's LockCtx has just returned, on p's goroutine:
// no other process, live or dead, may hold a hold whose local deadline has
// not passed, and the fencing token must be above every earlier hold's. A
// hold whose own deadline has passed already (its goroutine was not
// scheduled for an expiry) is not compared: another process may have
// acquired legitimately since.
func (mc *waitMachine) acquired(p *waitProc) {
	h := p.m.current()
	now := time.Now()
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if h == nil {
		mc.violations = append(mc.violations, fmt.Sprintf("process %d: LockCtx returned nil: got no hold, want one", p.n))
		return
	}
	if until, held := h.deadline(); !held || !until.After(now) {
		// LockCtx returns a hold: one with validity left (see acquireRound,
		// waiter.granted). A hold whose deadline passed a moment ago may be
		// one whose goroutine was not scheduled in time; longer ago, it was
		// lost before LockCtx returned it.
		if now.Sub(until) > waitLateReturn {
			mc.violations = append(mc.violations, fmt.Sprintf(
				"process %d: LockCtx returned a hold (token %d) whose deadline passed %v before: got a hold already lost, want a valid one",
				p.n, h.token, now.Sub(until).Round(time.Millisecond)))
		}
		mc.stale++
		return
	}
	for _, q := range mc.procs {
		if q == p {
			continue
		}
		if qh := q.m.current(); qh != nil {
			if until, held := qh.deadline(); held && until.After(now) {
				mc.violations = append(mc.violations, fmt.Sprintf(
					"process %d acquired (token %d) while process %d's hold (token %d) had %v left: got two holders, want at most one",
					p.n, h.token, q.n, qh.token, until.Sub(now)))
			}
		}
	}
	if h.token <= mc.lastToken {
		mc.violations = append(mc.violations, fmt.Sprintf(
			"process %d acquired token %d after a hold with token %d: got %d, want above %d", p.n, h.token, mc.lastToken, h.token, mc.lastToken))
	}
	mc.lastToken = max(mc.lastToken, h.token)
}

// unlock unlocks holder p. variant: "plain"; "cancel", with quitter's
// LockCtx cancelled at the same time (a waiter giving up as its turn may be
// coming); "drop", with every pub/sub connection killed right after the
// release (its message may be lost); "mute", with the next message to every
// waiter dropped by its client.
//
// The next turn must come by message, within waitPrompt, when a waiter
// other than quitter listens and is queued behind no live listener and
// fewer than releaseWakeTries dead entries (or, for "drop", when any waiter
// is left: each wakes as its connection fails), and p's hold is valid (a
// release of a lost hold hands nothing on); otherwise within waitLive.
func (mc *waitMachine) unlock(p *waitProc, variant string, quitter *waitProc) {
	rt := mc.rt
	valid := false
	if h := p.m.current(); h != nil {
		until, held := h.deadline()
		valid = held && until.After(time.Now().Add(waitNodeTimeout))
	}
	var waiters []*waitProc // the waiters that stay
	for _, w := range mc.in(procWaiting) {
		if w != quitter {
			waiters = append(waiters, w)
		}
	}
	prompt := false
	switch variant {
	case "plain", "cancel":
		prompt = valid && mc.promptTurn(quitter)
	case "drop":
		prompt = valid && len(waiters) > 0
	}
	msgs0 := int64(0)
	for _, w := range waiters {
		msgs0 += w.probe.msgs.Load()
		if variant == "mute" {
			w.probe.mute.Store(true)
		}
	}

	p.state = procIdle
	start := time.Now()
	var quit sync.WaitGroup
	when := 0 // of quitter's cancellation: before the unlock, during it, or just after
	if quitter != nil {
		quitter.state = procCancelling
		when = rapid.IntRange(0, 2).Draw(rt, "cancel before, during, after the unlock")
		switch when {
		case 0:
			quitter.cancel()
		case 1:
			quit.Go(quitter.cancel)
		}
	}
	err := p.m.UnlockCtx(context.Background())
	if variant == "drop" {
		mc.do1("CLIENT", "KILL", "TYPE", "pubsub")
	}
	if when == 2 {
		// The release's message is on its way to quitter, which may be
		// the head: turn and cancellation race.
		quitter.cancel()
	}
	quit.Wait()
	switch {
	case err == nil:
	case errors.Is(err, ErrLockLost) && !valid:
		mc.stats.counts["hold lost before its unlock"]++
	default:
		mc.fatalf("process %d: UnlockCtx: got %v, want nil", p.n, err)
	}
	if quitter != nil {
		mc.awaitResult(quitter)
	}

	what := fmt.Sprintf("process %d unlocked (%s)", p.n, variant)
	bound := waitLive
	if prompt {
		bound = waitPrompt
		what += ", a turn due by message"
	}
	turned := mc.settle(start, bound, what)
	if variant == "drop" {
		// As after "drop all": the next action finds every waiter
		// listening (a waiter whose watch fails twice polls, see
		// maxWatchFailures).
		mc.awaitQueued(mc.in(procWaiting), waitPrompt, what+", every pub/sub connection killed")
	}
	for _, w := range waiters {
		mc.stats.counts["messages dropped"] += int(w.probe.muted.Load())
		w.probe.mute.Store(false)
		w.probe.muted.Store(0)
	}
	if !turned {
		return
	}
	took := mc.lastTurn.Sub(start)
	if prompt {
		mc.stats.prompt = append(mc.stats.prompt, took)
	} else {
		mc.stats.slow = append(mc.stats.slow, took)
	}
	if prompt && variant == "plain" {
		// The release told the waiter at the head, whoever won the race
		// for the key.
		mc.eventually(time.Until(start.Add(waitPrompt)), what+": the release's message delivered", func() bool {
			n := int64(0)
			for _, w := range waiters {
				n += w.probe.msgs.Load()
			}
			return n > msgs0
		})
	}
}

// promptTurn reports whether a release now must give its turn to a live
// waiter by message: a waiting process listens and is queued, behind only
// entries nobody listens for (dead processes), fewer than
// releaseWakeTries-1 of them. quitter, a waiter giving up, is passed over:
// it passes a turn it gets on (lua/leave.lua).
func (mc *waitMachine) promptTurn(quitter *waitProc) bool {
	tries := 0
	for _, member := range mc.queue() {
		p := mc.byMember(member)
		if p != nil && p == quitter {
			continue
		}
		if tries++; tries >= releaseWakeTries {
			return false
		}
		if p == nil || mc.numsub(p.m.waitChan) == 0 {
			continue
		}
		return p.state == procWaiting
	}
	return false
}

// awaitQueued waits until each of ps holds, or is queued and listening (its
// channel subscribed): then a release tells it its turn.
func (mc *waitMachine) awaitQueued(ps []*waitProc, bound time.Duration, what string) {
	for _, p := range ps {
		mc.eventually(bound, fmt.Sprintf("%s: process %d queued and listening, or holding", what, p.n), func() bool {
			mc.collect()
			if p.state != procWaiting {
				return true
			}
			queued := false
			for _, member := range mc.queue() {
				queued = queued || mc.byMember(member) == p
			}
			return queued && mc.numsub(p.m.waitChan) > 0
		})
	}
}

// awaitResult waits for the LockCtx of p, whose ctx was cancelled.
func (mc *waitMachine) awaitResult(p *waitProc) {
	mc.eventually(waitSettle, fmt.Sprintf("process %d's cancelled LockCtx returning", p.n), func() bool {
		mc.collect()
		return p.result == nil
	})
}

// collect takes the results of the LockCtx calls that have returned, and
// fails the check on a violation their goroutines found.
func (mc *waitMachine) collect() {
	mc.mu.Lock()
	violations := mc.violations
	mc.mu.Unlock()
	if len(violations) > 0 {
		mc.fatalf("%s", strings.Join(violations, "\n"))
	}
	for _, p := range mc.procs {
		if p.result == nil {
			continue
		}
		select {
		case r := <-p.result:
			p.result = nil
			p.cancel()
			mc.finished(p, r)
		default:
		}
	}
}

// finished records the result of p's LockCtx.
func (mc *waitMachine) finished(p *waitProc, r waitResult) {
	switch p.state {
	case procWaiting:
		if r.err != nil {
			mc.fatalf("process %d: LockCtx of a live waiter, not cancelled: got %v, want it to wait until it holds", p.n, r.err)
		}
		p.state = procHolding
		mc.lastTurn = r.at
		mc.stats.counts["turn by "+r.kind]++
	case procCancelling:
		if r.err == nil {
			// It held before it saw its ctx end: legitimate, and it holds.
			p.state = procHolding
			mc.lastTurn = r.at
			mc.stats.counts["cancelled after the turn came"]++
			return
		}
		if !errors.Is(r.err, ErrNotObtained) || !errors.Is(r.err, context.Canceled) {
			mc.fatalf("process %d: cancelled LockCtx: got %v, want an error matching ErrNotObtained and context.Canceled", p.n, r.err)
		}
		if h := p.m.current(); h != nil {
			mc.fatalf("process %d: cancelled LockCtx failed (%v) yet holds: got token %d, want no hold", p.n, r.err, h.token)
		}
		p.state = procIdle
	case procDead:
		switch {
		case r.err == nil:
			mc.stats.counts["dead process's LockCtx held"]++
		case !errors.Is(r.err, ErrQuorum) && !errors.Is(r.err, ErrNotObtained):
			mc.fatalf("process %d, killed: LockCtx: got %v, want an error matching ErrQuorum or ErrNotObtained", p.n, r.err)
		}
	default:
		mc.fatalf("process %d (%v): a LockCtx result %v it should not have", p.n, p.state, r.err)
	}
}

// settle waits, from since, until a live process holds a valid hold or no
// live process waits, and fails the check if that takes longer than bound.
// It reports whether a LockCtx returned a hold meanwhile (mc.lastTurn).
func (mc *waitMachine) settle(since time.Time, bound time.Duration, what string) bool {
	for {
		mc.collect()
		if mc.liveHolder() != nil {
			return mc.lastTurn.After(since)
		}
		waiting := mc.in(procWaiting)
		if len(waiting) == 0 {
			return false
		}
		if elapsed := time.Since(since); elapsed > bound {
			var ns []int
			for _, p := range waiting {
				ns = append(ns, p.n)
			}
			mc.fatalf("%s: no live process holds %v later, processes %v waiting: got no turn, want one within %v\n%s", what, elapsed.Round(time.Millisecond), ns, bound, mc.describe())
		}
		time.Sleep(time.Millisecond) // between looks
	}
}

// check checks the invariants that hold between actions.
func (mc *waitMachine) check() {
	mc.collect()

	// At most one valid hold, in the lock key. The key is read first: a
	// hold still valid after the read was valid during it.
	key, exists := mc.get(mc.lockKey)
	now := time.Now()
	var holder *waitProc
	for _, p := range mc.procs {
		h := p.m.current()
		if h == nil {
			continue
		}
		if until, held := h.deadline(); !held || !until.After(now) {
			continue
		}
		if holder != nil {
			mc.fatalf("processes %d (%v) and %d (%v) both hold: got two valid holds, want at most one", holder.n, holder.state, p.n, p.state)
		}
		holder = p
		if want := keyValue(h.value, h.token); unmarked(key) != want {
			mc.fatalf("lock key, process %d (%v) holding: got %q (exists %v), want %q", p.n, p.state, key, exists, want)
		}
	}
	// Neither key is ever left without a TTL.
	if exists {
		if pttl := mc.pttl(mc.lockKey); pttl == -1 || pttl > waitExpiry.Milliseconds() {
			mc.fatalf("lock key's PTTL: got %dms, want 0 to %dms", pttl, waitExpiry.Milliseconds())
		}
	}
	if pttl := mc.pttl(mc.queueKey); pttl == -1 || pttl > queueExpiries*waitExpiry.Milliseconds() {
		mc.fatalf("waiters' queue's PTTL: got %dms, want none (-2) or 0 to %dms", pttl, queueExpiries*waitExpiry.Milliseconds())
	}

	// Only waiters, live or dead, are queued.
	for _, member := range mc.queue() {
		p := mc.byMember(member)
		if p == nil {
			mc.fatalf("waiters' queue: got %q, no process's, want only waiting or dead processes' entries", member)
		}
		if p.state == procIdle || p.state == procHolding {
			mc.fatalf("waiters' queue: got process %d's entry, %v, want only waiting or dead processes' entries", p.n, p.state)
		}
	}

	// A lock key of a process that neither holds nor waits is stranded,
	// unless its reaper still has the release to deliver.
	if exists {
		value, _, _ := strings.Cut(key, ":") // "<value>:<token>:<holder>"
		for _, p := range mc.procs {
			if p.state == procIdle && p.probe.owns(value) && !p.reaping() {
				mc.fatalf("lock key: got %q, a value of process %d, which is idle (its LockCtx failed or it unlocked): want it released", key, p.n)
			}
		}
	}
}

// finish ends every wait and hold of a check that passed, and checks that
// nothing is left: no hold, no live process in the queue, and the lock key
// gone within an expiry (a dead holder's expires).
func (mc *waitMachine) finish() {
	mc.step = "end of the check: every hold unlocked, every LockCtx cancelled"
	for _, p := range mc.in(procHolding) {
		p.state = procIdle
		if err := p.m.UnlockCtx(context.Background()); err != nil && !errors.Is(err, ErrLockLost) {
			mc.fatalf("process %d: UnlockCtx: got %v, want nil", p.n, err)
		}
	}
	for _, p := range mc.procs {
		if p.result == nil {
			continue
		}
		if p.state == procWaiting {
			p.state = procCancelling
		}
		p.cancel()
	}
	mc.eventually(waitSettle, "every cancelled LockCtx returning", func() bool {
		mc.collect()
		for _, p := range mc.procs {
			if p.result != nil {
				return false
			}
		}
		return true
	})
	for _, p := range mc.in(procHolding) { // it held before it saw its ctx end
		p.state = procIdle
		if err := p.m.UnlockCtx(context.Background()); err != nil && !errors.Is(err, ErrLockLost) {
			mc.fatalf("process %d: UnlockCtx: got %v, want nil", p.n, err)
		}
	}
	mc.check()
	for _, p := range mc.procs {
		if h := p.m.current(); h != nil && p.state != procDead {
			mc.fatalf("process %d, every call over: got a hold (token %d), want none", p.n, h.token)
		}
	}
	mc.eventually(waitExpiry+waitSettle, "the lock key gone after every call", func() bool {
		_, exists := mc.get(mc.lockKey)
		return !exists
	})
}

// close ends every goroutine of the check, passed or failed: LockCtx calls
// are cancelled, holds unlocked, proxies and clients closed, reapers done.
func (mc *waitMachine) close() {
	mc.mu.Lock()
	if mc.stale > 0 {
		mc.stats.counts["hold just over when LockCtx returned"] += mc.stale
	}
	mc.mu.Unlock()
	for _, p := range mc.procs {
		if p.cancel != nil {
			p.cancel()
		}
	}
	deadline := time.NewTimer(waitSettle)
	defer deadline.Stop()
	for _, p := range mc.procs {
		if p.result == nil {
			continue
		}
		select {
		case r := <-p.result:
			if r.err == nil && p.state != procDead {
				p.m.UnlockCtx(context.Background())
			}
		case <-deadline.C:
			mc.t.Errorf("process %d: LockCtx did not return within %v of its ctx's cancellation", p.n, waitSettle)
		}
		p.result = nil
	}
	for _, p := range mc.procs {
		if p.state == procHolding {
			p.m.UnlockCtx(context.Background())
		}
		p.close()
		p.proxy.Close()
	}
	reaped := time.Now().Add(waitSettle)
	for _, p := range mc.procs {
		for p.reaping() && time.Now().Before(reaped) {
			time.Sleep(time.Millisecond) // between looks
		}
	}
}

// describe renders the processes and the server's keys, for a failure
// message.
func (mc *waitMachine) describe() string {
	var b strings.Builder
	for _, p := range mc.procs {
		fmt.Fprintf(&b, "process %d (%s, waiter %s): %v", p.n, p.client, p.m.waiterID, p.state)
		if h := p.m.current(); h != nil {
			until, held := h.deadline()
			fmt.Fprintf(&b, "; hold %s:%d, held %v, %v left", h.value, h.token, held, time.Until(until).Round(time.Millisecond))
		}
		fmt.Fprintf(&b, "; %d rounds, %d messages\n", p.probe.rounds.Load(), p.probe.msgs.Load())
	}
	key, exists := mc.get(mc.lockKey)
	fmt.Fprintf(&b, "lock key: %q (exists %v, PTTL %dms)", key, exists, mc.pttl(mc.lockKey))
	if exists {
		value, _, _ := strings.Cut(key, ":") // "<value>:<token>:<holder>"
		for _, p := range mc.procs {
			if p.probe.owns(value) {
				fmt.Fprintf(&b, ", process %d's", p.n)
			}
		}
	}
	fmt.Fprintf(&b, "\nqueue (PTTL %dms):", mc.pttl(mc.queueKey))
	for _, member := range mc.queue() {
		who := "nobody"
		if p := mc.byMember(member); p != nil {
			who = fmt.Sprintf("process %d", p.n)
		}
		id, _, _ := strings.Cut(member, "+")
		fmt.Fprintf(&b, " %s (%s, %d listening)", member, who, mc.numsub(mc.procs[0].m.keys.channel+":"+id))
	}
	return b.String()
}

// in returns the processes in state s.
func (mc *waitMachine) in(s procState) []*waitProc {
	var ps []*waitProc
	for _, p := range mc.procs {
		if p.state == s {
			ps = append(ps, p)
		}
	}
	return ps
}

// liveHolder returns the live process that holds a valid hold, if any.
func (mc *waitMachine) liveHolder() *waitProc {
	now := time.Now()
	for _, p := range mc.in(procHolding) {
		if h := p.m.current(); h != nil {
			if until, held := h.deadline(); held && until.After(now) {
				return p
			}
		}
	}
	return nil
}

// byMember returns the process whose waiter a queue member names:
// "<waiter id>", or "<waiter id>+<expiry ms>+<nonce>" (see lua/acquire.lua).
func (mc *waitMachine) byMember(member string) *waitProc {
	id, _, _ := strings.Cut(member, "+")
	for _, p := range mc.procs {
		if p.m.waiterID == id {
			return p
		}
	}
	return nil
}

func (p *waitProc) reaping() bool {
	p.m.reaper.mu.Lock()
	defer p.m.reaper.mu.Unlock()
	return p.m.reaper.running
}

// fatalf fails the check, naming the step under way.
func (mc *waitMachine) fatalf(format string, args ...any) {
	mc.rt.Helper()
	mc.rt.Fatalf("step %d (%s): %s", mc.steps+1, mc.step, fmt.Sprintf(format, args...))
}

// eventually fails the check unless cond holds within d, naming the step.
func (mc *waitMachine) eventually(d time.Duration, what string, cond func() bool) {
	mc.rt.Helper()
	eventually(mc.rt, d, fmt.Sprintf("step %d (%s): %s", mc.steps+1, mc.step, what), cond)
}

// do1 runs one command on the server, directly (not through a proxy).
func (mc *waitMachine) do1(args ...any) any {
	cmd, _ := args[0].(string)
	reply, err := mc.admin.Do(cmd, args[1:]...)
	if err != nil {
		mc.fatalf("%v: %v", args, err)
	}
	return reply
}

func (mc *waitMachine) get(key string) (string, bool) {
	v, err := redis.String(mc.do1("GET", key), nil)
	if errors.Is(err, redis.ErrNil) {
		return "", false
	}
	if err != nil {
		mc.fatalf("GET %s: %v", key, err)
	}
	return v, true
}

func (mc *waitMachine) pttl(key string) int64 {
	n, err := redis.Int64(mc.do1("PTTL", key), nil)
	if err != nil {
		mc.fatalf("PTTL %s: %v", key, err)
	}
	return n
}

// queue returns the members of the waiters' queue, head first.
func (mc *waitMachine) queue() []string {
	ms, err := redis.Strings(mc.do1("ZRANGE", mc.queueKey, 0, -1), nil)
	if err != nil {
		mc.fatalf("ZRANGE %s: %v", mc.queueKey, err)
	}
	return ms
}

// numsub returns the number of subscriptions to channel.
func (mc *waitMachine) numsub(channel string) int {
	vs, err := redis.Values(mc.do1("PUBSUB", "NUMSUB", channel), nil)
	if err != nil || len(vs) != 2 {
		mc.fatalf("PUBSUB NUMSUB %s: %v %v", channel, vs, err)
	}
	n, err := redis.Int(vs[1], nil)
	if err != nil {
		mc.fatalf("PUBSUB NUMSUB %s: %v", channel, err)
	}
	return n
}

// pubsubClients returns the ids of the server's pub/sub connections.
func (mc *waitMachine) pubsubClients() []string {
	list, err := redis.String(mc.do1("CLIENT", "LIST", "TYPE", "pubsub"), nil)
	if err != nil {
		mc.fatalf("CLIENT LIST: %v", err)
	}
	var ids []string
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		if id, ok := strings.CutPrefix(strings.Fields(line + " x")[0], "id="); ok {
			ids = append(ids, id)
		}
	}
	return ids
}
