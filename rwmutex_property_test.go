package netlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"

	"github.com/netlock-go/netlock/internal/keyspace"
	"github.com/netlock-go/netlock/internal/redistest"
)

// rwPropMinSteps is how many actions TestRWProperty runs at least for each
// node count in a plain `go test` (rapid's checks are repeated, with fresh
// seeds, until it is reached). $NETLOCK_RWPROP_SOAK (a duration such as 10m)
// repeats them for that long instead, for each node count.
const rwPropMinSteps = 1500

const rwPropSoakEnv = "NETLOCK_RWPROP_SOAK"

// TestRWProperty drives four clients (four processes, each with Backends
// of its own) of one NetRWMutex name on 1, 3 and 5 miniredis nodes through
// random sequences of TryRLockCtx, RLockCtx and LockCtx with short
// deadlines, TryLockCtx, RUnlockCtx, UnlockCtx (of a holder, mostly), a
// second goroutine of a client locking or read-locking in the background
// with a deadline of its own (the process's other calls going on
// meanwhile), clients crashing (dropped without unlocking: nothing they
// send reaches a node any more; a fresh process takes their place), nodes
// crashing, partitioned and coming back with their data (as in
// TestProperty, whose modelNode it reuses), the lock's keys flushed on a
// node behind the clients' back (the fence counter kept), SCRIPT FLUSH, and
// time passing. The model does not predict every answer (the queues' order
// makes that a second implementation): it checks the invariants below
// against the clients' own state and the nodes' keys.
//
// Time. The scripts read the server's TIME for the leases' and the waiters'
// deadlines (scores) and set TTLs on the other keys, so every node runs with
// miniredis's ClockTTL on a clock of its own set with SetTime: moving it
// moves TIME and the TTLs together (FastForward would move only the TTLs).
// Every call to a node moves its clock a microsecond, so that two waiters
// never arrive at the same instant, as on a real server. The clients' local
// clocks (hold deadlines, watchdogs) are the real clock and do not move with
// the nodes'. Time passes in two ways:
//   - "time passes": up to an extend interval (expiry/3) on every node,
//     after which every live hold is extended, as its watchdog would have
//     done meanwhile: holds stay consistent with their local deadlines.
//   - "clock jump": up to three expiries without extends, as if every
//     server's clock ran ahead of the clients'. This breaks the drift
//     assumption: a hold may expire on the servers while its client still
//     believes it holds (Lost or RLost open).
//
// Invariants, after every step and at every acquisition:
//   - Exclusion: a client's hold is protected when its client believes it
//     holds (Lost or RLost not closed) and a quorum of nodes still has it
//     live (the writer key with its value, or its lease with a deadline
//     ahead of the node's TIME). Never a protected writer together with any
//     other protected holder, reader or writer. A new hold never begins
//     while another client's hold (or its own process's hold of the other
//     kind) is protected. A believer whose hold is no longer protected
//     (only possible after a clock jump or keys deleted behind its back)
//     and whom another client then overtook must never hear success again.
//   - Releases: an UnlockCtx, or a last RUnlockCtx, that reports success
//     found its hold live on a quorum just before: a hold expired by the
//     servers' clocks, deleted or taken reports ErrLockLost (or a quorum
//     error).
//   - Fencing: writers' tokens are distinct, and one acquired after
//     another's LockCtx returned is above it.
//   - Local state: Token, Lost and RLost agree with what the client holds;
//     every error matches a documented sentinel; a second RUnlock or Unlock
//     gives ErrNotHeld.
//   - Nothing stranded ("everyone leaves"): when every live client unlocks
//     and time passes beyond every expiry and every waiter's place
//     (placeExpiries expiries), crashed clients' leases, write locks and
//     places included, no key of the lock is left on any node, and a fresh
//     client gets the write lock and then a read lease at once.
//   - No writer starved ("everyone leaves", then, one time in two, a
//     writer waits while readers come): with two
//     processes reading, a writer of a third queues; a fourth process's new
//     readers are kept out at once; the reading processes may let more of
//     their goroutines join their lease until their lease is next extended
//     (the watchdog, every expiry/3), and never after; the writer gets in as
//     soon as the readers under way leave, with no further time passing on
//     the servers and within a few seconds of real time (well under the
//     expiry it would otherwise sleep before its next attempt). That is the
//     bound the package documentation gives: an extend interval plus the
//     read sections under way.
//
// Assumptions broken (keys flushed, clock jumps) are counted in the
// outcomes; they are not failures unless an invariant above breaks.
func TestRWProperty(t *testing.T) {
	soak := time.Duration(0)
	if v := os.Getenv(rwPropSoakEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", rwPropSoakEnv, v)
		}
		soak = d
	}
	total := 0
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			var steps atomic.Int64
			stats := &propStats{m: map[string]int{}}
			start := time.Now()
			// As TestPropertyWaiting: once the budget is spent, the rest of
			// rapid's checks pass at once (unless one failed: rapid is
			// then shrinking it).
			spent := func() bool {
				if soak > 0 {
					return time.Since(start) >= soak
				}
				return steps.Load() >= rwPropMinSteps
			}
			failing := false
			for {
				rapid.Check(t, func(rt *rapid.T) {
					if spent() && !failing {
						return
					}
					rt.Cleanup(func() { failing = failing || rt.Failed() })
					checkRWModel(rt, n, stats, &steps)
				})
				if spent() || rapidReproducing() || t.Failed() {
					break
				}
			}
			total += int(steps.Load())
			redistest.Report(t, "RW N=%d: %d steps explored in %v; outcomes %v", n, steps.Load(), time.Since(start).Round(time.Millisecond), stats)
		})
	}
	redistest.Report(t, "RW: %d steps explored in all", total)
}

