package netlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"pgregory.net/rapid"
)

// lockModel is what the clients of one lock name should see: who holds the
// key on the server and until when (in miniredis time), and what each client
// believes.
type lockModel struct {
	now, expiresAt time.Duration // miniredis time since the start
	holder         int           // client whose value is in the key, or -1
	held, lost     []bool        // per client: has a hold; the hold is known lost
	lastToken      uint64
}

func (lm *lockModel) keyHeld() bool { return lm.holder >= 0 && lm.now < lm.expiresAt }

// TestPropertySingleNode drives several clients of one lock name on one
// miniredis node through random sequences of lock, try, unlock, extend,
// time passing, script flushes and keys deleted behind their back, and checks
// every answer against the model: at most one holder, tokens strictly
// increasing, the documented errors, nothing left behind.
func TestPropertySingleNode(t *testing.T) {
	const expiry = 8 * time.Second
	rapid.Check(t, func(rt *rapid.T) {
		srv := miniredis.NewMiniRedis()
		if err := srv.Start(); err != nil {
			rt.Fatal(err)
		}
		defer srv.Close()
		// Clients 0 and 1 share a pool (one process, two NetMutex objects);
		// client 2 has its own, as another process.
		var pools []*redis.Pool
		newPool := func() Backend {
			p := &redis.Pool{MaxIdle: 4, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", srv.Addr()) }}
			pools = append(pools, p)
			return NewRedigo(p)
		}
		defer func() {
			for _, p := range pools {
				p.Close()
			}
		}()
		shared := newPool()
		backends := []Backend{shared, shared, newPool()}
		// Auto-extend off and a long expiry: the local deadline never passes
		// during a run, so only the server's clock (FastForward) ends holds.
		clients := make([]*NetMutex, len(backends))
		for i, b := range backends {
			m, err := New("prop", []Backend{b}, WithExpiry(expiry), WithAutoExtend(false), WithRetryDelay(time.Millisecond, 2*time.Millisecond))
			if err != nil {
				rt.Fatal(err)
			}
			clients[i] = m
		}
		lm := &lockModel{holder: -1, held: make([]bool, len(clients)), lost: make([]bool, len(clients))}
		defer func() {
			for i, m := range clients {
				if lm.held[i] {
					m.UnlockCtx(context.Background())
				}
			}
		}()
		ctx := context.Background()
		client := rapid.IntRange(0, len(clients)-1)

		acquired := func(rt *rapid.T, i int) {
			tok := clients[i].Token()
			if tok <= lm.lastToken {
				rt.Fatalf("client %d token %d, want above %d", i, tok, lm.lastToken)
			}
			lm.lastToken = tok
			lm.holder, lm.expiresAt = i, lm.now+expiry
			lm.held[i], lm.lost[i] = true, false
		}

		rt.Repeat(map[string]func(*rapid.T){
			"TryLockCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				ok, err := clients[i].TryLockCtx(ctx)
				if err != nil {
					rt.Fatalf("client %d TryLockCtx: %v", i, err)
				}
				want := !lm.held[i] && !lm.keyHeld()
				if ok != want {
					rt.Fatalf("client %d TryLockCtx: got %v, want %v (holder %d)", i, ok, want, lm.holder)
				}
				if ok {
					acquired(rt, i)
				}
			},
			"LockCtx short deadline": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				free := !lm.held[i] && !lm.keyHeld()
				wait := 5 * time.Millisecond // held: LockCtx must give up
				if free {
					wait = 10 * time.Second // free: a generous bound on a loaded machine
				}
				dctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				err := clients[i].LockCtx(dctx)
				if free {
					if err != nil {
						rt.Fatalf("client %d LockCtx on a free lock: %v", i, err)
					}
					acquired(rt, i)
					return
				}
				if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
					rt.Fatalf("client %d LockCtx on a held lock: got %v, want ErrNotObtained and DeadlineExceeded", i, err)
				}
			},
			"UnlockCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				err := clients[i].UnlockCtx(ctx)
				switch {
				case !lm.held[i]:
					if !errors.Is(err, ErrNotHeld) {
						rt.Fatalf("client %d UnlockCtx without a hold: got %v, want ErrNotHeld", i, err)
					}
				case lm.holder == i && lm.keyHeld() && !lm.lost[i]:
					if err != nil {
						rt.Fatalf("client %d UnlockCtx: %v", i, err)
					}
					lm.holder = -1
				default:
					if !errors.Is(err, ErrLockLost) {
						rt.Fatalf("client %d UnlockCtx of a lapsed hold: got %v, want ErrLockLost", i, err)
					}
					if lm.holder == i {
						lm.holder = -1 // released all the same: the key was still ours
					}
				}
				lm.held[i], lm.lost[i] = false, false
			},
			"ExtendCtx": func(rt *rapid.T) {
				i := client.Draw(rt, "client")
				err := clients[i].ExtendCtx(ctx)
				switch {
				case !lm.held[i]:
					if !errors.Is(err, ErrNotHeld) {
						rt.Fatalf("client %d ExtendCtx without a hold: got %v, want ErrNotHeld", i, err)
					}
				case lm.holder == i && lm.keyHeld() && !lm.lost[i]:
					if err != nil {
						rt.Fatalf("client %d ExtendCtx: %v", i, err)
					}
					lm.expiresAt = lm.now + expiry
				default:
					if !errors.Is(err, ErrLockLost) {
						rt.Fatalf("client %d ExtendCtx of a lapsed hold: got %v, want ErrLockLost", i, err)
					}
					lm.lost[i] = true
					select {
					case <-clients[i].Lost():
					default:
						rt.Fatalf("client %d: ExtendCtx reported ErrLockLost but Lost() is open", i)
					}
				}
			},
			"advance time": func(rt *rapid.T) {
				d := time.Duration(rapid.IntRange(0, 12000).Draw(rt, "ms")) * time.Millisecond
				srv.FastForward(d)
				lm.now += d
				if !lm.keyHeld() {
					lm.holder = -1
				}
			},
			"SCRIPT FLUSH": func(rt *rapid.T) {
				c, err := redis.Dial("tcp", srv.Addr())
				if err != nil {
					rt.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Do("SCRIPT", "FLUSH"); err != nil {
					rt.Fatal(err)
				}
			},
			"delete key behind its back": func(rt *rapid.T) {
				srv.Del("netlock:{prop}")
				lm.holder = -1
			},
			"": func(rt *rapid.T) {
				// Invariant: the server's key belongs to the model's holder.
				if lm.keyHeld() != srv.Exists("netlock:{prop}") {
					rt.Fatalf("key exists: got %v, model says %v", srv.Exists("netlock:{prop}"), lm.keyHeld())
				}
				valid := 0
				for i := range clients {
					if lm.held[i] && !lm.lost[i] && lm.holder == i && lm.keyHeld() {
						valid++
					}
				}
				if valid > 1 {
					rt.Fatalf("%d clients hold a valid lock", valid)
				}
			},
		})
	})
}

