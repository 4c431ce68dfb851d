package netlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Waiting costs Redis (almost) nothing: 40 clients, each with a client of
// its own as 40 processes would have, wait behind a holder with the default
// options, and netlock makes each Redis server run at most one command per
// waiter-second, counting the holder's extends and the commands inside
// scripts; the client library's own commands (keepalive PINGs, topology)
// are reported apart. On one server with each client library, a quorum of
// three, and a three-master Redis Cluster with each cluster client (whose
// waiters are woken by sharded messages). The window is longer than the
// expiry, so that every waiter's look at the holder's TTL (the only thing a
// waiter does while it waits) falls inside it.
func TestWaitingCost(t *testing.T) {
	const (
		waiters = 40
		window  = DefaultExpiry + 2*time.Second
	)
	type row struct {
		name    string
		servers func(t *testing.T) []*redistest.Server
		backend func(t *testing.T, servers []*redistest.Server) []Backend
	}
	var rows []row
	for _, client := range testClients() {
		rows = append(rows, row{client, startOne, func(t *testing.T, s []*redistest.Server) []Backend {
			return []Backend{newBackend(t, client, s[0].Addr())}
		}})
	}
	rows = append(rows, row{"redigo/quorum3", func(t *testing.T) []*redistest.Server { return startServers(t, 3) }, func(t *testing.T, s []*redistest.Server) []Backend {
		return []Backend{newBackend(t, "redigo", s[0].Addr()), newBackend(t, "redigo", s[1].Addr()), newBackend(t, "redigo", s[2].Addr())}
	}})
	for _, client := range clusterKinds() {
		rows = append(rows, row{client + "/cluster3", func(t *testing.T) []*redistest.Server {
			c := redistest.StartCluster(t, 3)
			t.Cleanup(func() { waitRueidisDelayedCloses(t) })
			return c.Servers()
		}, func(t *testing.T, s []*redistest.Server) []Backend {
			addrs := make([]string, len(s))
			for i := range s {
				addrs[i] = s[i].Addr()
			}
			if client == "rueidis" {
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				return []Backend{NewRueidis(c)}
			}
			return []Backend{openRegistered(t, client, TestClientConfig{Cluster: addrs})}
		}})
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			servers := c.servers(t)
			mutex := func() *NetMutex {
				m, err := New("cost", c.backend(t, servers))
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			holder := mutex()
			mustLock(t, holder)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			errs := make(chan error, waiters)
			var locked atomic.Int64
			for range waiters {
				m := mutex()
				wg.Go(func() {
					if err := m.LockCtx(ctx); err == nil {
						locked.Add(1)
						m.UnlockCtx(context.Background())
					} else if !errors.Is(err, context.Canceled) {
						errs <- err
					}
				})
			}
			eventually(t, 10*time.Second, "all waiters queued", func() bool {
				n := 0
				for _, s := range servers {
					if v, err := s.Do("ZCARD", holder.keys.waiters); err == nil {
						k, _ := strconv.Atoi(v)
						n = max(n, k)
					}
				}
				return n == waiters
			})
			total0, lib0 := commandCounts(t, servers)
			time.Sleep(window) // the window the commands are counted over
			total1, lib1 := commandCounts(t, servers)
			lib := lib1 - lib0
			ran := total1 - total0 - int64(len(servers)) - lib
			perServer := float64(ran) / float64(len(servers))
			if len(holder.nodes) == 1 && len(servers) > 1 {
				perServer = float64(ran) // a Cluster: one lock lives on one of its nodes
			}
			per := perServer / waiters / window.Seconds()
			redistest.Report(t, "%d waiters for %v on %d servers: %d commands of netlock's, %.2f per waiter-second and server (of the lock); the client library's own: %d, %.2f per waiter-second",
				waiters, window, len(servers), ran, per, lib, float64(lib)/waiters/window.Seconds())
			if per > 1 {
				t.Errorf("waiting cost: got %.2f commands per waiter-second, want at most 1", per)
			}
			// Every waiter still gets its turn when the holder leaves, in
			// order, for as long as the test lets them; then the rest give up.
			mustUnlock(t, holder)
			eventually(t, 10*time.Second, "waiters locking in turn", func() bool { return locked.Load() >= waiters/2 })
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("LockCtx: %v", err)
			}
			for _, s := range servers {
				if v, err := s.Do("EXISTS", holder.keys.waiters); err == nil && v != "0" {
					t.Errorf("waiters' queue on %s after every waiter left: still there", s.Addr())
				}
			}
		})
	}
}

