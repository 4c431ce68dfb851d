package netlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/redistest"
)

// propMinSteps is how many actions TestProperty runs at least for each node
// count in a plain `go test`: rapid's default 100 checks of about 30 steps
// each are repeated (with fresh seeds) until it is reached, so that one CI
// run explores well over 10,000 steps in all. More with -rapid.checks or
// -rapid.steps.
const propMinSteps = 3400

// TestProperty drives four clients of one lock name on 1, 3 and 5 miniredis
// nodes through random sequences of TryLockCtx, LockCtx with a short
// deadline, LockCtx cancelled midway through its acquire round, a local
// waiter cancelled while a hand-off is in flight, UnlockCtx, ExtendCtx, time
// passing (by random amounts and to just around a key's expiry, on every
// node, down or not), nodes crashing or partitioned and coming back with
// their data, script flushes and lock keys deleted behind the clients' back. Clients 0 and 1 share their connections (one process,
// two NetMutex objects); clients 2 and 3 have their own, as other processes.
// A fifth client, 4, in the first process and with auto-extend on (so that
// Unlock hands a hold to a local waiter), is used only by the action "cancel
// while a hand-off is in flight": it locks, a goroutine sharing its NetMutex
// queues behind it, and the waiter's context is cancelled while the hold is
// unlocked, before, after or at the same time; the waiter may be held where
// its turn and its context's end are both ready when it starts to wait. A waiter whose context was cancelled before the unlock must
// fail; one that gets the hold holds the very hold handed over; otherwise
// the hold is released. Client 4 never holds between steps.
//
// The model follows every node's lock key and fence counter and every
// client's hold and learned counter exactly, and each answer is checked
// against it: the result and error of every call (always the documented
// sentinels), the fencing token of every acquisition (strictly increasing),
// and after every step the key (value, token, TTL) and counter on every node
// (so nothing is left behind by an Unlock or a failed or cancelled acquire),
// Token and Lost of every client, and that at most one client believes it
// holds a quorum of intact keys.
//
// Deleting keys and moving the servers' clocks past the clients' (their
// local deadline does not move with FastForward) break the model's
// assumptions, so two clients may then both believe they hold. The test
// checks that this happens only when the older hold had lost its quorum of
// keys, and that the older holder then never hears success again: its next
// ExtendCtx or UnlockCtx reports the loss (ErrLockLost, with Lost closed) or
// fails for want of nodes.
func TestProperty(t *testing.T) {
	total := 0
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			var steps atomic.Int64
			stats := &propStats{m: map[string]int{}}
			start := time.Now()
			for rounds := 0; ; rounds++ {
				rapid.Check(t, func(rt *rapid.T) { checkModel(rt, n, stats, &steps) })
				if steps.Load() >= propMinSteps || rapidReproducing() || t.Failed() {
					break
				}
			}
			total += int(steps.Load())
			redistest.Report(t, "N=%d: %d steps explored in %v; outcomes %v", n, steps.Load(), time.Since(start).Round(time.Millisecond), stats)
		})
	}
	redistest.Report(t, "%d steps explored in all", total)
}

// modelClient is the model of one client (one NetMutex).
type modelClient struct {
	m          *NetMutex
	cancel     []*cancelBackend // its backends, one per node
	held, lost bool             // has a hold; the hold was reported lost
	value      string           // the current hold's lock value
	token      uint64
	seen       uint64 // highest fence counter the client has learned
	// overtaken: another client acquired while this one still believed it
	// held (possible only after the model's assumptions were broken). Its
	// next ExtendCtx or UnlockCtx must not succeed.
	overtaken bool
}

// The model's constants.
const (
	propExpiry  = 8 * time.Second
	propLockKey = "netlock:{prop}"
	propClients = 4 // 0-3, drawn by the actions; cs[propClients] is the hand-off client
)

// checkModel runs one check of TestProperty on nNodes nodes: rapid draws
// the actions, and the invariants are checked after each.
func checkModel(rt *rapid.T, nNodes int, stats *propStats, steps *atomic.Int64) {
	mc := newPropMachine(rt, nNodes, stats, steps)
	defer mc.close()
	rt.Repeat(mc.actions())
}

// propMachine is one check of TestProperty: the nodes and clients, and the
// model every answer of theirs is checked against.
type propMachine struct {
	rt     *rapid.T
	nNodes int
	quorum int
	stats  *propStats
	steps  *atomic.Int64 // the actions run, over every check

	nodes    []*modelNode
	pools    []*redis.Pool
	cs       []*modelClient // the clients 0-3, then the hand-off client
	fenceKey string
	client   *rapid.Generator[int] // draws one of the clients 0-3

	now       time.Duration // model time: every node's clock moves together
	lastToken uint64        // the token of the latest acquisition
}

