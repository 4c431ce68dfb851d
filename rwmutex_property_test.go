package netlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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

// rwPropNode is a node of TestRWProperty: a modelNode (for its server,
// crashes, partitions and pools) with a clock of its own.
type rwPropNode struct {
	*modelNode
	mu  sync.Mutex
	now time.Time // the server's clock (SetTime, with ClockTTL)
}

// tick moves the node's clock a microsecond: called before every call to
// the node.
func (n *rwPropNode) tick() {
	n.mu.Lock()
	n.now = n.now.Add(time.Microsecond)
	n.srv.SetTime(n.now)
	n.mu.Unlock()
}

func (n *rwPropNode) advance(d time.Duration) {
	n.mu.Lock()
	n.now = n.now.Add(d)
	n.srv.SetTime(n.now)
	n.mu.Unlock()
}

// nowMS is the node's TIME in milliseconds, as the scripts compute it.
func (n *rwPropNode) nowMS() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.now.UnixMicro() / 1000
}

// errCrashed is what every call of a crashed client gets: a final error, so
// that nothing is left to its reaper.
var errCrashed = errors.New("rwprop: client crashed")

// rwPropBackend is a client's Backend to one node of TestRWProperty: it
// moves the node's clock before each call, fails every call once its client
// crashed, and forwards Hub and Final to the redigo Backend it wraps, so
// that waiters wait by message.
type rwPropBackend struct {
	inner Backend
	node  *rwPropNode
	dead  *atomic.Bool
}

func (b *rwPropBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	if b.dead.Load() {
		return nil, errCrashed
	}
	b.node.tick()
	return b.inner.Eval(ctx, s, keys, args)
}

func (b *rwPropBackend) Hub() *Hub { return b.inner.(Subscriber).Hub() }

func (b *rwPropBackend) Final(err error) bool {
	return errors.Is(err, errCrashed) || finalErr(b.inner, err)
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
	hold       *hold // the write lock's hold, which a hand-off passes on within its process
}