// rwPropOp is a lock call running on a goroutine of its own: another
// goroutine of the client's process.
type rwPropOp struct {
	write  bool
	cancel context.CancelFunc
	done   chan error
	start  int64 // the acquisition sequence number when it began
}

// rwPropClient is the model of one client (one process, one NetRWMutex).
type rwPropClient struct {
	id      int // distinct over the whole check
	rw      *NetRWMutex
	dead    atomic.Bool
	pools   []*redis.Pool
	readers int  // read locks it holds (RLock calls not yet undone)
	writer  bool // holds the write lock
	// overtakenW, overtakenR: a client (another, or this process's other
	// kind of holder) acquired while this one believed it held its write
	// lock, its read lease (possible only once the model's assumptions were
	// broken). Its next release of that hold must not report success.
	overtakenW, overtakenR bool
	pend                   *rwPropOp // a lock call in the background, or nil
}

// rwAcq is one write acquisition: the sequence numbers when its call began
// and when it returned, and its token.
type rwAcq struct {
	start, end int64
	token      uint64
	who        int
}

// The model's constants.
const (
	rwPropExpiry  = 8 * time.Second
	rwPropClients = 4
)

// checkRWModel runs one check of TestRWProperty on nNodes nodes: rapid
// draws the actions, and the invariants are checked after each.
func checkRWModel(rt *rapid.T, nNodes int, stats *propStats, steps *atomic.Int64) {
	mc := newRWMachine(rt, nNodes, stats, steps)
	defer mc.close()
	rt.Repeat(mc.actions())
}

// rwMachine is one check of TestRWProperty: the nodes, the clients, and
// what the model knows of them.
type rwMachine struct {
	rt     *rapid.T
	nNodes int
	quorum int
	stats  *propStats
	steps  *atomic.Int64 // the actions run, over every check

	nodes    []*rwPropNode
	all      []*rwPropClient // every client made, crashed ones included
	cs       []*rwPropClient // the live clients, rwPropClients of them
	nextID   int             // the next client's id
	keys     keyspace.RWKeys
	lockKeys []string // the writer key, the writers', the readers', the leases
	client   *rapid.Generator[int]

	seq  atomic.Int64 // orders the acquisitions' calls and returns
	acqs []rwAcq
}

// newRWMachine starts nNodes miniredis nodes, each on a clock of its own,
// and the clients on them.
func newRWMachine(rt *rapid.T, nNodes int, stats *propStats, steps *atomic.Int64) *rwMachine {
	mc := &rwMachine{rt: rt, nNodes: nNodes, quorum: nNodes/2 + 1, stats: stats, steps: steps}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mc.nodes = make([]*rwPropNode, nNodes)
	for k := range mc.nodes {
		n := &rwPropNode{modelNode: &modelNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}, now: base}
		n.srv.SetTime(base)
		n.srv.ClockTTL(true)
		if err := n.srv.Start(); err != nil {
			rt.Fatal(err)
		}
		n.addr, n.up = n.srv.Addr(), true
		mc.nodes[k] = n
	}
	mc.cs = make([]*rwPropClient, rwPropClients)
	for i := range mc.cs {
		mc.cs[i] = mc.newClient()
	}
	mc.keys = mc.cs[0].rw.keys
	mc.lockKeys = []string{mc.keys.Writer, mc.keys.Writers, mc.keys.Readers, mc.keys.Leases}
	mc.client = rapid.IntRange(0, rwPropClients-1)
	return mc
}

// close ends every call and hold, and stops the clients and the nodes.
func (mc *rwMachine) close() {
	ctx := context.Background()
	for _, c := range mc.all {
		if c.pend != nil {
			c.pend.cancel()
			<-c.pend.done
		}
		for c.rw.RUnlockCtx(ctx) == nil {
		}
		c.rw.UnlockCtx(ctx)
	}
	for _, c := range mc.all {
		for _, p := range c.pools {
			p.Close()
		}
	}
	eventually(mc.rt, 10*time.Second, "every reaper done", func() bool {
		for _, c := range mc.all {
			for _, m := range []*engine{c.rw.w, c.rw.r} {
				m.reaper.mu.Lock()
				running := m.reaper.running
				m.reaper.mu.Unlock()
				if running {
					return false
				}
			}
		}
		return true
	})
	for _, n := range mc.nodes {
		n.srv.Close()
	}
}

// actions are TestRWProperty's actions, by name, and its invariants ("").
func (mc *rwMachine) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"TryRLockCtx":                     mc.tryRLockCtx,
		"RLockCtx short deadline":         mc.rLockCtxShortDeadline,
		"TryLockCtx":                      mc.tryLockCtx,
		"LockCtx short deadline":          mc.lockCtxShortDeadline,
		"background LockCtx or RLockCtx":  mc.lockInBackground,
		"wait for the background call":    mc.waitBackground,
		"RUnlockCtx":                      mc.rUnlockCtx,
		"UnlockCtx":                       mc.unlockCtx,
		"crash client":                    mc.crashClient,
		"node down":                       mc.nodeDown,
		"node up":                         mc.bringNodeUp,
		"flush the lock's keys on a node": mc.flushKeys,
		"SCRIPT FLUSH":                    mc.scriptFlush,
		"time passes":                     mc.timePasses,
		"clock jump":                      mc.clockJump,
		"everyone leaves":                 mc.everyoneLeaves,
		"":                                mc.check,
	}
}