// newPropMachine starts nNodes miniredis nodes and the clients on them.
func newPropMachine(rt *rapid.T, nNodes int, stats *propStats, steps *atomic.Int64) *propMachine {
	mc := &propMachine{rt: rt, nNodes: nNodes, quorum: nNodes/2 + 1, stats: stats, steps: steps}
	mc.nodes = make([]*modelNode, nNodes)
	// Clients 0 and 1 share one pool per node (one process, two NetMutex
	// objects); clients 2 and 3 have their own, as other processes.
	shared := make([]Backend, nNodes)
	for k := range mc.nodes {
		n := &modelNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}
		if err := n.srv.Start(); err != nil {
			rt.Fatal(err)
		}
		mc.nodes[k] = n
		n.addr, n.up = n.srv.Addr(), true
		p := n.newPool()
		mc.pools = append(mc.pools, p)
		shared[k] = NewRedigo(p)
	}
	mc.cs = make([]*modelClient, propClients+1)
	for i := range mc.cs {
		c := &modelClient{}
		backends := make([]Backend, nNodes)
		for k, n := range mc.nodes {
			b := shared[k]
			if i == 2 || i == 3 {
				p := n.newPool()
				mc.pools = append(mc.pools, p)
				b = NewRedigo(p)
			}
			cb := &cancelBackend{Backend: b}
			c.cancel = append(c.cancel, cb)
			backends[k] = cb
		}
		// Without auto-extend Unlock never hands a hold over, and the keys'
		// TTLs move only as the model says. The hand-off client has it on:
		// it holds only within one action, in which model time stands
		// still, so an extend by its watchdog (a third of the expiry in)
		// would set the TTL the model expects anyway.
		autoExtend := i == propClients
		m, err := New("prop", backends, WithExpiry(propExpiry), WithAutoExtend(autoExtend),
			// The model takes every node that is up to answer: a node
			// timeout well above any stall of a loaded machine (-race, CI
			// running packages side by side), so that a call to one never
			// times out. Calls to a node that is down fail at once
			// (refused, or errPartitioned), never waiting for it.
			WithNodeTimeout(2*time.Second), WithRetryDelay(time.Millisecond, 2*time.Millisecond),
			// One round per failed call, as the model counts them: riding
			// out an outage is tested by TestWaitersRideOutRestart and
			// TestRedisDownForGood.
			WithOutageWindow(0))
		if err != nil {
			rt.Fatal(err)
		}
		c.m = m
		mc.cs[i] = c
	}
	mc.fenceKey = mc.cs[0].m.keys.fence
	mc.client = rapid.IntRange(0, propClients-1)
	return mc
}

// close unlocks what the clients hold and stops the clients and nodes.
func (mc *propMachine) close() {
	for _, c := range mc.cs {
		if c.held {
			c.m.UnlockCtx(context.Background())
		}
	}
	// A closed pool is a final error: the reapers end at their next pass.
	for _, p := range mc.pools {
		p.Close()
	}
	mc.waitReapers()
	for _, n := range mc.nodes {
		n.srv.Close()
	}
}

// waitReapers waits until no client's reaper has releases pending.
func (mc *propMachine) waitReapers() {
	eventually(mc.rt, 10*time.Second, "every client's reaper done", func() bool {
		for _, c := range mc.cs {
			c.m.reaper.mu.Lock()
			running := c.m.reaper.running
			c.m.reaper.mu.Unlock()
			if running {
				return false
			}
		}
		return true
	})
}

// actions are TestProperty's actions, by name, and its invariants ("").
func (mc *propMachine) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"TryLockCtx":                           mc.tryLockCtx,
		"LockCtx short deadline":               mc.lockCtxShortDeadline,
		"LockCtx cancelled midway":             mc.lockCtxCancelledMidway,
		"cancel while a hand-off is in flight": mc.handOffCancelled,
		"UnlockCtx":                            mc.unlockCtx,
		"ExtendCtx":                            mc.extendCtx,
		"advance time":                         mc.advanceTime,
		"advance to around an expiry":          mc.advanceToExpiry,
		"node down":                            mc.nodeDown,
		"node up":                              mc.nodeUp,
		"SCRIPT FLUSH":                         mc.scriptFlush,
		"delete key behind its back":           mc.deleteKey,
		"":                                     mc.check,
	}
}