// propQuorumSteps counts the actions TestPropertyQuorum has run, over all
// its checks: the "steps explored" it reports.
var propQuorumSteps atomic.Int64

// quorumNode is the model of one miniredis node of TestPropertyQuorum, and
// the node itself.
//
// A node goes down in one of two ways, both with srv.Close (miniredis keeps
// its data: no write is lost, as with AOF and fsync), chosen so that what the
// reaper does is deterministic:
//   - crashed: nothing listens; every call is refused, a final error, so
//     nothing is queued for the reaper. Pooled connections are dropped (see
//     gen), so none gives a non-final EOF instead.
//   - partitioned: every call fails with a non-final error (EOF on a pooled
//     connection, an i/o timeout for a new one), so every release sent to the
//     node is queued and the reaper retries it until the node is back, then
//     delivers it.
type quorumNode struct {
	srv     *miniredis.Miniredis
	addr    string // srv.Addr, which panics while srv is closed
	up      bool
	key     quorumKey // the lock key; value "" when absent
	counter uint64    // the fence counter (no TTL: survives everything)

	// queued holds the values of the holds unlocked while the node was
	// partitioned: the reaper delivers their release when it is back.
	queued map[string]bool

	partitioned atomic.Bool // read by the pool's dial
	// gen is bumped when the node crashes and when it comes back. Pooled
	// connections carry the generation they were dialled in, and one from an
	// earlier generation is dropped when borrowed: so a node that is up
	// always answers (no connection broken by the outage), and a crashed one
	// always refuses.
	gen   atomic.Int64
	conns sync.Map // redis.Conn -> generation it was dialled in
}

// errPartitioned is what dialling a partitioned node gives: a timeout, not
// a final error.
var errPartitioned = &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}

// quorumKey is what the model says one node's lock key holds.
type quorumKey struct {
	value  string        // lock value of the hold that set it; "" when absent
	token  uint64        // its fencing token: the key holds "<value>:<token>"
	client int           // the client that acquired it
	exp    time.Duration // model time at which it expires
}