func startOne(t *testing.T) []*redistest.Server { return []*redistest.Server{redistest.Start(t)} }

// A waiter that died while queued (its connections gone, as when its
// process is killed) costs the next waiter nothing: the release skips it
// and names the next waiter, who locks at once, long before its own look at
// the holder's TTL.
func TestDeadWaiterSkipped(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		opts := []Option{WithExpiry(30 * time.Second)}
		holder := e.newMutex(t, "dead", opts...)
		mustLock(t, holder)
		for i := range 3 {
			// A waiter whose every connection goes through a proxy that
			// then closes: to Redis it is gone, like a killed process.
			p := redistest.StartProxy(t, e.addr)
			dead, err := New("dead", []Backend{newBackend(t, e.client, p.Addr())}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- dead.LockCtx(ctx) }()
			eventually(t, 5*time.Second, "the dead waiter queued", func() bool {
				n, _ := redis.Int(e.do(t, "ZCARD", holder.keys.waiters), nil)
				return n == i+1
			})
			p.Close()
			t.Cleanup(func() {
				cancel()
				<-done
			})
		}
		live, cb := waitingMutex(t, e, "dead")
		locked := lockInBackground(t, live, cb)
		eventually(t, 5*time.Second, "the live waiter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", holder.keys.waiters), nil)
			return n == 4
		})
		start := time.Now()
		mustUnlock(t, holder)
		redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		t.Logf("locked %v after the release, behind 3 dead waiters", time.Since(start))
		if n := cb.count("acquire"); n != 2 {
			t.Errorf("attempts of the live waiter: got %d, want 2 (the failed first, the one queueing it; the release granted it the lock)", n)
		}
		if q, _ := redis.Strings(e.do(t, "ZRANGE", holder.keys.waiters, 0, -1), nil); len(q) != 0 {
			t.Errorf("waiters' queue: got %v, want the dead waiters skipped and gone", q)
		}
		mustUnlock(t, live)
	})
}

// A waiter whose queue entry is lost (the queue key evicted, deleted, or
// expired) while the holder holds joins the queue again with its next look
// at the holder's TTL, and then gets its turn by message.
func TestWaiterRejoinsLostQueue(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 600 * time.Millisecond
		holder := e.newMutex(t, "lostq", WithExpiry(expiry))
		waiter, cb := waitingMutex(t, e, "lostq")
		mustLock(t, holder)
		locked := lockInBackground(t, waiter, cb)
		e.do(t, "DEL", holder.keys.waiters)
		eventually(t, 5*time.Second, "the waiter back in the queue", func() bool {
			q, _ := redis.Strings(e.do(t, "ZRANGE", holder.keys.waiters, 0, -1), nil)
			return len(q) == 1 && strings.HasPrefix(q[0], waiter.waiterID)
		})
		n := cb.count("acquire")
		mustUnlock(t, holder)
		redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		// Granted the lock by the release (no attempt), or woken by it (one).
		if got := cb.count("acquire") - n; got > 1 {
			t.Errorf("attempts after the release: got %d, want at most 1 (its turn by message)", got)
		}
		mustUnlock(t, waiter)
	})
}

// A waiter that gives up as its turn comes passes the turn on: the next
// waiter is woken, not left to wait for the holder's TTL (30s here).
// Whether the release or the cancellation reaches the quitter first, the
// next waiter locks promptly; TestScripts checks the script's part of it
// (leave.lua after a release named the waiter) exactly.
func TestCancelledWaiterPassesTurn(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		opts := []Option{WithExpiry(30 * time.Second)}
		holder := e.newMutex(t, "pass", opts...)
		mustLock(t, holder)
		quitter := e.newMutex(t, "pass", opts...)
		next, cb := waitingMutex(t, e, "pass")
		ctx, cancel := context.WithCancel(context.Background())
		quit := make(chan error, 1)
		go func() { quit <- quitter.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the quitter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", holder.keys.waiters), nil)
			return n == 1
		})
		locked := lockInBackground(t, next, cb)
		// The release names the quitter; it is cancelled before it can
		// attempt: the hub's message and the cancellation race, and either
		// way the next waiter must lock promptly.
		cancel()
		mustUnlock(t, holder)
		if err := <-quit; err == nil {
			quitter.UnlockCtx(context.Background())
		}
		redistest.Within(t, 5*time.Second, "the next waiter's LockCtx", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		mustUnlock(t, next)
	})
}