// tryLockCtx: a client's TryLockCtx.
func (mc *propMachine) tryLockCtx(rt *rapid.T) {
	mc.step("try/" + mc.tryLock(mc.client.Draw(rt, "client")))
}

// lockCtxShortDeadline: a client's LockCtx, with a short deadline when it
// must fail (held here, or too few free nodes), a generous one when it must
// succeed or fail at once.
func (mc *propMachine) lockCtxShortDeadline(rt *rapid.T) {
	ctx := context.Background()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	up, free := mc.count()
	wait := 10 * time.Second
	if c.held || (up >= mc.quorum && free < mc.quorum) {
		wait = 5 * time.Millisecond
	}
	dctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := c.m.LockCtx(dctx)
	switch {
	case c.held:
		// Queued behind its own hold in this process.
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			rt.Fatalf("client %d LockCtx while holding: got %v, want ErrNotObtained and DeadlineExceeded", i, err)
		}
		mc.step("lock/held")
	case up < mc.quorum:
		mc.round(i)
		mc.checkErr(fmt.Sprintf("client %d LockCtx with %d nodes up", i, up), err, ErrQuorum)
		mc.step("lock/quorum")
	case free >= mc.quorum:
		// The first failed round learns every answering counter,
		// so the next proposes above all of them.
		for r := 0; ; r++ {
			res, tok := mc.round(i)
			if res == "ok" {
				if err != nil {
					rt.Fatalf("client %d LockCtx (%d free): %v", i, free, err)
				}
				mc.acquired(i, tok)
				mc.step("lock/ok")
				return
			}
			if r == 3 {
				rt.Fatalf("model: no acquisition after %d rounds", r+1)
			}
		}
	default:
		// ErrNotObtained; or ErrQuorum if the 5 ms passed before a quorum
		// of the nodes answered (a loaded machine): never both.
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNotObtained) == errors.Is(err, ErrQuorum) {
			rt.Fatalf("client %d LockCtx (%d up, %d free): got %v, want DeadlineExceeded, and ErrNotObtained or ErrQuorum", i, up, free, err)
		}
		// It made as many rounds as fit in the deadline; a round that
		// granted on free nodes released them (what the deadline cut
		// short, the reaper releases a moment later), but moved counters.
		mc.cleanedUp(c.m)
		mc.resync(i)
		mc.step("lock/busy")
	}
}

// lockCtxCancelledMidway: a client's TryLockCtx or LockCtx whose context
// is cancelled while the acquire round is under way: on one node just
// before or just after its call, while the other nodes' calls are in
// flight. Whatever the nodes answered, the call fails with the cancellation
// and leaves nothing held: the invariant compares every node's key with the
// model, which this call must not change.
func (mc *propMachine) lockCtxCancelledMidway(rt *rapid.T) {
	ctx := context.Background()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	if c.held {
		mc.step("cancel/held") // would wait locally, never reaching a node
		return
	}
	k := rapid.IntRange(0, mc.nNodes-1).Draw(rt, "cancel at node")
	after := rapid.Bool().Draw(rt, "cancel after the call")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.cancel[k].arm(cancel, after)
	var err error
	if rapid.Bool().Draw(rt, "try") {
		var ok bool
		ok, err = c.m.TryLockCtx(cctx)
		if ok {
			rt.Fatalf("client %d TryLockCtx cancelled midway: got true", i)
		}
	} else {
		err = c.m.LockCtx(cctx)
	}
	if c.cancel[k].fn.Load() != nil {
		rt.Fatalf("client %d: the acquire never reached node %d", i, k)
	}
	// ErrNotObtained, or ErrQuorum where too few nodes answered (down, or a
	// connection broken by a restart; not cut short by the cancellation):
	// never both (TestOutageIsNotBusy tells which).
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotObtained) == errors.Is(err, ErrQuorum) {
		rt.Fatalf("client %d acquire cancelled midway: got %v, want context.Canceled and one of ErrNotObtained or ErrQuorum", i, err)
	}
	if h := c.m.current(); h != nil {
		rt.Fatalf("client %d holds after a cancelled acquire", i)
	}
	// Grants on free nodes were released; their counters moved.
	mc.resync(i)
	mc.step(fmt.Sprintf("cancel/after=%v", after))
}