// quorumClient is the model of one client (one NetMutex).
type quorumClient struct {
	m          *NetMutex
	held, lost bool   // has a hold; the hold was reported lost (ExtendCtx)
	value      string // the current hold's lock value
	token      uint64
	seen       uint64 // highest fence counter the client has learned
}

// newPool returns a redigo pool on node n (see quorumNode).
func (n *quorumNode) newPool() *redis.Pool {
	return &redis.Pool{
		MaxIdle: 4,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			if n.partitioned.Load() {
				return nil, errPartitioned
			}
			// The generation is read before dialling: a connection that
			// a restart or crash may have cut is never tagged with a later one.
			gen := n.gen.Load()
			c, err := redis.DialContext(ctx, "tcp", n.addr)
			if err == nil {
				n.conns.Store(c, gen)
			}
			return c, err
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error {
			if gen, _ := n.conns.Load(c); gen != n.gen.Load() {
				n.conns.Delete(c)
				return errors.New("dialled before a restart")
			}
			return nil
		},
	}
}

// TestPropertyQuorum drives three clients of one lock name on 3 and on 5
// miniredis nodes through random sequences of lock, try, unlock, extend,
// time passing (on every node, down or not), nodes crashing or partitioned
// and coming back with their data, script flushes and keys deleted behind
// their back. The model follows every node's lock key and fence
// counter and every client's hold and learned counter exactly, and each
// answer is checked against it: the result and error of every call, the
// fencing token of every acquisition (strictly increasing), and after every
// step the key (value, token, TTL) and counter on every node, Token and Lost
// of every client, and that at most one client believes it holds a quorum of
// valid keys.
func TestPropertyQuorum(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			stats := map[string]int{}
			before := propQuorumSteps.Load()
			start := time.Now()
			rapid.Check(t, func(rt *rapid.T) { checkQuorum(rt, n, stats) })
			t.Logf("N=%d: %d steps explored in %v; outcomes %v", n, propQuorumSteps.Load()-before, time.Since(start).Round(time.Millisecond), stats)
		})
	}
}