// A restart of Redis (stop, 300ms down, start on the same port) while
// goroutines wait in Lock and LockCtx costs them nothing: they ride it out
// and lock when the server is back, one after the other.
func TestWaitersRideOutRestart(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "restart", WithNodeTimeout(200*time.Millisecond))
		mustLock(t, holder)
		const n = 3
		results := make(chan error, 2*n)
		var wg sync.WaitGroup
		for i := range 2 * n {
			m := e.newMutex(t, "restart", WithNodeTimeout(200*time.Millisecond))
			wg.Go(func() {
				if i%2 == 0 {
					results <- recoverErr(func() { m.Lock() })
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					defer cancel()
					results <- m.LockCtx(ctx)
				}
				m.UnlockCtx(context.Background())
			})
		}
		eventually(t, 5*time.Second, "the waiters queued", func() bool {
			q, _ := redis.Int(e.do(t, "ZCARD", holder.keys.waiters), nil)
			return q == 2*n
		})
		// Down for 300ms and more (the stop, the pause, the start), as a
		// restart of a real deployment.
		e.server.Stop()
		time.Sleep(300 * time.Millisecond) // the outage's length
		e.server.Restart()
		// The holder's key is gone with the restart (no persistence): its
		// hold is lost, and the waiters take turns.
		redistest.Within(t, 20*time.Second, "every waiter locking", wg.Wait)
		close(results)
		for err := range results {
			if err != nil {
				t.Errorf("a waiter across the restart: got %v, want it locked", err)
			}
		}
		holder.UnlockCtx(context.Background())
	})
}

// A Redis that stays down is reported once the outage window has passed:
// LockCtx returns an error matching ErrQuorum naming the node's last error,
// Lock panics with it, TryLockCtx fails at once; a ctx that ends first gets
// its own error joined with the node's.
func TestRedisDownForGood(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const window, nodeTimeout = 500 * time.Millisecond, 100 * time.Millisecond
		m := e.newMutex(t, "gone", WithNodeTimeout(nodeTimeout), WithOutageWindow(window))
		mustLock(t, m)
		mustUnlock(t, m)
		e.server.Kill()
		start := time.Now()
		err := lockWithin(t, m)
		elapsed := time.Since(start)
		wantNodeErr(t, "LockCtx with the server down", err, "")
		if elapsed < window {
			t.Errorf("LockCtx returned after %v, within the outage window %v: it did not ride it out", elapsed, window)
		}
		if perr := recoverErr(m.Lock); !errors.Is(perr, ErrQuorum) {
			t.Errorf("Lock with the server down: got panic %v, want one matching ErrQuorum", perr)
		}
		redistest.Within(t, time.Second, "TryLockCtx", func() {
			if ok, err := m.TryLockCtx(context.Background()); ok || !errors.Is(err, ErrQuorum) {
				t.Errorf("TryLockCtx with the server down: got %v, %v; want false and ErrQuorum", ok, err)
			}
		})
		// Longer than a node timeout, so that the node has answered with an
		// error before ctx ends: a client may learn of the outage only when
		// a call times out (go-redis retries a refused dial until then),
		// where another learns of it at once (connection refused).
		ctx, cancel := context.WithTimeout(context.Background(), 3*nodeTimeout)
		defer cancel()
		err = m.LockCtx(ctx)
		// An outage, not a lock held elsewhere: not ErrNotObtained.
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNotObtained) || !errors.Is(err, ErrQuorum) {
			t.Errorf("LockCtx whose ctx ends during the outage: got %v, want DeadlineExceeded and ErrQuorum, not ErrNotObtained", err)
		}
	})
}

// A majority of a quorum down is reported as ErrQuorum after the window.
func TestQuorumDownForGood(t *testing.T) {
	servers := startServers(t, 3)
	m := quorumMutex(t, "rueidis", servers, "qgone", WithNodeTimeout(100*time.Millisecond), WithOutageWindow(300*time.Millisecond))
	mustLock(t, m)
	mustUnlock(t, m)
	servers[0].Kill()
	servers[2].Kill()
	var err error
	redistest.Within(t, 5*time.Second, "LockCtx with a majority down", func() { err = m.LockCtx(context.Background()) })
	if !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "node 0") || !strings.Contains(err.Error(), "node 2") {
		t.Errorf("LockCtx with a majority down: got %v, want ErrQuorum naming nodes 0 and 2", err)
	}
}