// handOffCancelled: the hand-off client locks, and a goroutine sharing its
// NetMutex queues behind it. The waiter's context is cancelled and the
// client unlocks, in a drawn order: Unlock hands the hold over (a turn sent
// to the waiter) unless the waiter has left the queue first. Staged, the
// waiter is held where it queued and is about to wait (in its first
// ctx.Done, see windowCtx) until both have happened, so its turn and its
// context's end are ready at once when it waits.
func (mc *propMachine) handOffCancelled(rt *rapid.T) {
	ctx := context.Background()
	const i = propClients
	c := mc.cs[i]
	if res := mc.tryLock(i); res != "ok" {
		mc.step("handoff-cancel/" + res) // nothing to hand over
		return
	}
	order := rapid.SampledFrom([]string{"cancel first", "unlock first", "together"}).Draw(rt, "order")
	staged := rapid.Bool().Draw(rt, "staged")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	arrived := make(chan struct{}, 1)
	goOn := make(chan struct{})
	if !staged {
		close(goOn)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.m.LockCtx(&windowCtx{Context: wctx, arrived: arrived, goOn: goOn}) }()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-arrived:
	case <-timer.C:
		rt.Fatalf("client %d's waiter did not start to wait within 10s", i)
	}
	c.m.mu.Lock()
	queued := len(c.m.waiters)
	c.m.mu.Unlock()
	if queued != 1 {
		// The staging needs the waiter to ask for Done only once
		// it is in line, as own does.
		rt.Fatalf("client %d's waiter asked for ctx.Done with %d waiters queued, want 1", i, queued)
	}
	var uerr error
	switch order {
	case "cancel first":
		cancel()
		uerr = c.m.UnlockCtx(ctx)
	case "unlock first":
		uerr = c.m.UnlockCtx(ctx)
		cancel()
	default:
		var wg sync.WaitGroup
		wg.Go(cancel)
		wg.Go(func() { uerr = c.m.UnlockCtx(ctx) })
		wg.Wait()
	}
	if staged {
		close(goOn)
	}
	var err error
	select {
	case err = <-errc:
	case <-timer.C:
		rt.Fatalf("client %d's waiter (%s, staged %v): LockCtx did not return within 10s", i, order, staged)
	}
	outcome := "gave up"
	h := c.m.current()
	if err == nil {
		if order == "cancel first" {
			rt.Fatalf("client %d's waiter, cancelled before the unlock (staged %v): LockCtx got nil, want ErrNotObtained and context.Canceled", i, staged)
		}
		// A hand-off: the waiter holds the very hold the client
		// had, and no node was asked anything.
		if uerr != nil {
			rt.Fatalf("client %d UnlockCtx handing the hold over: got %v, want nil", i, uerr)
		}
		if h == nil {
			rt.Fatalf("client %d's waiter got nil: got no hold, want the hold handed over", i)
		}
		if h.value != c.value || h.token != c.token {
			rt.Fatalf("client %d's waiter got nil: got the hold of token %d, want the hold handed over (token %d)", i, h.token, c.token)
		}
		mc.checkNodes()
		outcome = "held"
		uerr = c.m.UnlockCtx(ctx) // the waiter's Unlock
	} else {
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			rt.Fatalf("client %d's waiter (%s, staged %v): LockCtx got %v, want nil or ErrNotObtained and context.Canceled", i, order, staged, err)
		}
		if h != nil {
			rt.Fatalf("client %d holds after its waiter gave up and it unlocked", i)
		}
	}
	// Either way the hold is released now: by the client's Unlock,
	// by the waiter passing on a hand-off it no longer wanted, or
	// by the waiter's Unlock; uerr is the Unlock's that returned
	// the outcome (nil after a hand-off).
	mc.unlocked(i, uerr)
	mc.step(fmt.Sprintf("handoff-cancel/%s/staged=%v/%s", order, staged, outcome))
}

// unlockCtx: a client's UnlockCtx.
func (mc *propMachine) unlockCtx(rt *rapid.T) {
	ctx := context.Background()
	i := mc.client.Draw(rt, "client")
	err := mc.cs[i].m.UnlockCtx(ctx)
	mc.step("unlock/" + mc.unlocked(i, err))
}