func checkRWModel(rt *rapid.T, nNodes int, stats *propStats, steps *atomic.Int64) {
	const (
		expiry  = 8 * time.Second
		clients = 4
	)
	quorum := nNodes/2 + 1
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	nodes := make([]*rwPropNode, nNodes)
	for k := range nodes {
		n := &rwPropNode{modelNode: &modelNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}, now: base}
		n.srv.SetTime(base)
		n.srv.ClockTTL(true)
		if err := n.srv.Start(); err != nil {
			rt.Fatal(err)
		}
		n.addr, n.up = n.srv.Addr(), true
		nodes[k] = n
	}

	var all []*rwPropClient // every client made, crashed ones included
	nextID := 0
	newClient := func(rt *rapid.T) *rwPropClient {
		c := &rwPropClient{id: nextID}
		nextID++
		backends := make([]Backend, nNodes)
		for k, n := range nodes {
			p := n.newPool()
			c.pools = append(c.pools, p)
			backends[k] = &rwPropBackend{inner: NewRedigo(p), node: n, dead: &c.dead}
		}
		rw, err := NewRW("rwprop", backends, WithExpiry(expiry),
			WithNodeTimeout(200*time.Millisecond), WithRetryDelay(time.Millisecond, 2*time.Millisecond),
			WithOutageWindow(0))
		if err != nil {
			rt.Fatal(err)
		}
		c.rw = rw
		all = append(all, c)
		return c
	}
	cs := make([]*rwPropClient, clients)
	for i := range cs {
		cs[i] = newClient(rt)
	}
	keys := cs[0].rw.keys

	// waitOp waits for a background call to return and returns its error.
	waitOp := func(rt *rapid.T, op *rwPropOp) error {
		select {
		case err := <-op.done:
			op.done <- err // for a later wait
			return err
		case <-time.After(20 * time.Second):
			rt.Fatalf("a background lock call did not return within 20s")
		}
		return nil
	}
	defer func() {
		for _, c := range all {
			if c.pend != nil {
				c.pend.cancel()
				<-c.pend.done
			}
			for c.rw.RUnlockCtx(ctx) == nil {
			}
			c.rw.UnlockCtx(ctx)
		}
		for _, c := range all {
			for _, p := range c.pools {
				p.Close()
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for _, c := range all {
			for _, m := range []*NetMutex{c.rw.w, c.rw.r} {
				for {
					m.reaper.mu.Lock()
					running := m.reaper.running
					m.reaper.mu.Unlock()
					if !running {
						break
					}
					if time.Now().After(deadline) {
						rt.Fatalf("reaper still running after 10s")
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
		for _, n := range nodes {
			n.srv.Close()
		}
	}()

	var seq atomic.Int64 // orders the acquisitions' calls and returns
	var acqs []rwAcq
	client := rapid.IntRange(0, clients-1)
	// holder draws, three times in four, a client for which holds is true
	// (if any), else any client.
	holder := func(rt *rapid.T, holds func(c *rwPropClient) bool) int {
		var is []int
		for i, c := range cs {
			if holds(c) {
				is = append(is, i)
			}
		}
		if len(is) == 0 || rapid.IntRange(0, 3).Draw(rt, "any client") == 0 {
			return client.Draw(rt, "client")
		}
		return is[rapid.IntRange(0, len(is)-1).Draw(rt, "holder")]
	}

	step := func(name string) {
		steps.Add(1)
		stats.add(name)
	}
	checkErr := func(rt *rapid.T, what string, err error, allowed ...error) {
		if err == nil {
			return
		}
		if !documented(err) {
			rt.Fatalf("%s: error %v matches no documented sentinel", what, err)
		}
		for _, a := range allowed {
			if errors.Is(err, a) {
				return
			}
		}
		rt.Fatalf("%s: got %v, want one of %v", what, err, allowed)
	}

	// writeIntact counts the nodes, up or down, whose writer key holds c's
	// current write lock; leaseLive those whose leases hold c's read lease
	// with a deadline ahead of the node's clock. believes* report whether c
	// thinks it holds (Lost, RLost not closed).
	writeHold := func(c *rwPropClient) (*hold, bool) {
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
	leaseHold := func(c *rwPropClient) (*hold, bool) {
		h, _ := c.rw.readHold() // the lease, or the write lock lent to the readers
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
	writeIntact := func(h *hold) int {
		n := 0
		want := h.value + ":" + strconv.FormatUint(h.token, 10)
		for _, nd := range nodes {
			if v, err := nd.srv.Get(keys.Writer); err == nil && v == want {
				n++
			}
		}
		return n
	}
	leaseLive := func(h *hold) int {
		n := 0
		for _, nd := range nodes {
			if s, err := nd.srv.ZScore(keys.Leases, h.value); err == nil && int64(s) > nd.nowMS() {
				n++
			}
		}
		return n
	}
	// readLive counts the nodes that hold live the hold h c's readers read
	// under: its read lease, or its write lock lent to them.
	readLive := func(c *rwPropClient, h *hold) int {
		if h.m == c.rw.w {
			return writeIntact(h)
		}
		return leaseLive(h)
	}
	// protected reports whether c holds for writing (w) and for reading (r)
	// with its hold believed and live on a quorum; believing, whether it
	// thinks it holds either.
	protected := func(c *rwPropClient) (w, r, believing bool) {
		if h, ok := writeHold(c); ok {
			believing = true
			w = writeIntact(h) >= quorum
		}
		if h, ok := leaseHold(c); ok {
			believing = true
			r = readLive(c, h) >= quorum
		}
		return w, r, believing
	}
	// acquired checks a new hold of client i (write or read) against every
	// live client's, its own process's included: none may be protected in
	// a conflicting mode; a believer that is not is overtaken (only
	// possible once the model's assumptions were broken).
	acquired := func(rt *rapid.T, i int, write bool, what string) {
		if w, r, _ := protected(cs[i]); !(write && w || !write && r) {
			// A reader that joined its process's lease after the lease
			// was lost on the servers, or a hold lost on the servers
			// (clock jump) before its background call was polled.
			stats.add("acquired, not protected (assumptions broken)")
			return
		}
		for j, o := range cs {
			w, r, _ := protected(o)
			if j == i {
				// Its own hold of the other kind.
				w, r = w && !write, r && write
			}
			if w || (write && r) {
				rt.Fatalf("client %d acquired %s while client %d holds a protected hold (write %v read %v)", i, what, j, w, r)
			}
			if _, ok := writeHold(o); ok && (j != i || !write) && !o.overtakenW {
				o.overtakenW = true
				stats.add("overtaken writer (assumptions broken)")
			}
			if _, ok := leaseHold(o); ok && write && !o.overtakenR {
				o.overtakenR = true
				stats.add("overtaken readers (assumptions broken)")
			}
		}
	}
	// wrote records a write acquisition of client i, whose call began at
	// start, and checks its token.
	wrote := func(rt *rapid.T, i int, start int64) {
		c := cs[i]
		end := seq.Add(1)
		tok := c.rw.Token()
		if tok == 0 {
			rt.Fatalf("client %d acquired the write lock with no token", i)
		}
		h := c.rw.writeHold()
		handed := slices.ContainsFunc(acqs, func(a rwAcq) bool { return a.who == c.id && a.hold == h })
		for _, a := range acqs {
			if handed {
				// Handed on by a writer of its process: the same hold,
				// whose token was checked when it was acquired.
				break
			}
			if a.token == tok {
				rt.Fatalf("client %d acquired with token %d, already given to client %d", i, tok, a.who)
			}
			if a.end < start && a.token > tok {
				rt.Fatalf("client %d acquired with token %d after client %d's acquisition with token %d had returned", i, tok, a.who, a.token)
			}
		}
		acqs = append(acqs, rwAcq{start: start, end: end, token: tok, who: c.id, hold: h})
		c.writer = true
		acquired(rt, i, true, "the write lock")
	}
	read := func(rt *rapid.T, i int) {
		cs[i].readers++
		acquired(rt, i, false, "a read lock")
	}
	// poll takes the result of client i's background call if it returned
	// (wait: waits for it).
	poll := func(rt *rapid.T, i int, wait bool) {
		c := cs[i]
		op := c.pend
		if op == nil {
			return
		}
		var err error
		if wait {
			err = waitOp(rt, op)
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
			checkErr(rt, fmt.Sprintf("client %d background %s", i, kind), err, ErrNotObtained, ErrQuorum)
			stats.add("background " + kind + "/failed")
			return
		}
		stats.add("background " + kind + "/ok")
		if op.write {
			wrote(rt, i, op.start)
		} else {
			read(rt, i)
		}
	}
	pollAll := func(rt *rapid.T) {
		for i := range cs {
			poll(rt, i, false)
		}
	}
	cancelOp := func(rt *rapid.T, i int) {
		if op := cs[i].pend; op != nil {
			op.cancel()
			poll(rt, i, true)
		}
	}
	// unlocked checks the answer of a release that reached Redis (an
	// UnlockCtx, the last RUnlockCtx) of a client whose hold may have been
	// overtaken.
	//
	// live is how many nodes held the hold, live, just before the call (see
	// holdLive): a release that reports success found it on a quorum.
	released := func(rt *rapid.T, i int, write bool, live int, err error) {
		c := cs[i]
		what, overtaken := "RUnlockCtx", &c.overtakenR
		if write {
			what, overtaken = "UnlockCtx", &c.overtakenW
		}
		checkErr(rt, fmt.Sprintf("client %d %s", i, what), err, ErrLockLost, ErrQuorum)
		if err == nil && live < quorum {
			rt.Fatalf("client %d %s: got success, but only %d nodes held it live (quorum %d): the hold had expired or gone", i, what, live, quorum)
		}
		if err != nil && live < quorum {
			stats.add(what + ": loss of a hold expired or gone on the servers reported")
		}
		if *overtaken {
			if err == nil {
				rt.Fatalf("client %d %s after another holder acquired over its hold: got success, want the loss reported", i, what)
			}
			stats.add("overtaken: " + what + " reported " + rwErrName(err))
			*overtaken = false
		}
	}
	// holdLive counts the nodes, up or down, that hold client c's write lock
	// (write) or read lease live.
	holdLive := func(c *rwPropClient, write bool) int {
		if write {
			if h := c.rw.writeHold(); h != nil {
				return writeIntact(h)
			}
			return 0
		}
		if h, _ := leaseHold(c); h != nil {
			return readLive(c, h)
		}
		return 0
	}
	advance := func(d time.Duration) {
		for _, n := range nodes {
			n.advance(d)
		}
	}
	// extendAll extends every live client's holds, as their watchdogs do.
	extendAll := func(rt *rapid.T) {
		for i, c := range cs {
			if h := c.rw.w.current(); h != nil {
				err := c.rw.w.ExtendCtx(ctx)
				checkErr(rt, fmt.Sprintf("client %d extend of the write lock", i), err, ErrLockLost, ErrQuorum, ErrNotHeld)
			}
			if h, _ := leaseHold(c); h != nil {
				err := c.rw.r.ExtendCtx(ctx)
				checkErr(rt, fmt.Sprintf("client %d extend of the read lease", i), err, ErrLockLost, ErrQuorum, ErrNotHeld)
			}
		}
	}
	drawNode := func(rt *rapid.T, up bool) (*rwPropNode, bool) {
		var ks []*rwPropNode
		for _, n := range nodes {
			if n.up == up {
				ks = append(ks, n)
			}
		}
		if len(ks) == 0 {
			return nil, false
		}
		return ks[rapid.IntRange(0, len(ks)-1).Draw(rt, fmt.Sprintf("node up=%v", up))], true
	}
	nodeUp := func(rt *rapid.T, n *rwPropNode) {
		n.gen.Add(1)
		if err := n.srv.Restart(); err != nil {
			rt.Fatalf("restart node: %v", err)
		}
		n.partitioned.Store(false)
		n.up = true
	}
	lockKeys := []string{keys.Writer, keys.Writers, keys.Readers, keys.Leases}

	// leaveAll: every live client's background call is cancelled and every
	// hold released; every node comes back; time passes beyond every expiry
	// and waiter's place. Nothing of the lock is then left on any node.
	leaveAll := func(rt *rapid.T) {
		for i, c := range cs {
			cancelOp(rt, i)
			for c.readers > 0 {
				c.readers--
				live := holdLive(c, false)
				err := c.rw.RUnlockCtx(ctx)
				if c.readers == 0 {
					released(rt, i, false, live, err)
				} else if err != nil {
					rt.Fatalf("client %d RUnlockCtx, %d readers left: %v", i, c.readers, err)
				}
			}
			if c.writer {
				c.writer = false
				live := holdLive(c, true)
				released(rt, i, true, live, c.rw.UnlockCtx(ctx))
			}
		}
		for _, n := range nodes {
			if !n.up {
				nodeUp(rt, n)
			}
		}
		advance(placeExpiries*expiry + expiry + time.Millisecond)
		for k, n := range nodes {
			for _, key := range lockKeys {
				if n.srv.Exists(key) {
					rt.Fatalf("node %d: %s left behind %v after everyone left", k, key, placeExpiries*expiry+expiry)
				}
			}
		}
	}

	// fresh runs a new process's TryLockCtx, UnlockCtx, TryRLockCtx and
	// RUnlockCtx on a free lock: each must succeed at once.
	fresh := func(rt *rapid.T) {
		f := newClient(rt)
		start := seq.Add(1)
		ok, err := f.rw.TryLockCtx(ctx)
		if !ok || err != nil {
			rt.Fatalf("a fresh client's TryLockCtx on a free lock: got %v, %v; want true (stranded?)", ok, err)
		}
		tok := f.rw.Token()
		for _, a := range acqs {
			if a.token >= tok {
				rt.Fatalf("a fresh client acquired with token %d, not above %d of an earlier acquisition", tok, a.token)
			}
		}
		acqs = append(acqs, rwAcq{start: start, end: seq.Add(1), token: tok, who: f.id})
		if err := f.rw.UnlockCtx(ctx); err != nil {
			rt.Fatalf("a fresh client's UnlockCtx: %v", err)
		}
		if ok, err := f.rw.TryRLockCtx(ctx); !ok || err != nil {
			rt.Fatalf("a fresh client's TryRLockCtx on a free lock: got %v, %v; want true", ok, err)
		}
		if err := f.rw.RUnlockCtx(ctx); err != nil {
			rt.Fatalf("a fresh client's RUnlockCtx: %v", err)
		}
	}

	// writerVsReaders, on a lock left by everyone: two processes read, a
	// writer of a third waits, a fourth process's readers are kept out at
	// once, the reading processes' at their lease's next extend; the
	// writer gets in as soon as the readers under way leave.
	writerVsReaders := func(rt *rapid.T) {
		perm := rapid.Permutation([]int{0, 1, 2, 3}).Draw(rt, "roles")
		a, b, w, n := perm[0], perm[1], perm[2], perm[3]
		for _, i := range []int{a, b} {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := cs[i].rw.RLockCtx(rctx)
			cancel()
			if err != nil {
				rt.Fatalf("client %d RLockCtx on a lock only read: %v", i, err)
			}
			read(rt, i)
		}
		wc := cs[w]
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		op := &rwPropOp{write: true, cancel: cancel, done: make(chan error, 1), start: seq.Add(1)}
		go func() { op.done <- wc.rw.LockCtx(wctx) }()
		wc.pend = op
		// Wait for the writer's place on a quorum.
		deadline := time.Now().Add(5 * time.Second)
		for {
			q := 0
			for _, nd := range nodes {
				if m, _ := nd.srv.ZMembers(keys.Writers); len(m) > 0 {
					q++
				}
			}
			if q >= quorum {
				break
			}
			if time.Now().After(deadline) {
				rt.Fatalf("the writer did not queue on a quorum within 5s")
			}
			time.Sleep(time.Millisecond)
		}
		stillWaits := func(when string) {
			select {
			case err := <-op.done:
				rt.Fatalf("the writer's LockCtx returned %v %s", err, when)
			default:
			}
		}
		// Until their lease is next extended, the reading processes
		// may let more of their goroutines in (the documented delay);
		// a new process may not.
		for _, i := range []int{a, b} {
			for range rapid.IntRange(0, 2).Draw(rt, "joins") {
				ok, err := cs[i].rw.TryRLockCtx(ctx)
				if !ok {
					// Only if its watchdog's extend (real time) told
					// it already.
					if h, _ := leaseHold(cs[i]); err != nil || h == nil || !h.writerWaits.Load() {
						rt.Fatalf("client %d TryRLockCtx, joining its lease before it learns a writer waits: got %v, %v; want true", i, ok, err)
					}
					stats.add("join refused: the watchdog told first")
					continue
				}
				read(rt, i)
			}
		}
		if ok, err := cs[n].rw.TryRLockCtx(ctx); ok || err != nil {
			rt.Fatalf("client %d TryRLockCtx of a new process while a writer waits: got %v, %v; want false", n, ok, err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Millisecond)
		if err := cs[n].rw.RLockCtx(rctx); !errors.Is(err, ErrNotObtained) {
			rt.Fatalf("client %d RLockCtx of a new process while a writer waits: got %v, want ErrNotObtained", n, err)
		}
		rcancel()
		stillWaits("while readers hold")
		// An extend interval: every lease is extended, and learns
		// that a writer waits. No reader joins after that.
		advance(expiry / extendsPerExpiry)
		told := map[int]bool{n: true}
		for _, i := range []int{a, b} {
			// As the watchdog does: an extend that fails (a node
			// slower than the node timeout on a loaded machine) is
			// tried again.
			var err error
			for range 5 {
				if err = cs[i].rw.r.ExtendCtx(ctx); err == nil {
					break
				}
			}
			checkErr(rt, fmt.Sprintf("client %d extend of the read lease", i), err, ErrQuorum)
			if err != nil {
				stats.add("scenario: extend failed")
				continue
			}
			h, _ := leaseHold(cs[i])
			if !h.writerWaits.Load() {
				rt.Fatalf("client %d: its lease's extend did not learn that a writer waits", i)
			}
			told[i] = true
		}
		for _, i := range []int{a, b, n} {
			if !told[i] {
				continue
			}
			if ok, err := cs[i].rw.TryRLockCtx(ctx); ok || err != nil {
				rt.Fatalf("client %d TryRLockCtx after its lease's extend said a writer waits: got %v, %v; want false", i, ok, err)
			}
		}
		stillWaits("while readers hold")
		// The readers under way leave, in a drawn order; the writer
		// gets in after the last, without the servers' clocks moving.
		order := []int{a, b}
		if rapid.Bool().Draw(rt, "b first") {
			order = []int{b, a}
		}
		for k, i := range order {
			c := cs[i]
			for c.readers > 0 {
				c.readers--
				live := holdLive(c, false)
				err := c.rw.RUnlockCtx(ctx)
				if c.readers == 0 {
					released(rt, i, false, live, err)
					if err != nil {
						rt.Fatalf("client %d RUnlockCtx: %v", i, err)
					}
				}
			}
			if k == 0 {
				time.Sleep(time.Millisecond)
				stillWaits("while one reading process still holds")
			}
		}
		start := time.Now()
		select {
		case err := <-op.done:
			op.done <- err
		case <-time.After(4 * time.Second):
			rt.Fatalf("the writer did not get in within 4s of the last reader leaving")
		}
		poll(rt, w, true)
		if !wc.writer {
			rt.Fatalf("the writer's LockCtx failed")
		}
		stats.add(fmt.Sprintf("writer in after the readers left, in %v", time.Since(start).Round(100*time.Millisecond)))
		wc.writer = false
		live := holdLive(wc, true)
		released(rt, w, true, live, wc.rw.UnlockCtx(ctx))
	}

	rt.Repeat(map[string]func(*rapid.T){
		"TryRLockCtx": func(rt *rapid.T) {
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			ok, err := c.rw.TryRLockCtx(ctx)
			checkErr(rt, fmt.Sprintf("client %d TryRLockCtx", i), err, ErrQuorum)
			if ok && err != nil {
				rt.Fatalf("client %d TryRLockCtx: got true with %v", i, err)
			}
			if ok && c.writer {
				// (A writer of its own in the background may have given
				// up meanwhile: not checked.)
				rt.Fatalf("client %d TryRLockCtx: got true while it holds the write lock", i)
			}
			if ok {
				read(rt, i)
				step("tryrlock/ok")
				return
			}
			step("tryrlock/" + map[bool]string{true: "err", false: "busy"}[err != nil])
		},
		"RLockCtx short deadline": func(rt *rapid.T) {
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			dctx, cancel := context.WithTimeout(ctx, shortDeadline(rt))
			defer cancel()
			err := c.rw.RLockCtx(dctx)
			checkErr(rt, fmt.Sprintf("client %d RLockCtx", i), err, ErrNotObtained, ErrQuorum)
			if err == nil {
				// Its own write lock does not keep it out locally: only
				// if that lock was lost on the servers (acquired checks).
				read(rt, i)
				step("rlock/ok")
				return
			}
			step("rlock/failed")
		},
		"TryLockCtx": func(rt *rapid.T) {
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			start := seq.Add(1)
			ok, err := c.rw.TryLockCtx(ctx)
			checkErr(rt, fmt.Sprintf("client %d TryLockCtx", i), err, ErrQuorum)
			if ok && err != nil {
				rt.Fatalf("client %d TryLockCtx: got true with %v", i, err)
			}
			if ok && (c.writer || c.readers > 0) {
				rt.Fatalf("client %d TryLockCtx: got true while it holds (writer %v, %d readers)", i, c.writer, c.readers)
			}
			if ok {
				wrote(rt, i, start)
				step("trylock/ok")
				return
			}
			step("trylock/" + map[bool]string{true: "err", false: "busy"}[err != nil])
		},
		"LockCtx short deadline": func(rt *rapid.T) {
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			if c.readers > 0 {
				// Would wait for its own readers: a deadlock in
				// sync.RWMutex too. Tried with a short deadline anyway.
				stats.add("lock/own readers")
			}
			dctx, cancel := context.WithTimeout(ctx, shortDeadline(rt))
			defer cancel()
			start := seq.Add(1)
			err := c.rw.LockCtx(dctx)
			checkErr(rt, fmt.Sprintf("client %d LockCtx", i), err, ErrNotObtained, ErrQuorum)
			if err == nil {
				if c.writer {
					rt.Fatalf("client %d LockCtx: got in while it holds the write lock", i)
				}
				// Its own readers do not keep it out locally: only if
				// their lease was lost on the servers (acquired checks).
				wrote(rt, i, start)
				step("lock/ok")
				return
			}
			step("lock/failed")
		},
		"background LockCtx or RLockCtx": func(rt *rapid.T) {
			// Another goroutine of client i's process locks, with a
			// deadline of its own; the model goes on meanwhile.
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			if c.pend != nil {
				step("background/busy")
				return
			}
			write := rapid.Bool().Draw(rt, "write")
			wait := time.Duration(rapid.IntRange(20, 300).Draw(rt, "deadline ms")) * time.Millisecond
			bctx, cancel := context.WithTimeout(ctx, wait)
			op := &rwPropOp{write: write, cancel: cancel, done: make(chan error, 1), start: seq.Add(1)}
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
			step(fmt.Sprintf("background/start write=%v", write))
		},
		"wait for the background call": func(rt *rapid.T) {
			i := client.Draw(rt, "client")
			poll(rt, i, true)
			step("background/wait")
		},
		"RUnlockCtx": func(rt *rapid.T) {
			pollAll(rt)
			i := holder(rt, func(c *rwPropClient) bool { return c.readers > 0 })
			c := cs[i]
			if c.readers == 0 {
				if c.pend != nil && !c.pend.write {
					step("runlock/pending") // might have got in meanwhile
					return
				}
				checkErr(rt, fmt.Sprintf("client %d RUnlockCtx without a read lock", i), c.rw.RUnlockCtx(ctx), ErrNotHeld)
				if c.rw.RUnlockCtx(ctx) == nil {
					rt.Fatalf("client %d RUnlockCtx without a read lock: got nil", i)
				}
				step("runlock/notheld")
				return
			}
			c.readers--
			live := holdLive(c, false)
			if c.pend != nil && !c.pend.write {
				// The lease may be handed over to the reader in the
				// background: no release then, and nothing to check.
				live = nNodes
			}
			hr, _ := c.rw.readHold()
			err := c.rw.RUnlockCtx(ctx)
			_, left := c.rw.readHold()
			if err == nil && left == 0 && c.readers == 0 && c.pend != nil && c.pend.write && hr != nil && hr.m == c.rw.w && c.rw.w.current() == hr {
				// The write lock its readers read under, handed on to
				// the writer of the process in the background: as for
				// UnlockCtx.
				step("runlock/handed on")
				return
			}
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
				released(rt, i, false, live, err)
				step("runlock/last/" + rwErrName(err))
				return
			}
			if err != nil {
				rt.Fatalf("client %d RUnlockCtx, other readers left: %v", i, err)
			}
			step("runlock/other readers")
		},
		"UnlockCtx": func(rt *rapid.T) {
			pollAll(rt)
			i := holder(rt, func(c *rwPropClient) bool { return c.writer })
			c := cs[i]
			if !c.writer {
				if c.pend != nil && c.pend.write {
					step("unlock/pending")
					return
				}
				if err := c.rw.UnlockCtx(ctx); !errors.Is(err, ErrNotHeld) {
					rt.Fatalf("client %d UnlockCtx without the write lock: got %v, want ErrNotHeld", i, err)
				}
				step("unlock/notheld")
				return
			}
			c.writer = false
			live := holdLive(c, true)
			h := c.rw.writeHold()
			err := c.rw.UnlockCtx(ctx)
			if err == nil && c.pend != nil && h != nil && c.rw.w.current() == h {
				// Handed on to the call in the background (a writer of
				// the process, or its readers): no release, the hold goes
				// on, and its release is checked when it comes.
				step("unlock/handed on")
				return
			}
			released(rt, i, true, live, err)
			step("unlock/" + rwErrName(err))
		},
		"crash client": func(rt *rapid.T) {
			// The process dies: nothing it sends reaches a node any more,
			// its holds and its waiters' places stay until they expire. A
			// fresh process takes its place.
			pollAll(rt)
			i := client.Draw(rt, "client")
			c := cs[i]
			c.dead.Store(true)
			if c.pend != nil {
				c.pend.cancel()
				waitOp(rt, c.pend) // its error does not matter: it died
			}
			step(fmt.Sprintf("crash/writer=%v/readers=%v", c.writer, c.readers > 0))
			cs[i] = newClient(rt)
		},
		"node down": func(rt *rapid.T) {
			pollAll(rt)
			n, ok := drawNode(rt, true)
			if !ok {
				step("node down/none")
				return
			}
			if rapid.Bool().Draw(rt, "partition") {
				n.partitioned.Store(true)
				n.srv.Close()
				step("node down/partition")
			} else {
				n.srv.Close()
				n.gen.Add(1)
				step("node down/crash")
			}
			n.up = false
		},
		"node up": func(rt *rapid.T) {
			pollAll(rt)
			n, ok := drawNode(rt, false)
			if !ok {
				step("node up/none")
				return
			}
			nodeUp(rt, n)
			step("node up")
		},
		"flush the lock's keys on a node": func(rt *rapid.T) {
			// Behind the clients' back (the fence counter is kept, as in
			// TestProperty: it never expires).
			pollAll(rt)
			n, ok := drawNode(rt, true)
			if !ok {
				step("flush/none")
				return
			}
			for _, k := range lockKeys {
				n.srv.Del(k)
			}
			step("flush")
		},
		"SCRIPT FLUSH": func(rt *rapid.T) {
			pollAll(rt)
			n, ok := drawNode(rt, true)
			if !ok {
				step("SCRIPT FLUSH/none")
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
			step("SCRIPT FLUSH")
		},
		"time passes": func(rt *rapid.T) {
			pollAll(rt)
			advance(time.Duration(rapid.IntRange(0, int(expiry/extendsPerExpiry/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond)
			extendAll(rt)
			step("time passes")
		},
		"clock jump": func(rt *rapid.T) {
			pollAll(rt)
			advance(time.Duration(rapid.IntRange(0, int(3*expiry/time.Millisecond)).Draw(rt, "ms")) * time.Millisecond)
			step("clock jump")
		},
		"everyone leaves": func(rt *rapid.T) {
			// Then a fresh client, or a writer waiting while readers come.
			pollAll(rt)
			leaveAll(rt)
			if rapid.Bool().Draw(rt, "writer waits while readers come") {
				writerVsReaders(rt)
				step("everyone leaves/writer waits while readers come")
				return
			}
			fresh(rt)
			step("everyone leaves/fresh client")
		},
		"": func(rt *rapid.T) {
			pollAll(rt)
			writers, readers := 0, 0
			for i, c := range cs {
				w, r, _ := protected(c)
				if w {
					writers++
				}
				if r {
					readers++
				}
				if c.pend != nil {
					continue // its state may change under our eyes
				}
				_, believesW := writeHold(c)
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
				_, believesR := leaseHold(c)
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
		},
	})
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