func checkQuorum(rt *rapid.T, nNodes int, stats map[string]int) {
	const (
		expiry  = 8 * time.Second
		lockKey = "netlock:{prop}"
	)
	quorum := nNodes/2 + 1
	ctx := context.Background()

	nodes := make([]*quorumNode, nNodes)
	var pools []*redis.Pool
	// Clients 0 and 1 share one pool per node (one process, two NetMutex
	// objects); client 2 has its own, as another process.
	shared := make([]Backend, nNodes)
	own := make([]Backend, nNodes)
	for k := range nodes {
		n := &quorumNode{srv: miniredis.NewMiniRedis(), queued: map[string]bool{}}
		if err := n.srv.Start(); err != nil {
			rt.Fatal(err)
		}
		nodes[k] = n
		n.addr, n.up = n.srv.Addr(), true
		a, b := n.newPool(), n.newPool()
		pools = append(pools, a, b)
		shared[k], own[k] = NewRedigo(a), NewRedigo(b)
	}
	clients := make([]*quorumClient, 3)
	for i := range clients {
		backends := shared
		if i == 2 {
			backends = own
		}
		m, err := New("prop", backends, WithExpiry(expiry), WithAutoExtend(false),
			WithNodeTimeout(200*time.Millisecond), WithRetryDelay(time.Millisecond, 2*time.Millisecond))
		if err != nil {
			rt.Fatal(err)
		}
		clients[i] = &quorumClient{m: m}
	}
	fenceKey := clients[0].m.keys.fence

	// waitReapers waits until no client's reaper has releases pending.
	waitReapers := func(rt *rapid.T) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			running := false
			for _, c := range clients {
				c.m.reaper.mu.Lock()
				running = running || c.m.reaper.running
				c.m.reaper.mu.Unlock()
			}
			if !running {
				return
			}
			if time.Now().After(deadline) {
				rt.Fatalf("reaper still running after 10s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	defer func() {
		for _, c := range clients {
			if c.held {
				c.m.UnlockCtx(ctx)
			}
		}
		// A closed pool is a final error: the reapers end at their next pass.
		for _, p := range pools {
			p.Close()
		}
		waitReapers(rt)
		for _, n := range nodes {
			n.srv.Close()
		}
	}()

	var now time.Duration // model time: every node's clock moves together
	var lastToken uint64  // the token of the latest acquisition
	client := rapid.IntRange(0, len(clients)-1)

	// current reports whether key is of the current hold of its client
	// (lost or not): such a key is never released behind the model's back.
	current := func(key quorumKey) bool {
		c := clients[key.client]
		return key.value != "" && c.held && c.value == key.value
	}
	learn := func(c *quorumClient, counter uint64) { c.seen = max(c.seen, counter) }
	count := func() (up, free int) {
		for _, n := range nodes {
			if n.up {
				up++
				if n.key.value == "" {
					free++
				}
			}
		}
		return up, free
	}

	// round runs one acquire round of client i in the model (see
	// acquireRound): "ok" (the hold is then recorded, with the token it must
	// have), "quorum", "ballot" (the key is free on a quorum, a ballot was
	// refused) or
	// "busy".
	round := func(i int) (string, uint64) {
		c := clients[i]
		proposal := c.seen + 1
		up, fenced, nFenced := 0, false, 0
		var granted []int
		for k, n := range nodes {
			if !n.up {
				continue
			}
			up++
			switch {
			case n.key.value != "":
				learn(c, n.counter)
			case proposal <= n.counter:
				fenced = true
				nFenced++
				learn(c, n.counter)
			default:
				granted = append(granted, k)
				n.counter = proposal
				learn(c, proposal)
			}
		}
		switch {
		case len(granted) >= quorum:
			// The value is random: take it from the hold (acquired fails
			// the check if the call did not acquire).
			c.held, c.lost, c.token, c.value = true, false, proposal, ""
			if h := c.m.current(); h != nil {
				c.value = h.value
			}
			for _, k := range granted {
				nodes[k].key = quorumKey{value: c.value, token: proposal, client: i, exp: now + expiry}
			}
			return "ok", proposal
		case up < quorum:
			return "quorum", 0 // the grants were released; the counters stay
		case fenced && len(granted)+nFenced >= quorum:
			return "ballot", 0
		}
		return "busy", 0
	}
	// acquired checks a successful acquisition of client i against the
	// model's round: the token the round granted, above every earlier one.
	acquired := func(rt *rapid.T, i int, want uint64) {
		h := clients[i].m.current()
		if h == nil {
			rt.Fatalf("client %d acquired but has no hold", i)
		}
		if h.token != want || want <= lastToken {
			rt.Fatalf("client %d acquired with token %d, want %d (last token %d)", i, h.token, want, lastToken)
		}
		lastToken = want
	}
	// resync takes the fence counters of the up nodes and client i's learned
	// counter from the servers, after a call that made an unknown number of
	// rounds; they may only have grown.
	resync := func(rt *rapid.T, i int) {
		for k, n := range nodes {
			if !n.up {
				continue
			}
			got := serverCounter(rt, n.srv, fenceKey)
			if got < n.counter {
				rt.Fatalf("node %d: fence counter went down from %d to %d", k, n.counter, got)
			}
			n.counter = got
		}
		c := clients[i]
		if got := c.m.seen.Load(); got < c.seen {
			rt.Fatalf("client %d: learned counter went down from %d to %d", i, c.seen, got)
		} else {
			c.seen = got
		}
	}
	// settleWant counts a release or extend of client i's hold on the up
	// nodes, applying fn to those that hold its value, and returns the error
	// settle must give.
	settleWant := func(i int, fn func(n *quorumNode)) (okN, gone int, want error) {
		for _, n := range nodes {
			if !n.up {
				continue
			}
			if n.key.value != "" && n.key.value == clients[i].value {
				okN++
				fn(n)
			} else {
				gone++
			}
		}
		switch {
		case okN >= quorum:
			return okN, gone, nil
		case gone > nNodes-quorum:
			return okN, gone, ErrLockLost
		}
		return okN, gone, ErrQuorum
	}
	checkErr := func(rt *rapid.T, what string, err, want error) {
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			rt.Fatalf("%s: got %v, want %v", what, err, want)
		}
	}
	step := func(name string) {
		propQuorumSteps.Add(1)
		stats[name]++
	}

	// drawNode draws a node that is up (or down), and reports false if
	// there is none.
	drawNode := func(rt *rapid.T, up bool) (int, bool) {
		var ks []int
		for k, n := range nodes {
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
		return ks[rapid.IntRange(0, len(ks)-1).Draw(rt, what)], true
	}

	rt.Repeat(map[string]func(*rapid.T){
		"TryLockCtx": func(rt *rapid.T) {
			i := client.Draw(rt, "client")
			c := clients[i]
			up, free := count()
			ok, err := c.m.TryLockCtx(ctx)
			if c.held {
				// Held in this process: no round trip at all.
				if ok || err != nil {
					rt.Fatalf("client %d TryLockCtx while holding: got %v, %v", i, ok, err)
				}
				step("try/held")
				return
			}
			// One attempt: a refused ballot on a free lock is retried at
			// once (maxBallots times), anything else ends it.
			res, tok := "", uint64(0)
			for r := 0; ; r++ {
				if res, tok = round(i); res != "ballot" || r == maxBallots {
					break
				}
			}
			switch res {
			case "ok":
				if !ok || err != nil {
					rt.Fatalf("client %d TryLockCtx (%d up, %d free): got %v, %v, want true", i, up, free, ok, err)
				}
				acquired(rt, i, tok)
			case "quorum":
				if ok || !errors.Is(err, ErrQuorum) {
					rt.Fatalf("client %d TryLockCtx (%d up): got %v, %v, want an ErrQuorum error", i, up, ok, err)
				}
			default:
				// Contended: (false, nil). A quorum of free nodes with
				// refused ballots is retried at once (above), so this is
				// reached with a free quorum only if the ballots were
				// refused maxBallots+1 times in a row; counted as
				// "busy-but-free".
				if ok || err != nil {
					rt.Fatalf("client %d TryLockCtx (%d up, %d free): got %v, %v, want false, nil", i, up, free, ok, err)
				}
				if free >= quorum {
					res = "busy-but-free"
				}
			}
			step("try/" + res)
		},
		"LockCtx": func(rt *rapid.T) {
			// Short deadline when it must fail (held here, or too few free
			// nodes), a generous one when it must succeed or fail at once.
			i := client.Draw(rt, "client")
			c := clients[i]
			up, free := count()
			wait := 10 * time.Second
			if c.held || (up >= quorum && free < quorum) {
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
				step("lock/held")
			case up < quorum:
				round(i)
				if !errors.Is(err, ErrQuorum) {
					rt.Fatalf("client %d LockCtx with %d nodes up: got %v, want an ErrQuorum error", i, up, err)
				}
				step("lock/quorum")
			case free >= quorum:
				// The first failed round learns every answering counter,
				// so the next proposes above all of them.
				for r := 0; ; r++ {
					res, tok := round(i)
					if res == "ok" {
						if err != nil {
							rt.Fatalf("client %d LockCtx (%d free): %v", i, free, err)
						}
						acquired(rt, i, tok)
						step("lock/ok")
						return
					}
					if r == 3 {
						rt.Fatalf("model: no acquisition after %d rounds", r+1)
					}
				}
			default:
				if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
					rt.Fatalf("client %d LockCtx (%d up, %d free): got %v, want ErrNotObtained and DeadlineExceeded", i, up, free, err)
				}
				// It made as many rounds as fit in the deadline; a round that
				// granted on free nodes released them, but moved counters.
				resync(rt, i)
				step("lock/busy")
			}
		},
		"UnlockCtx": func(rt *rapid.T) {
			i := client.Draw(rt, "client")
			c := clients[i]
			err := c.m.UnlockCtx(ctx)
			if !c.held {
				checkErr(rt, fmt.Sprintf("client %d UnlockCtx without a hold", i), err, ErrNotHeld)
				step("unlock/notheld")
				return
			}
			okN, gone, want := settleWant(i, func(n *quorumNode) { n.key = quorumKey{} })
			if c.lost {
				want = ErrLockLost
			}
			checkErr(rt, fmt.Sprintf("client %d UnlockCtx (%d released, %d gone, lost %v)", i, okN, gone, c.lost), err, want)
			// Down nodes keep the key: stale, until it expires, or until
			// the reaper delivers the release when a partitioned node is
			// back.
			for _, n := range nodes {
				if !n.up && n.partitioned.Load() {
					n.queued[c.value] = true
				}
			}
			c.held, c.lost = false, false
			step("unlock/" + errName(want))
		},
		"ExtendCtx": func(rt *rapid.T) {
			i := client.Draw(rt, "client")
			c := clients[i]
			err := c.m.ExtendCtx(ctx)
			switch {
			case !c.held:
				checkErr(rt, fmt.Sprintf("client %d ExtendCtx without a hold", i), err, ErrNotHeld)
				step("extend/notheld")
				return
			case c.lost:
				checkErr(rt, fmt.Sprintf("client %d ExtendCtx of a lost hold", i), err, ErrLockLost)
				step("extend/lost")
				return
			}
			// Every node that holds our value is extended, whatever the
			// outcome.
			okN, gone, want := settleWant(i, func(n *quorumNode) { n.key.exp = now + expiry })
			checkErr(rt, fmt.Sprintf("client %d ExtendCtx (%d extended, %d gone)", i, okN, gone), err, want)
			if want == ErrLockLost {
				c.lost = true
			}
			step("extend/" + errName(want))
		},
		"advance time": func(rt *rapid.T) {
			d := time.Duration(rapid.IntRange(0, 12000).Draw(rt, "ms")) * time.Millisecond
			now += d
			for _, n := range nodes {
				n.srv.FastForward(d) // down nodes too: a partition, not a stopped clock
				if n.key.value != "" && n.key.exp <= now {
					n.key = quorumKey{}
				}
			}
			step("advance time")
		},
		"node down": func(rt *rapid.T) {
			k, ok := drawNode(rt, true)
			if !ok {
				step("node down/none")
				return
			}
			n := nodes[k]
			if rapid.Bool().Draw(rt, "partition") {
				n.partitioned.Store(true) // first: no new connection from now on
				n.srv.Close()
				step("node down/partition")
			} else {
				n.srv.Close()
				n.gen.Add(1) // after: a connection dialled before is cut
				step("node down/crash")
			}
			n.up = false
		},
		"node up": func(rt *rapid.T) {
			k, ok := drawNode(rt, false)
			if !ok {
				step("node up/none")
				return
			}
			n := nodes[k]
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
				if current(n.key) {
					rt.Fatalf("model: node %d: a release of the current hold of client %d is queued", k, n.key.client)
				}
				stale := v + ":" + strconv.FormatUint(n.key.token, 10)
				deadline := time.Now().Add(5 * time.Second)
				for {
					got, _ := n.srv.Get(lockKey)
					if got != stale {
						break
					}
					if time.Now().After(deadline) {
						rt.Fatalf("node %d: the release of %q queued while it was partitioned was not delivered within 5s", k, stale)
					}
					time.Sleep(time.Millisecond)
				}
				n.key = quorumKey{}
				stats["reaped stale key"]++
			}
			clear(n.queued)
			step("node up")
		},
		"SCRIPT FLUSH": func(rt *rapid.T) {
			k, ok := drawNode(rt, true)
			if !ok {
				step("SCRIPT FLUSH/none")
				return
			}
			conn, err := redis.Dial("tcp", nodes[k].addr)
			if err != nil {
				rt.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Do("SCRIPT", "FLUSH"); err != nil {
				rt.Fatal(err)
			}
			step("SCRIPT FLUSH")
		},
		"delete key behind its back": func(rt *rapid.T) {
			k, ok := drawNode(rt, true)
			if !ok {
				step("delete key/none")
				return
			}
			nodes[k].srv.Del(lockKey)
			nodes[k].key = quorumKey{}
			step("delete key")
		},
		"": func(rt *rapid.T) {
			// Every node's lock key (value, token, TTL) and fence counter,
			// up or down, are the model's.
			for k, n := range nodes {
				got, err := n.srv.Get(lockKey)
				want := ""
				if n.key.value != "" {
					want = n.key.value + ":" + strconv.FormatUint(n.key.token, 10)
				}
				if err != nil {
					got = ""
				}
				if got != want {
					rt.Fatalf("node %d (up %v): lock key %q, model says %q", k, n.up, got, want)
				}
				if want != "" && n.srv.TTL(lockKey) != n.key.exp-now {
					rt.Fatalf("node %d: lock key TTL %v, model says %v", k, n.srv.TTL(lockKey), n.key.exp-now)
				}
				if got := serverCounter(rt, n.srv, fenceKey); got != n.counter {
					rt.Fatalf("node %d: fence counter %d, model says %d", k, got, n.counter)
				}
				if n.key.value != "" && n.key.token > n.counter {
					rt.Fatalf("node %d: key token %d above its fence counter %d", k, n.key.token, n.counter)
				}
			}
			believers := 0
			for i, c := range clients {
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
				for _, n := range nodes {
					if v, err := n.srv.Get(lockKey); err == nil && c.held && v == c.value+":"+strconv.FormatUint(c.token, 10) {
						valid++
					}
				}
				if c.held && !lost && valid >= quorum {
					believers++
				}
			}
			if believers > 1 {
				rt.Fatalf("%d clients hold a quorum of valid keys", believers)
			}
		},
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

// errName names an expected outcome in TestPropertyQuorum's statistics.
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