// extendCtx: a client's ExtendCtx.
func (mc *propMachine) extendCtx(rt *rapid.T) {
	ctx := context.Background()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	err := c.m.ExtendCtx(ctx)
	switch {
	case !c.held:
		mc.checkErr(fmt.Sprintf("client %d ExtendCtx without a hold", i), err, ErrNotHeld)
		mc.step("extend/notheld")
		return
	case c.lost:
		mc.checkErr(fmt.Sprintf("client %d ExtendCtx of a lost hold", i), err, ErrLockLost)
		mc.step("extend/lost")
		return
	}
	// Every node that holds our value is extended, whatever the
	// outcome.
	okN, gone, want := mc.settleWant(i, func(n *modelNode) { n.key.exp = mc.now + propExpiry })
	mc.checkErr(fmt.Sprintf("client %d ExtendCtx (%d extended, %d gone)", i, okN, gone), err, want)
	mc.overtaken(i, "extend", err)
	if want == ErrLockLost {
		c.lost = true
	}
	mc.step("extend/" + errName(want))
}

// advanceTime moves every node's clock by up to 12s.
func (mc *propMachine) advanceTime(rt *rapid.T) {
	mc.advance(time.Duration(rapid.IntRange(0, 12000).Draw(rt, "ms")) * time.Millisecond)
	mc.step("advance time")
}

// advanceToExpiry moves every node's clock to 1ms before, exactly at, or
// 1ms after a key's expiry (or one expiry from now when no key is set): the
// boundary where a key is still there, or just gone.
func (mc *propMachine) advanceToExpiry(rt *rapid.T) {
	d := propExpiry
	var exps []time.Duration
	for _, n := range mc.nodes {
		if n.key.value != "" {
			exps = append(exps, n.key.exp-mc.now)
		}
	}
	if len(exps) > 0 {
		d = exps[rapid.IntRange(0, len(exps)-1).Draw(rt, "key")]
	}
	d += time.Duration(rapid.IntRange(-1, 1).Draw(rt, "ms off")) * time.Millisecond
	mc.advance(max(d, 0))
	mc.step("advance to expiry")
}

// nodeDown crashes or partitions a node that is up (see modelNode).
func (mc *propMachine) nodeDown(rt *rapid.T) {
	k, ok := mc.drawNode(true)
	if !ok {
		mc.step("node down/none")
		return
	}
	n := mc.nodes[k]
	if rapid.Bool().Draw(rt, "partition") {
		n.partitioned.Store(true) // first: no new connection from now on
		n.srv.Close()
		mc.step("node down/partition")
	} else {
		n.srv.Close()
		n.gen.Add(1) // after: a connection dialled before is cut
		mc.step("node down/crash")
	}
	n.up = false
}

// nodeUp brings a node that is down back, with its data.
func (mc *propMachine) nodeUp(rt *rapid.T) {
	k, ok := mc.drawNode(false)
	if !ok {
		mc.step("node up/none")
		return
	}
	n := mc.nodes[k]
	n.gen.Add(1) // before: a connection of the new server is never dropped
	if err := n.srv.Restart(); err != nil {
		rt.Fatalf("restart node %d: %v", k, err)
	}
	n.partitioned.Store(false)
	n.up = true
	// The releases queued while the node was partitioned are
	// delivered at the reaper's next pass: a key of a hold unlocked
	// meanwhile goes then (wait for it). Any other queued release
	// only leaves a tombstone of a value no key will hold again.
	if v := n.key.value; v != "" && n.queued[v] {
		if mc.current(n.key) {
			rt.Fatalf("model: node %d: a release of the current hold of client %d is queued", k, n.key.client)
		}
		stale := keyValue(v, n.key.token)
		eventually(rt, 5*time.Second, fmt.Sprintf("node %d: the release of %q queued while it was partitioned delivered", k, stale), func() bool {
			got, _ := n.srv.Get(propLockKey)
			return unmarked(got) != stale
		})
		n.key = modelKey{}
		mc.stats.add("reaped stale key")
	}
	clear(n.queued)
	mc.step("node up")
}