// tryRLockCtx: a client's TryRLockCtx.
func (mc *rwMachine) tryRLockCtx(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	ok, err := c.rw.TryRLockCtx(ctx)
	mc.checkErr(fmt.Sprintf("client %d TryRLockCtx", i), err, ErrQuorum)
	if ok && err != nil {
		rt.Fatalf("client %d TryRLockCtx: got true with %v", i, err)
	}
	if ok && c.writer {
		// (A writer of its own in the background may have given
		// up meanwhile: not checked.)
		rt.Fatalf("client %d TryRLockCtx: got true while it holds the write lock", i)
	}
	if ok {
		mc.read(i)
		mc.step("tryrlock/ok")
		return
	}
	mc.step("tryrlock/" + map[bool]string{true: "err", false: "busy"}[err != nil])
}

// rLockCtxShortDeadline: a client's RLockCtx, with a short deadline (see
// shortDeadline).
func (mc *rwMachine) rLockCtxShortDeadline(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	dctx, cancel := context.WithTimeout(ctx, shortDeadline(rt))
	defer cancel()
	err := c.rw.RLockCtx(dctx)
	mc.checkErr(fmt.Sprintf("client %d RLockCtx", i), err, ErrNotObtained, ErrQuorum)
	if err == nil {
		// Its own write lock does not keep it out locally: only
		// if that lock was lost on the servers (acquired checks).
		mc.read(i)
		mc.step("rlock/ok")
		return
	}
	mc.step("rlock/failed")
}

// tryLockCtx: a client's TryLockCtx.
func (mc *rwMachine) tryLockCtx(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	start := mc.seq.Add(1)
	ok, err := c.rw.TryLockCtx(ctx)
	mc.checkErr(fmt.Sprintf("client %d TryLockCtx", i), err, ErrQuorum)
	if ok && err != nil {
		rt.Fatalf("client %d TryLockCtx: got true with %v", i, err)
	}
	if ok && (c.writer || c.readers > 0) {
		rt.Fatalf("client %d TryLockCtx: got true while it holds (writer %v, %d readers)", i, c.writer, c.readers)
	}
	if ok {
		mc.wrote(i, start)
		mc.step("trylock/ok")
		return
	}
	mc.step("trylock/" + map[bool]string{true: "err", false: "busy"}[err != nil])
}

// lockCtxShortDeadline: a client's LockCtx, with a short deadline (see
// shortDeadline).
func (mc *rwMachine) lockCtxShortDeadline(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	if c.readers > 0 {
		// Would wait for its own readers: a deadlock in
		// sync.RWMutex too. Tried with a short deadline anyway.
		mc.stats.add("lock/own readers")
	}
	dctx, cancel := context.WithTimeout(ctx, shortDeadline(rt))
	defer cancel()
	start := mc.seq.Add(1)
	err := c.rw.LockCtx(dctx)
	mc.checkErr(fmt.Sprintf("client %d LockCtx", i), err, ErrNotObtained, ErrQuorum)
	if err == nil {
		if c.writer {
			rt.Fatalf("client %d LockCtx: got in while it holds the write lock", i)
		}
		// Its own readers do not keep it out locally: only if
		// their lease was lost on the servers (acquired checks).
		mc.wrote(i, start)
		mc.step("lock/ok")
		return
	}
	mc.step("lock/failed")
}

// lockInBackground: another goroutine of a client's process locks (LockCtx
// or RLockCtx), with a deadline of its own; the model goes on meanwhile.
func (mc *rwMachine) lockInBackground(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	if c.pend != nil {
		mc.step("background/busy")
		return
	}
	write := rapid.Bool().Draw(rt, "write")
	wait := time.Duration(rapid.IntRange(20, 300).Draw(rt, "deadline ms")) * time.Millisecond
	bctx, cancel := context.WithTimeout(ctx, wait)
	op := &rwPropOp{write: write, cancel: cancel, done: make(chan error, 1), start: mc.seq.Add(1)}
	rw := c.rw
	go func() {
		var err error
		if write {
			err = rw.LockCtx(bctx)
		} else {
			err = rw.RLockCtx(bctx)
		}
		op.done <- err
	}()
	c.pend = op
	mc.step(fmt.Sprintf("background/start write=%v", write))
}

// waitBackground waits for a client's background call, and takes its
// result.
func (mc *rwMachine) waitBackground(rt *rapid.T) {
	i := mc.client.Draw(rt, "client")
	mc.poll(i, true)
	mc.step("background/wait")
}

// rUnlockCtx: a client's RUnlockCtx, most often of one that reads.
func (mc *rwMachine) rUnlockCtx(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.holder(func(c *rwPropClient) bool { return c.readers > 0 })
	c := mc.cs[i]
	if c.readers == 0 {
		if c.pend != nil && !c.pend.write {
			mc.step("runlock/pending") // might have got in meanwhile
			return
		}
		mc.checkErr(fmt.Sprintf("client %d RUnlockCtx without a read lock", i), c.rw.RUnlockCtx(ctx), ErrNotHeld)
		if c.rw.RUnlockCtx(ctx) == nil {
			rt.Fatalf("client %d RUnlockCtx without a read lock: got nil", i)
		}
		mc.step("runlock/notheld")
		return
	}
	c.readers--
	live := mc.holdLive(c, false)
	handOff := c.pend != nil
	if handOff {
		// The lease may be handed over to the reader in the
		// background, or the write lock the readers share to the
		// call in the background: no release then, and nothing to
		// check.
		live = mc.nNodes
	}
	err := c.rw.RUnlockCtx(ctx)
	_, left := c.rw.readHold()
	last := left == 0
	if !last && err != nil && c.pend != nil && !c.pend.write && c.readers == 0 {
		// Only the last reader's RUnlockCtx releases, and so
		// fails: it was the last, and the reader in the
		// background (kept out by the lease, or waiting for it
		// to end) has taken a new lease since.
		last = true
	}
	if last != (c.readers == 0) && (c.pend == nil || c.pend.write) {
		rt.Fatalf("client %d RUnlockCtx: %d readers left in the process, model says %d", i, left, c.readers)
	}
	if last {
		mc.released(i, false, live, err, handOff)
		mc.step("runlock/last/" + rwErrName(err))
		return
	}
	if err != nil {
		rt.Fatalf("client %d RUnlockCtx, other readers left: %v", i, err)
	}
	mc.step("runlock/other readers")
}