// An answer that retrying cannot change is reported at once, not ridden
// out: a key of another type.
func TestPermanentErrorNotRiddenOut(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m := e.newMutex(t, "perm", WithOutageWindow(time.Hour))
		e.do(t, "HSET", m.keys.lock, "f", "v")
		redistest.Within(t, 5*time.Second, "LockCtx on a hash", func() {
			err := m.LockCtx(context.Background())
			if !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Errorf("LockCtx on a hash: got %v, want ErrQuorum with WRONGTYPE", err)
			}
		})
	})
}

func TestTransientReply(t *testing.T) {
	for _, c := range []struct {
		op   scriptOp
		msg  string
		want bool
	}{
		{opAcquire, "LOADING Redis is loading the dataset in memory", true},
		{opAcquire, "BUSY Redis is busy running a script", true},
		{opAcquire, "READONLY You can't write against a read only replica.", true},
		{opAcquire, "ERR max number of clients reached", true},
		// A WAIT whose master became a replica (CLUSTER FAILOVER): seen in
		// TestClusterFailover/syncReplicas, where the waiter gave up.
		{opAcquire, "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)", true},
		{opAcquire, "WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{opAcquire, "NOPERM this user has no permissions to run the 'evalsha' command", false},
		{opAcquire, "ERR unknown command", false},
		{opRelease, "MISCONF Errors writing to the AOF file", true},
		{opExtend, "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", true},
		{opAcquire, "NOREPLICAS Not enough good replicas to write.", true},
		// A release frees memory; an acquire takes it.
		{opRelease, "OOM command not allowed when used memory > 'maxmemory'.", true},
		{opAcquire, "OOM command not allowed when used memory > 'maxmemory'.", false},
		// A release or a leave refused by an ACL is sent again: the ACL
		// may be fixed while the hold's expiry lasts.
		{opRelease, "NOPERM netlock: this user may not publish on netlock:{a}:rw:joined", true},
		{opRelease, "NOPERM this user has no permissions to run the 'evalsha' command", true},
	} {
		if got := transientReply(c.op, c.msg); got != c.want {
			t.Errorf("transientReply(%v, %q): got %v, want %v", c.op, c.msg, got, c.want)
		}
	}
}

// ExampleWithOutageWindow is in example_test.go; this checks the option's
// validation.
func TestOutageWindowOption(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want time.Duration
		bad  bool
	}{
		{nil, DefaultExpiry, false},
		{[]Option{WithExpiry(time.Second)}, time.Second, false},
		{[]Option{WithOutageWindow(0)}, 0, false},
		{[]Option{WithOutageWindow(time.Minute)}, time.Minute, false},
		{[]Option{WithOutageWindow(-time.Second)}, 0, true},
	} {
		cfg, err := newConfig(c.opts)
		switch {
		case c.bad && (err == nil || !strings.Contains(err.Error(), "outage window")):
			t.Errorf("%d options: got %v, want an error naming the outage window", len(c.opts), err)
		case !c.bad && err != nil:
			t.Errorf("%d options: %v", len(c.opts), err)
		case !c.bad && cfg.outage != c.want:
			t.Errorf("%d options: outage window %v, want %v", len(c.opts), cfg.outage, c.want)
		}
	}
}

// A waiter granted the lock long after its last look at the holder's TTL
// (here 60% of the expiry) gets a hold that is valid and stays held: its
// local deadline counts from that look, once, and the watchdog extends it.
func TestGrantAfterLongWait(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry = 500 * time.Millisecond
		opts := []Option{WithExpiry(expiry), WithNodeTimeout(100 * time.Millisecond)}
		holder := e.newMutex(t, "longwait", opts...)
		waiter := e.newMutex(t, "longwait", opts...)
		mustLock(t, holder)
		locked := make(chan error, 1)
		go func() { locked <- waiter.LockCtx(context.Background()) }()
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", holder.keys.waiters), nil)
			return n == 1
		})
		time.Sleep(expiry * 3 / 5) // the long wait, on the real clock: the point of the test
		mustUnlock(t, holder)
		if err := <-locked; err != nil {
			t.Fatalf("LockCtx: %v", err)
		}
		if until, held := waiter.current().deadline(); !held || time.Until(until) <= 0 {
			t.Fatalf("hold after a long wait: held %v, %v left; want held, with time left", held, time.Until(until))
		}
		time.Sleep(2 * expiry) // the watchdog must keep it
		select {
		case <-waiter.Lost():
			t.Fatalf("hold after a long wait lost within two expiries")
		default:
		}
		mustUnlock(t, waiter)
	})
}