// scriptFlush flushes the scripts of a node that is up.
func (mc *propMachine) scriptFlush(rt *rapid.T) {
	k, ok := mc.drawNode(true)
	if !ok {
		mc.step("SCRIPT FLUSH/none")
		return
	}
	conn, err := redis.Dial("tcp", mc.nodes[k].addr)
	if err != nil {
		rt.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Do("SCRIPT", "FLUSH"); err != nil {
		rt.Fatal(err)
	}
	mc.step("SCRIPT FLUSH")
}

// deleteKey deletes the lock key of a node that is up, behind the clients'
// back.
func (mc *propMachine) deleteKey(rt *rapid.T) {
	k, ok := mc.drawNode(true)
	if !ok {
		mc.step("delete key/none")
		return
	}
	mc.nodes[k].srv.Del(propLockKey)
	mc.nodes[k].key = modelKey{}
	mc.step("delete key")
}

// check checks the invariants: every node's key and counter are the
// model's, every client's learned counter, Token and Lost too, and at most
// one client holds a quorum of valid keys.
func (mc *propMachine) check(rt *rapid.T) {
	mc.checkNodes()
	believers := 0
	for i, c := range mc.cs {
		if got := c.m.seen.Load(); got != c.seen {
			rt.Fatalf("client %d: learned counter %d, model says %d", i, got, c.seen)
		}
		wantTok := uint64(0)
		if c.held {
			wantTok = c.token
		}
		if got := c.m.Token(); got != wantTok {
			rt.Fatalf("client %d: Token() %d, model says %d", i, got, wantTok)
		}
		lost := false
		select {
		case <-c.m.Lost():
			lost = true
		default:
		}
		if lost != (!c.held || c.lost) {
			rt.Fatalf("client %d: Lost() closed %v, model says held %v lost %v", i, lost, c.held, c.lost)
		}
		// Safety: at most one client believes it holds, with a
		// quorum of valid keys on the servers.
		valid := 0
		for _, n := range mc.nodes {
			if v, err := n.srv.Get(propLockKey); err == nil && c.held && unmarked(v) == keyValue(c.value, c.token) {
				valid++
			}
		}
		if c.held && !lost && valid >= mc.quorum {
			believers++
		}
	}
	if believers > 1 {
		rt.Fatalf("%d clients hold a quorum of valid keys", believers)
	}
}

// current reports whether key is of the current hold of its client
// (lost or not): such a key is never released behind the model's back.
func (mc *propMachine) current(key modelKey) bool {
	c := mc.cs[key.client]
	return key.value != "" && c.held && c.value == key.value
}

// learn records that client c has learned counter.
func (mc *propMachine) learn(c *modelClient, counter uint64) {
	c.seen = max(c.seen, counter)
}

// count counts the nodes that are up, and of them those whose key is free.
func (mc *propMachine) count() (up, free int) {
	for _, n := range mc.nodes {
		if n.up {
			up++
			if n.key.value == "" {
				free++
			}
		}
	}
	return up, free
}

// intact counts the nodes, up or down, whose key still holds client i's
// current value.
func (mc *propMachine) intact(i int) int {
	n := 0
	for _, nd := range mc.nodes {
		if mc.cs[i].held && nd.key.value != "" && nd.key.value == mc.cs[i].value {
			n++
		}
	}
	return n
}

// round runs one acquire round of client i in the model (see
// acquireRound): "ok" (the hold is then recorded, with the token it must
// have), "quorum", "ballot" (the key is free on a quorum, a ballot was
// refused) or "busy".
func (mc *propMachine) round(i int) (string, uint64) {
	c := mc.cs[i]
	proposal := c.seen + 1
	if mc.nNodes == 1 {
		// One node: the script increments its own counter.
		proposal = mc.nodes[0].counter + 1
	}
	up, fenced, nFenced := 0, false, 0
	var granted []int
	for k, n := range mc.nodes {
		if !n.up {
			continue
		}
		up++
		switch {
		case n.key.value != "":
			if mc.nNodes > 1 {
				// A held key tells its counter to ballots only.
				mc.learn(c, n.counter)
			}
		case proposal <= n.counter:
			fenced = true
			nFenced++
			mc.learn(c, n.counter)
		default:
			granted = append(granted, k)
			n.counter = proposal
			mc.learn(c, proposal)
		}
	}
	switch {
	case len(granted) >= mc.quorum:
		// The value is random: take it from the hold (acquired fails
		// the check if the call did not acquire).
		c.held, c.lost, c.overtaken, c.token, c.value = true, false, false, proposal, ""
		if h := c.m.current(); h != nil {
			c.value = h.value
		}
		for _, k := range granted {
			mc.nodes[k].key = modelKey{value: c.value, token: proposal, client: i, exp: mc.now + propExpiry}
		}
		return "ok", proposal
	case up < mc.quorum:
		return "quorum", 0 // the grants were released; the counters stay
	case fenced && len(granted)+nFenced >= mc.quorum:
		return "ballot", 0
	}
	return "busy", 0
}

// acquired checks a successful acquisition of client i against the
// model's round: the token the round granted, above every earlier one.
// Another client that still believes it holds must have lost its quorum
// of keys behind its back (deleted, or expired by a server clock that ran
// ahead): it is marked overtaken.
func (mc *propMachine) acquired(i int, want uint64) {
	h := mc.cs[i].m.current()
	if h == nil {
		mc.rt.Fatalf("client %d acquired but has no hold", i)
	}
	if h.token != want || want <= mc.lastToken {
		mc.rt.Fatalf("client %d acquired with token %d, want %d (last token %d)", i, h.token, want, mc.lastToken)
	}
	mc.lastToken = want
	for j, o := range mc.cs {
		if j == i || !o.held || o.lost {
			continue
		}
		if n := mc.intact(j); n >= mc.quorum {
			mc.rt.Fatalf("client %d acquired while client %d still holds %d intact keys (quorum %d)", i, j, n, mc.quorum)
		}
		o.overtaken = true
		mc.stats.add("overtaken (assumptions broken)")
	}
}

// resync takes the fence counters of the up nodes and client i's learned
// counter from the servers, after a call that made an unknown number of
// rounds; they may only have grown.
func (mc *propMachine) resync(i int) {
	for k, n := range mc.nodes {
		if !n.up {
			continue
		}
		got := serverCounter(mc.rt, n.srv, mc.fenceKey)
		if got < n.counter {
			mc.rt.Fatalf("node %d: fence counter went down from %d to %d", k, n.counter, got)
		}
		n.counter = got
	}
	c := mc.cs[i]
	if got := c.m.seen.Load(); got < c.seen {
		mc.rt.Fatalf("client %d: learned counter went down from %d to %d", i, c.seen, got)
	} else {
		c.seen = got
	}
}

// settleWant counts a release or extend of client i's hold on the up
// nodes, applying fn to those that hold its value, and returns the error
// settle must give.
func (mc *propMachine) settleWant(i int, fn func(n *modelNode)) (okN, gone int, want error) {
	for _, n := range mc.nodes {
		if !n.up {
			continue
		}
		if n.key.value != "" && n.key.value == mc.cs[i].value {
			okN++
			fn(n)
		} else {
			gone++
		}
	}
	switch {
	case okN >= mc.quorum:
		return okN, gone, nil
	case gone > mc.nNodes-mc.quorum:
		return okN, gone, ErrLockLost
	}
	return okN, gone, ErrQuorum
}

func (mc *propMachine) checkErr(what string, err, want error) {
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		mc.rt.Fatalf("%s: got %v, want %v", what, err, want)
	}
	if err != nil && !documented(err) {
		mc.rt.Fatalf("%s: error %v matches no documented sentinel", what, err)
	}
}