// unlockCtx: a client's UnlockCtx, most often of one that writes.
func (mc *rwMachine) unlockCtx(rt *rapid.T) {
	ctx := context.Background()
	mc.pollAll()
	i := mc.holder(func(c *rwPropClient) bool { return c.writer })
	c := mc.cs[i]
	if !c.writer {
		if c.pend != nil && c.pend.write {
			mc.step("unlock/pending")
			return
		}
		if err := c.rw.UnlockCtx(ctx); !errors.Is(err, ErrNotHeld) {
			rt.Fatalf("client %d UnlockCtx without the write lock: got %v, want ErrNotHeld", i, err)
		}
		mc.step("unlock/notheld")
		return
	}
	c.writer = false
	live := mc.holdLive(c, true)
	handOff := c.pend != nil
	if handOff {
		// The write lock may be handed over to the call in the
		// background (a writer, or a reader that shares it): no
		// release then, and nothing to check.
		live = mc.nNodes
	}
	err := c.rw.UnlockCtx(ctx)
	mc.released(i, true, live, err, handOff)
	mc.step("unlock/" + rwErrName(err))
}

// crashClient: a client's process dies: nothing it sends reaches a node
// any more, its holds and its waiters' places stay until they expire. A
// fresh process takes its place.
func (mc *rwMachine) crashClient(rt *rapid.T) {
	mc.pollAll()
	i := mc.client.Draw(rt, "client")
	c := mc.cs[i]
	c.dead.Store(true)
	if c.pend != nil {
		c.pend.cancel()
		mc.waitOp(c.pend) // its error does not matter: it died
	}
	mc.step(fmt.Sprintf("crash/writer=%v/readers=%v", c.writer, c.readers > 0))
	mc.cs[i] = mc.newClient()
}

// nodeDown crashes or partitions a node that is up (see modelNode).
func (mc *rwMachine) nodeDown(rt *rapid.T) {
	mc.pollAll()
	n, ok := mc.drawNode(true)
	if !ok {
		mc.step("node down/none")
		return
	}
	if rapid.Bool().Draw(rt, "partition") {
		n.partitioned.Store(true)
		n.srv.Close()
		mc.step("node down/partition")
	} else {
		n.srv.Close()
		n.gen.Add(1)
		mc.step("node down/crash")
	}
	n.up = false
}

// bringNodeUp brings a node that is down back, with its data.
func (mc *rwMachine) bringNodeUp(rt *rapid.T) {
	mc.pollAll()
	n, ok := mc.drawNode(false)
	if !ok {
		mc.step("node up/none")
		return
	}
	mc.nodeUp(n)
	mc.step("node up")
}

// flushKeys deletes the lock's keys on a node that is up, behind the
// clients' back (the fence counter is kept, as in TestProperty: it never
// expires).
func (mc *rwMachine) flushKeys(rt *rapid.T) {
	mc.pollAll()
	n, ok := mc.drawNode(true)
	if !ok {
		mc.step("flush/none")
		return
	}
	for _, k := range mc.lockKeys {
		n.srv.Del(k)
	}
	mc.step("flush")
}