// overtaken checks the answer of an ExtendCtx or UnlockCtx of a client
// that was overtaken: never success.
func (mc *propMachine) overtaken(i int, what string, err error) {
	if !mc.cs[i].overtaken {
		return
	}
	if err == nil {
		mc.rt.Fatalf("client %d %s after another client acquired: got success, want the loss reported", i, what)
	}
	if errors.Is(err, ErrLockLost) {
		mc.stats.add("overtaken: loss detected by " + what)
	} else {
		mc.stats.add("overtaken: " + what + " failed, nodes down")
	}
}

// tryLock makes client i's TryLockCtx, checks its answer against the
// model, and returns the outcome's name.
func (mc *propMachine) tryLock(i int) string {
	ctx := context.Background()
	c := mc.cs[i]
	up, free := mc.count()
	ok, err := c.m.TryLockCtx(ctx)
	if c.held {
		// Held in this process: no round trip at all.
		if ok || err != nil {
			mc.rt.Fatalf("client %d TryLockCtx while holding: got %v, %v", i, ok, err)
		}
		return "held"
	}
	// One attempt: a refused ballot on a free lock is retried at
	// once (maxBallots times), anything else ends it.
	res, tok := "", uint64(0)
	for r := 0; ; r++ {
		if res, tok = mc.round(i); res != "ballot" || r == maxBallots {
			break
		}
	}
	switch res {
	case "ok":
		if !ok || err != nil {
			mc.rt.Fatalf("client %d TryLockCtx (%d up, %d free): got %v, %v, want true", i, up, free, ok, err)
		}
		mc.acquired(i, tok)
	case "quorum":
		if ok || !errors.Is(err, ErrQuorum) {
			mc.rt.Fatalf("client %d TryLockCtx (%d up): got %v, %v, want an ErrQuorum error", i, up, ok, err)
		}
		mc.checkErr("TryLockCtx", err, ErrQuorum)
	default:
		// Contended: (false, nil). A quorum of free nodes with
		// refused ballots is retried at once (above), so this is
		// reached with a free quorum only if the ballots were
		// refused maxBallots+1 times in a row; counted as
		// "busy-but-free".
		if ok || err != nil {
			mc.rt.Fatalf("client %d TryLockCtx (%d up, %d free): got %v, %v, want false, nil", i, up, free, ok, err)
		}
		if free >= mc.quorum {
			res = "busy-but-free"
		}
	}
	return res
}

// unlocked checks err, the answer of client i's UnlockCtx, against the
// model, applies the release to it, and returns the outcome's name.
func (mc *propMachine) unlocked(i int, err error) string {
	c := mc.cs[i]
	if !c.held {
		mc.checkErr(fmt.Sprintf("client %d UnlockCtx without a hold", i), err, ErrNotHeld)
		return "notheld"
	}
	okN, gone, want := mc.settleWant(i, func(n *modelNode) { n.key = modelKey{} })
	if c.lost {
		want = ErrLockLost
	}
	mc.checkErr(fmt.Sprintf("client %d UnlockCtx (%d released, %d gone, lost %v)", i, okN, gone, c.lost), err, want)
	mc.overtaken(i, "unlock", err)
	// Down nodes keep the key: stale, until it expires, or until
	// the reaper delivers the release when a partitioned node is
	// back.
	for _, n := range mc.nodes {
		if !n.up && n.partitioned.Load() {
			n.queued[c.value] = true
		}
	}
	c.held, c.lost, c.overtaken = false, false, false
	return errName(want)
}

// checkNodes checks that every node's lock key (value, token, TTL) and
// fence counter, up or down, are the model's.
func (mc *propMachine) checkNodes() {
	for k, n := range mc.nodes {
		got, err := n.srv.Get(propLockKey)
		want := ""
		if n.key.value != "" {
			want = keyValue(n.key.value, n.key.token)
		}
		if err != nil {
			got = ""
		}
		if got = unmarked(got); got != want {
			mc.rt.Fatalf("node %d (up %v): lock key %q, model says %q", k, n.up, got, want)
		}
		if want != "" && n.srv.TTL(propLockKey) != n.key.exp-mc.now {
			mc.rt.Fatalf("node %d: lock key TTL %v, model says %v", k, n.srv.TTL(propLockKey), n.key.exp-mc.now)
		}
		if got := serverCounter(mc.rt, n.srv, mc.fenceKey); got != n.counter {
			mc.rt.Fatalf("node %d: fence counter %d, model says %d", k, got, n.counter)
		}
		if n.key.value != "" && n.key.token > n.counter {
			mc.rt.Fatalf("node %d: key token %d above its fence counter %d", k, n.key.token, n.counter)
		}
	}
}

// step counts an action done, by its outcome.
func (mc *propMachine) step(name string) {
	mc.steps.Add(1)
	mc.stats.add(name)
}

// advance moves every node's clock (down or not: a partition, not a
// stopped clock) and the model's by d.
func (mc *propMachine) advance(d time.Duration) {
	mc.now += d
	for _, n := range mc.nodes {
		n.srv.FastForward(d)
		if n.key.value != "" && n.key.exp <= mc.now {
			n.key = modelKey{}
		}
	}
}

// drawNode draws a node that is up (or down), and reports false if
// there is none.
func (mc *propMachine) drawNode(up bool) (int, bool) {
	var ks []int
	for k, n := range mc.nodes {
		if n.up == up {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return 0, false
	}
	what := "down node"
	if up {
		what = "up node"
	}
	return ks[rapid.IntRange(0, len(ks)-1).Draw(mc.rt, what)], true
}

// cleanedUp waits until m's reaper has nothing left to send to the nodes
// that are up: a call that its deadline ended leaves what it did not clean
// up within a moment to the reaper, which delivers it at once to a node
// that answers.
func (mc *propMachine) cleanedUp(m *NetMutex) {
	eventually(mc.rt, 5*time.Second, "the reaper's deliveries to the nodes up", func() bool {
		for k, n := range mc.nodes {
			if n.up && m.resendingTo(k) {
				return false
			}
		}
		return true
	})
}

// serverCounter reads a node's fence counter (0 when absent).
func serverCounter(rt *rapid.T, srv *miniredis.Miniredis, key string) uint64 {
	v, err := srv.Get(key)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		rt.Fatalf("fence counter %q: %v", v, err)
	}
	return n
}

// errName names an expected outcome in TestProperty's statistics.
func errName(err error) string {
	switch err {
	case nil:
		return "ok"
	case ErrLockLost:
		return "lost"
	case ErrQuorum:
		return "quorum"
	}
	return err.Error()
}