// scriptFlush flushes the scripts of a node that is up.
func (mc *rwMachine) scriptFlush(rt *rapid.T) {
	mc.pollAll()
	n, ok := mc.drawNode(true)
	if !ok {
		mc.step("SCRIPT FLUSH/none")
		return
	}
	conn, err := redis.Dial("tcp", n.addr)
	if err != nil {
		rt.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Do("SCRIPT", "FLUSH"); err != nil {
		rt.Fatal(err)
	}
	mc.step("SCRIPT FLUSH")
}

// timePasses moves the nodes' clocks by up to an extend interval, and
// extends every hold, as the watchdogs do.
func (mc *rwMachine) timePasses(rt *rapid.T) {
	mc.pollAll()
	mc.advance(time.Duration(rapid.IntRange(0, int(rwPropExpiry/extendsPerExpiry/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond)
	mc.extendAll()
	mc.step("time passes")
}

// clockJump moves the nodes' clocks by up to three expiries, with no
// extend.
func (mc *rwMachine) clockJump(rt *rapid.T) {
	mc.pollAll()
	mc.advance(time.Duration(rapid.IntRange(0, int(3*rwPropExpiry/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond)
	mc.step("clock jump")
}

// everyoneLeaves: every call and hold ends (see leaveAll); then a fresh
// client (fresh), or a writer waiting while readers come
// (writerVsReaders).
func (mc *rwMachine) everyoneLeaves(rt *rapid.T) {
	mc.pollAll()
	mc.leaveAll()
	if rapid.Bool().Draw(rt, "writer waits while readers come") {
		mc.writerVsReaders()
		mc.step("everyone leaves/writer waits while readers come")
		return
	}
	mc.fresh()
	mc.step("everyone leaves/fresh client")
}

// check checks the invariants: each client's holds, Token, Lost and
// RLost as the model says, and at most one writer, or readers alone, hold
// protected holds.
func (mc *rwMachine) check(rt *rapid.T) {
	mc.pollAll()
	writers, readers := 0, 0
	for i, c := range mc.cs {
		w, r, _ := mc.protected(c)
		if w {
			writers++
		}
		if r {
			readers++
		}
		if c.pend != nil {
			continue // its state may change under our eyes
		}
		_, believesW := mc.writeHold(c)
		hw := c.rw.writeHold()
		if (hw != nil) != c.writer {
			rt.Fatalf("client %d: write hold %v, model says writer %v", i, hw != nil, c.writer)
		}
		if tok := c.rw.Token(); (tok != 0) != c.writer {
			rt.Fatalf("client %d: Token() %d, model says writer %v", i, tok, c.writer)
		}
		lost := false
		select {
		case <-c.rw.Lost():
			lost = true
		default:
		}
		if lost == believesW {
			rt.Fatalf("client %d: Lost() closed %v, write hold believed %v", i, lost, believesW)
		}
		lease, n := c.rw.readHold()
		if n != c.readers || (lease != nil) != (c.readers > 0) {
			rt.Fatalf("client %d: %d readers, lease %v; model says %d readers", i, n, lease != nil, c.readers)
		}
		_, believesR := mc.leaseHold(c)
		rlost := false
		select {
		case <-c.rw.RLost():
			rlost = true
		default:
		}
		if rlost == believesR {
			rt.Fatalf("client %d: RLost() closed %v, read lease believed %v", i, rlost, believesR)
		}
	}
	if writers > 1 || writers == 1 && readers > 0 {
		rt.Fatalf("%d writers and %d reading processes hold protected holds at once", writers, readers)
	}
}

// newClient starts a client (a process), on pools of its own.
func (mc *rwMachine) newClient() *rwPropClient {
	c := &rwPropClient{id: mc.nextID}
	mc.nextID++
	backends := make([]Backend, mc.nNodes)
	for k, n := range mc.nodes {
		p := n.newPool()
		c.pools = append(c.pools, p)
		backends[k] = &rwPropBackend{wrapper: wrapper{Backend: NewRedigo(p)}, node: n, dead: &c.dead}
	}
	rw, err := NewRW("rwprop", backends, WithExpiry(rwPropExpiry),
		// A node timeout well above any stall of a loaded machine, as
		// TestProperty's: calls to a node that is down fail at once.
		WithNodeTimeout(2*time.Second), WithRetryDelay(time.Millisecond, 2*time.Millisecond),
		WithOutageWindow(0))
	if err != nil {
		mc.rt.Fatal(err)
	}
	c.rw = rw
	mc.all = append(mc.all, c)
	return c
}

// waitOp waits for a background call to return and returns its error.
func (mc *rwMachine) waitOp(op *rwPropOp) error {
	select {
	case err := <-op.done:
		op.done <- err // for a later wait
		return err
	case <-time.After(20 * time.Second):
		mc.rt.Fatalf("a background lock call did not return within 20s")
	}
	return nil
}

// holder draws, three times in four, a client for which holds is true
// (if any), else any client.
func (mc *rwMachine) holder(holds func(c *rwPropClient) bool) int {
	var is []int
	for i, c := range mc.cs {
		if holds(c) {
			is = append(is, i)
		}
	}
	if len(is) == 0 || rapid.IntRange(0, 3).Draw(mc.rt, "any client") == 0 {
		return mc.client.Draw(mc.rt, "client")
	}
	return is[rapid.IntRange(0, len(is)-1).Draw(mc.rt, "holder")]
}

// step counts an action done, by its outcome.
func (mc *rwMachine) step(name string) {
	mc.steps.Add(1)
	mc.stats.add(name)
}

// checkErr fails the check unless err is nil, or matches a documented
// sentinel and one of allowed.
func (mc *rwMachine) checkErr(what string, err error, allowed ...error) {
	if err == nil {
		return
	}
	if !documented(err) {
		mc.rt.Fatalf("%s: error %v matches no documented sentinel", what, err)
	}
	for _, a := range allowed {
		if errors.Is(err, a) {
			return
		}
	}
	mc.rt.Fatalf("%s: got %v, want one of %v", what, err, allowed)
}

// writeHold returns c's write hold, and whether c thinks it holds it
// (Lost not closed).
func (mc *rwMachine) writeHold(c *rwPropClient) (*hold, bool) {
	h := c.rw.writeHold()
	if h == nil {
		return nil, false
	}
	select {
	case <-h.lostChan():
		return h, false
	default:
		return h, true
	}
}

// leaseHold returns c's read lease, and whether c thinks it holds it
// (RLost not closed).
func (mc *rwMachine) leaseHold(c *rwPropClient) (*hold, bool) {
	h, _ := c.rw.readHold()
	if h == nil {
		return nil, false
	}
	select {
	case <-h.lostChan():
		return h, false
	default:
		return h, true
	}
}

// writeIntact counts the nodes, up or down, whose writer key holds the
// write lock h.
func (mc *rwMachine) writeIntact(h *hold) int {
	n := 0
	want := keyValue(h.value, h.token)
	for _, nd := range mc.nodes {
		if v, err := nd.srv.Get(mc.keys.Writer); err == nil && v == want {
			n++
		}
	}
	return n
}

// leaseLive counts the nodes, up or down, whose leases hold the read lease
// h with a deadline ahead of the node's clock; for readers under their
// process's write lock, whose writer key holds it (writeIntact).
func (mc *rwMachine) leaseLive(h *hold) int {
	if h.token > 0 {
		return mc.writeIntact(h)
	}
	n := 0
	for _, nd := range mc.nodes {
		if s, err := nd.srv.ZScore(mc.keys.Leases, h.value); err == nil && int64(s) > nd.nowMS() {
			n++
		}
	}
	return n
}

// protected reports whether c holds for writing (w) and for reading (r)
// with its hold believed and live on a quorum; believing, whether it
// thinks it holds either.
func (mc *rwMachine) protected(c *rwPropClient) (w, r, believing bool) {
	if h, ok := mc.writeHold(c); ok {
		believing = true
		w = mc.writeIntact(h) >= mc.quorum
	}
	if h, ok := mc.leaseHold(c); ok {
		believing = true
		r = mc.leaseLive(h) >= mc.quorum
	}
	return w, r, believing
}

// acquired checks a new hold of client i (write or read) against every
// live client's, its own process's included: none may be protected in
// a conflicting mode; a believer that is not is overtaken (only
// possible once the model's assumptions were broken).
func (mc *rwMachine) acquired(i int, write bool, what string) {
	if w, r, _ := mc.protected(mc.cs[i]); !(write && w || !write && r) {
		// A reader that joined its process's lease after the lease
		// was lost on the servers, or a hold lost on the servers
		// (clock jump) before its background call was polled.
		mc.stats.add("acquired, not protected (assumptions broken)")
		return
	}
	for j, o := range mc.cs {
		w, r, _ := mc.protected(o)
		if j == i {
			// Its own hold of the other kind.
			w, r = w && !write, r && write
		}
		if w || (write && r) {
			mc.rt.Fatalf("client %d acquired %s while client %d holds a protected hold (write %v read %v)", i, what, j, w, r)
		}
		if _, ok := mc.writeHold(o); ok && (j != i || !write) && !o.overtakenW {
			o.overtakenW = true
			mc.stats.add("overtaken writer (assumptions broken)")
		}
		if _, ok := mc.leaseHold(o); ok && write && !o.overtakenR {
			o.overtakenR = true
			mc.stats.add("overtaken readers (assumptions broken)")
		}
	}
}

// wrote records a write acquisition of client i, whose call began at
// start, and checks its token.
func (mc *rwMachine) wrote(i int, start int64) {
	c := mc.cs[i]
	end := mc.seq.Add(1)
	tok := c.rw.Token()
	if tok == 0 {
		mc.rt.Fatalf("client %d acquired the write lock with no token", i)
	}
	// A write lock handed to another writer of the process keeps its
	// token: the same hold, checked when it was acquired (it may have been
	// lost on the servers since, behind the model's back, as a NetMutex's
	// handed over may).
	handedOver := slices.ContainsFunc(mc.acqs, func(a rwAcq) bool { return a.token == tok && a.who == c.id })
	for _, a := range mc.acqs {
		if a.token == tok && a.who != c.id {
			mc.rt.Fatalf("client %d acquired with token %d, already given to client %d", i, tok, a.who)
		}
		if !handedOver && a.end < start && a.token > tok {
			mc.rt.Fatalf("client %d acquired with token %d after client %d's acquisition with token %d had returned", i, tok, a.who, a.token)
		}
	}
	mc.acqs = append(mc.acqs, rwAcq{start: start, end: end, token: tok, who: c.id})
	c.writer = true
	mc.acquired(i, true, "the write lock")
}

// read records a read lock of client i.
func (mc *rwMachine) read(i int) {
	mc.cs[i].readers++
	mc.acquired(i, false, "a read lock")
}

// poll takes the result of client i's background call if it returned
// (wait: waits for it).
func (mc *rwMachine) poll(i int, wait bool) {
	c := mc.cs[i]
	op := c.pend
	if op == nil {
		return
	}
	var err error
	if wait {
		err = mc.waitOp(op)
	} else {
		select {
		case err = <-op.done:
		default:
			return
		}
	}
	c.pend = nil
	kind := "rlock"
	if op.write {
		kind = "lock"
	}
	if err != nil {
		mc.checkErr(fmt.Sprintf("client %d background %s", i, kind), err, ErrNotObtained, ErrQuorum)
		mc.stats.add("background " + kind + "/failed")
		return
	}
	mc.stats.add("background " + kind + "/ok")
	if op.write {
		mc.wrote(i, op.start)
	} else {
		mc.read(i)
	}
}

// pollAll takes the results of the background calls that returned.
func (mc *rwMachine) pollAll() {
	for i := range mc.cs {
		mc.poll(i, false)
	}
}

// cancelOp cancels client i's background call, if any, and takes its
// result.
func (mc *rwMachine) cancelOp(i int) {
	if op := mc.cs[i].pend; op != nil {
		op.cancel()
		mc.poll(i, true)
	}
}

// released checks the answer of a release that reached Redis (an
// UnlockCtx, the last RUnlockCtx) of a client whose hold may have been
// overtaken.
//
// live is how many nodes held the hold, live, just before the call (see
// holdLive): a release that reports success found it on a quorum.
//
// handOff: the hold may have been handed to a call in the background of
// the same process instead: then success says nothing of the hold in
// Redis.
func (mc *rwMachine) released(i int, write bool, live int, err error, handOff bool) {
	c := mc.cs[i]
	what, overtaken := "RUnlockCtx", &c.overtakenR
	if write {
		what, overtaken = "UnlockCtx", &c.overtakenW
	}
	mc.checkErr(fmt.Sprintf("client %d %s", i, what), err, ErrLockLost, ErrQuorum)
	if err == nil && live < mc.quorum {
		mc.rt.Fatalf("client %d %s: got success, but only %d nodes held it live (quorum %d): the hold had expired or gone", i, what, live, mc.quorum)
	}
	if err != nil && live < mc.quorum {
		mc.stats.add(what + ": loss of a hold expired or gone on the servers reported")
	}
	if *overtaken {
		if err == nil && handOff {
			mc.stats.add("overtaken: " + what + " handed the hold over")
			*overtaken = false
			return
		}
		if err == nil {
			mc.rt.Fatalf("client %d %s after another holder acquired over its hold: got success, want the loss reported", i, what)
		}
		mc.stats.add("overtaken: " + what + " reported " + rwErrName(err))
		*overtaken = false
	}
}

// holdLive counts the nodes, up or down, that hold client c's write lock
// (write) or read lease live.
func (mc *rwMachine) holdLive(c *rwPropClient, write bool) int {
	if write {
		if h := c.rw.writeHold(); h != nil {
			return mc.writeIntact(h)
		}
		return 0
	}
	if h, _ := mc.leaseHold(c); h != nil {
		return mc.leaseLive(h)
	}
	return 0
}

// advance moves every node's clock by d.
func (mc *rwMachine) advance(d time.Duration) {
	for _, n := range mc.nodes {
		n.advance(d)
	}
}

// extendAll extends every live client's holds, as their watchdogs do.
func (mc *rwMachine) extendAll() {
	ctx := context.Background()
	for i, c := range mc.cs {
		if h := c.rw.w.current(); h != nil {
			err := c.rw.w.extendCtx(ctx)
			mc.checkErr(fmt.Sprintf("client %d extend of the write lock", i), err, ErrLockLost, ErrQuorum, ErrNotHeld)
		}
		if h, _ := mc.leaseHold(c); h != nil {
			err := c.rw.r.extendCtx(ctx)
			mc.checkErr(fmt.Sprintf("client %d extend of the read lease", i), err, ErrLockLost, ErrQuorum, ErrNotHeld)
		}
	}
}

// drawNode draws a node that is up (or down), and reports false if there
// is none.
func (mc *rwMachine) drawNode(up bool) (*rwPropNode, bool) {
	var ks []*rwPropNode
	for _, n := range mc.nodes {
		if n.up == up {
			ks = append(ks, n)
		}
	}
	if len(ks) == 0 {
		return nil, false
	}
	return ks[rapid.IntRange(0, len(ks)-1).Draw(mc.rt, fmt.Sprintf("node up=%v", up))], true
}

// nodeUp brings node n back, with its data.
func (mc *rwMachine) nodeUp(n *rwPropNode) {
	n.gen.Add(1)
	if err := n.srv.Restart(); err != nil {
		mc.rt.Fatalf("restart node: %v", err)
	}
	n.partitioned.Store(false)
	n.up = true
}

// leaveAll: every live client's background call is cancelled and every
// hold released; every node comes back; time passes beyond every expiry
// and waiter's place. Nothing of the lock is then left on any node.
func (mc *rwMachine) leaveAll() {
	ctx := context.Background()
	for i, c := range mc.cs {
		mc.cancelOp(i)
		for c.readers > 0 {
			c.readers--
			live := mc.holdLive(c, false)
			err := c.rw.RUnlockCtx(ctx)
			if c.readers == 0 {
				mc.released(i, false, live, err, false)
			} else if err != nil {
				mc.rt.Fatalf("client %d RUnlockCtx, %d readers left: %v", i, c.readers, err)
			}
		}
		if c.writer {
			c.writer = false
			live := mc.holdLive(c, true)
			mc.released(i, true, live, c.rw.UnlockCtx(ctx), false)
		}
	}
	for _, n := range mc.nodes {
		if !n.up {
			mc.nodeUp(n)
		}
	}
	mc.advance(placeExpiries*rwPropExpiry + rwPropExpiry + time.Millisecond)
	for k, n := range mc.nodes {
		for _, key := range mc.lockKeys {
			if n.srv.Exists(key) {
				mc.rt.Fatalf("node %d: %s left behind %v after everyone left", k, key, placeExpiries*rwPropExpiry+rwPropExpiry)
			}
		}
	}
}

// fresh runs a new process's TryLockCtx, UnlockCtx, TryRLockCtx and
// RUnlockCtx on a free lock: each must succeed at once.
func (mc *rwMachine) fresh() {
	ctx := context.Background()
	f := mc.newClient()
	start := mc.seq.Add(1)
	ok, err := f.rw.TryLockCtx(ctx)
	if !ok || err != nil {
		mc.rt.Fatalf("a fresh client's TryLockCtx on a free lock: got %v, %v; want true (stranded?)", ok, err)
	}
	tok := f.rw.Token()
	for _, a := range mc.acqs {
		if a.token >= tok {
			mc.rt.Fatalf("a fresh client acquired with token %d, not above %d of an earlier acquisition", tok, a.token)
		}
	}
	mc.acqs = append(mc.acqs, rwAcq{start: start, end: mc.seq.Add(1), token: tok, who: f.id})
	if err := f.rw.UnlockCtx(ctx); err != nil {
		mc.rt.Fatalf("a fresh client's UnlockCtx: %v", err)
	}
	if ok, err := f.rw.TryRLockCtx(ctx); !ok || err != nil {
		mc.rt.Fatalf("a fresh client's TryRLockCtx on a free lock: got %v, %v; want true", ok, err)
	}
	if err := f.rw.RUnlockCtx(ctx); err != nil {
		mc.rt.Fatalf("a fresh client's RUnlockCtx: %v", err)
	}
}

// writerVsReaders, on a lock left by everyone: two processes read, a
// writer of a third waits, a fourth process's readers are kept out at
// once, the reading processes' at their lease's next extend; the
// writer gets in as soon as the readers under way leave.
func (mc *rwMachine) writerVsReaders() {
	ctx := context.Background()
	perm := rapid.Permutation([]int{0, 1, 2, 3}).Draw(mc.rt, "roles")
	a, b, w, n := perm[0], perm[1], perm[2], perm[3]
	for _, i := range []int{a, b} {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := mc.cs[i].rw.RLockCtx(rctx)
		cancel()
		if err != nil {
			mc.rt.Fatalf("client %d RLockCtx on a lock only read: %v", i, err)
		}
		mc.read(i)
	}
	wc := mc.cs[w]
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	op := &rwPropOp{write: true, cancel: cancel, done: make(chan error, 1), start: mc.seq.Add(1)}
	go func() { op.done <- wc.rw.LockCtx(wctx) }()
	wc.pend = op
	eventually(mc.rt, 5*time.Second, "the writer queued on a quorum", func() bool {
		q := 0
		for _, nd := range mc.nodes {
			if m, _ := nd.srv.ZMembers(mc.keys.Writers); len(m) > 0 {
				q++
			}
		}
		return q >= mc.quorum
	})
	stillWaits := func(when string) {
		select {
		case err := <-op.done:
			op.done <- err // for close, which waits for it
			mc.rt.Fatalf("the writer's LockCtx returned %v %s", err, when)
		default:
		}
	}
	// Until their lease is next extended, the reading processes
	// may let more of their goroutines in (the documented delay);
	// a new process may not.
	for _, i := range []int{a, b} {
		for range rapid.IntRange(0, 2).Draw(mc.rt, "joins") {
			ok, err := mc.cs[i].rw.TryRLockCtx(ctx)
			if !ok {
				// Only if its watchdog's extend (real time) told
				// it already.
				if h, _ := mc.leaseHold(mc.cs[i]); err != nil || h == nil || !h.writerWaits.Load() {
					mc.rt.Fatalf("client %d TryRLockCtx, joining its lease before it learns a writer waits: got %v, %v; want true", i, ok, err)
				}
				mc.stats.add("join refused: the watchdog told first")
				continue
			}
			mc.read(i)
		}
	}
	if ok, err := mc.cs[n].rw.TryRLockCtx(ctx); ok || err != nil {
		mc.rt.Fatalf("client %d TryRLockCtx of a new process while a writer waits: got %v, %v; want false", n, ok, err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Millisecond)
	// ErrNotObtained; or ErrQuorum if the 10 ms passed before Redis
	// answered (a loaded machine).
	if err := mc.cs[n].rw.RLockCtx(rctx); !errors.Is(err, ErrNotObtained) && !errors.Is(err, ErrQuorum) {
		mc.rt.Fatalf("client %d RLockCtx of a new process while a writer waits: got %v, want ErrNotObtained or ErrQuorum", n, err)
	}
	rcancel()
	stillWaits("while readers hold")
	// An extend interval: every lease is extended, and learns
	// that a writer waits. No reader joins after that.
	mc.advance(rwPropExpiry / extendsPerExpiry)
	told := map[int]bool{n: true}
	for _, i := range []int{a, b} {
		// As the watchdog does: an extend that fails (a node
		// slower than the node timeout on a loaded machine) is
		// tried again.
		var err error
		for range 5 {
			if err = mc.cs[i].rw.r.extendCtx(ctx); err == nil {
				break
			}
		}
		mc.checkErr(fmt.Sprintf("client %d extend of the read lease", i), err, ErrQuorum)
		if err != nil {
			mc.stats.add("scenario: extend failed")
			continue
		}
		h, _ := mc.leaseHold(mc.cs[i])
		if !h.writerWaits.Load() {
			mc.rt.Fatalf("client %d: its lease's extend did not learn that a writer waits", i)
		}
		told[i] = true
	}
	for _, i := range []int{a, b, n} {
		if !told[i] {
			continue
		}
		if ok, err := mc.cs[i].rw.TryRLockCtx(ctx); ok || err != nil {
			mc.rt.Fatalf("client %d TryRLockCtx after its lease's extend said a writer waits: got %v, %v; want false", i, ok, err)
		}
	}
	stillWaits("while readers hold")
	// The readers under way leave, in a drawn order; the writer
	// gets in after the last, without the servers' clocks moving.
	order := []int{a, b}
	if rapid.Bool().Draw(mc.rt, "b first") {
		order = []int{b, a}
	}
	for k, i := range order {
		c := mc.cs[i]
		for c.readers > 0 {
			c.readers--
			live := mc.holdLive(c, false)
			err := c.rw.RUnlockCtx(ctx)
			if c.readers == 0 {
				mc.released(i, false, live, err, false)
				if err != nil {
					mc.rt.Fatalf("client %d RUnlockCtx: %v", i, err)
				}
			}
		}
		if k == 0 {
			// A moment in which the writer must not get in: that it
			// does not is a check over a period, not an ordering.
			time.Sleep(time.Millisecond)
			stillWaits("while one reading process still holds")
		}
	}
	start := time.Now()
	select {
	case err := <-op.done:
		op.done <- err
	case <-time.After(4 * time.Second):
		mc.rt.Fatalf("the writer did not get in within 4s of the last reader leaving")
	}
	mc.poll(w, true)
	if !wc.writer {
		mc.rt.Fatalf("the writer's LockCtx failed")
	}
	mc.stats.add(fmt.Sprintf("writer in after the readers left, in %v", time.Since(start).Round(100*time.Millisecond)))
	wc.writer = false
	live := mc.holdLive(wc, true)
	mc.released(w, true, live, wc.rw.UnlockCtx(ctx), false)
}

// rwErrName names the outcome of a release in TestRWProperty's statistics.
func rwErrName(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrLockLost):
		return "lost"
	case errors.Is(err, ErrQuorum):
		return "quorum"
	}
	return "other"
}

// shortDeadline draws the deadline of a call of TestRWProperty that may
// wait: short, so that the model is never blocked for long, and sometimes
// long enough for an acquire round or two.
func shortDeadline(rt *rapid.T) time.Duration {
	return time.Duration(rapid.IntRange(1, 25).Draw(rt, "deadline ms")) * time.Millisecond
}
