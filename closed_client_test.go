package netlock

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"github.com/redis/rueidis"
)

// Tests of a waiter whose client is closed while it waits: its
// call fails with an error matching ErrQuorum, never holding a grant it
// could neither extend nor release, and the release's turn goes on to the
// next waiter at once, not after the expiry.
//
// Two ways lead there. A go-redis client takes its Hub's connection down
// with it, so the release counts nobody for the closed client's waiter and
// grants the next one in its own script. A redigo pool or a rueidis client
// leaves the Hub's connection listening (one dialed outside the pool, a
// dedicated connection), so the release grants the closed client's
// waiter, which finds its client closed and passes the grant on.

// countedBackend returns b counting its calls, with b's ErrorClassifier
// and, if b has it, closable.
func countedBackend(b Backend) (Backend, *countingBackend) {
	c := counting(b)
	f, _ := b.(ErrorClassifier)
	if cl, ok := b.(closable); ok {
		return struct {
			*countingBackend
			ErrorClassifier
			closable
		}{c, f, cl}, c
	}
	return struct {
		*countingBackend
		ErrorClassifier
	}{c, f}, c
}

// closableBackend returns a Backend on a client of its own and the
// function that closes the client, which the test may call before it ends.
func closableBackend(t *testing.T, client, addr string) (Backend, func()) {
	t.Helper()
	switch client {
	case "redigo":
		pool := &redis.Pool{
			MaxIdle: 16,
			DialContext: func(ctx context.Context) (redis.Conn, error) {
				return redis.DialContext(ctx, "tcp", addr)
			},
		}
		t.Cleanup(func() { pool.Close() })
		return NewRedigo(pool), func() { pool.Close() }
	case "rueidis":
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatalf("rueidis.NewClient(%s): %v", addr, err)
		}
		t.Cleanup(c.Close)
		return NewRueidis(c), c.Close
	}
	open := registeredClient(client)
	if open == nil {
		t.Fatalf("unknown client %q", client)
	}
	b, closeClient, err := open(TestClientConfig{Addr: addr})
	if err != nil {
		t.Fatalf("%s client on %s: %v", client, addr, err)
	}
	t.Cleanup(closeClient)
	return b, closeClient
}

// closedWait is one run of the scene every test here plays: a holder
// holds; waiter 1, on a client of its own, waits, and waiter 2 waits behind
// it; waiter 1's client is closed; the holder lets go.
type closedWait struct {
	e        *env
	backend1 Backend // waiter 1's
	queue    string  // the waiters' queue key, where both waiters line up
	channel  string  // waiter 1's release channel
	lock1    func(context.Context) error
	lock2    func(context.Context) error
	// calls1 and calls2 count each waiter's acquire calls: one to join
	// the queue, one once it listens; then it sleeps.
	calls1, calls2 func() int
	unlock         func() error // the holder's
	close1         func()       // closes waiter 1's client
	// attemptFirst: the holder lets go only after waiter 1 has failed,
	// which it does at its next attempt (when the holder's TTL has run
	// out of its wait, or its pub/sub connection closed with the
	// client): it must have left the queue, and its Hub stopped
	// listening, so that the release passes it over.
	attemptFirst bool
}

// closedWaitExpiry is the expiry of every lock here (but with
// attemptFirst, closedAttemptExpiry): waiter 2 must be in long before it.
const (
	closedWaitExpiry    = 8 * time.Second
	closedAttemptExpiry = time.Second
)

// run plays the scene and checks its end: waiter 1 fails with an error
// matching ErrQuorum, and waiter 2 holds well within the expiry.
func (c closedWait) run(t *testing.T) {
	t.Helper()
	expiry := closedWaitExpiry
	if c.attemptFirst {
		expiry = closedAttemptExpiry
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	asleep := func(n int, calls func() int) func() bool {
		return func() bool {
			got, _ := redis.Int(c.e.do(t, "ZCARD", c.queue), nil)
			return got == n && calls() >= 2
		}
	}
	r1, r2 := make(chan error, 1), make(chan error, 1)
	go func() { r1 <- c.lock1(ctx) }()
	eventually(t, 5*time.Second, "waiter 1 queued and asleep", asleep(1, c.calls1))
	go func() { r2 <- c.lock2(ctx) }()
	eventually(t, 5*time.Second, "waiter 2 queued and asleep", asleep(2, c.calls2))

	c.close1()
	if c.attemptFirst {
		select {
		case err := <-r1:
			r1 <- err // checked below
		case <-time.After(3 * expiry):
			t.Fatalf("waiter 1 on the closed client: no return within %v", 3*expiry)
		}
	} else if _, passesOn := c.backend1.(closable); !passesOn {
		// The client's Listener fails with it (go-redis): once the server
		// has seen the connection go, a release counts nobody for
		// waiter 1. One that came sooner would grant it the lock, which
		// would expire.
		eventually(t, 5*time.Second, "waiter 1's listener gone", func() bool {
			v, _ := redis.Values(c.e.do(t, "PUBSUB", "NUMSUB", c.channel), nil)
			n, _ := redis.Int(v[1], nil)
			return n == 0
		})
	}
	start := time.Now()
	if err := c.unlock(); err != nil {
		t.Fatalf("holder's unlock: %v", err)
	}
	select {
	case err := <-r1:
		if !errors.Is(err, ErrQuorum) || errors.Is(err, ErrNotObtained) {
			t.Fatalf("waiter 1 on the closed client: got %v; want an error matching ErrQuorum, not ErrNotObtained", err)
		}
	case <-time.After(expiry / 2):
		t.Fatalf("waiter 1 on the closed client: no return within %v of the release", expiry/2)
	}
	select {
	case err := <-r2:
		if err != nil {
			t.Fatalf("waiter 2: %v", err)
		}
		if took := time.Since(start); took > expiry/2 {
			t.Fatalf("waiter 2 held %v after the release; want well within the expiry %v", took, expiry)
		}
	case <-time.After(expiry / 2):
		t.Fatalf("waiter 2: not holding within %v of the release (expiry %v)", expiry/2, expiry)
	}
}

func TestClosedClientWaiterFails(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const name = "closed"
		holder := e.newMutex(t, name)
		b1, close1 := closableBackend(t, e.client, e.addr)
		b1, c1 := countedBackend(b1)
		b2, c2 := countedBackend(e.backend(t))
		w1, err := New(name, []Backend{b1})
		if err != nil {
			t.Fatal(err)
		}
		w2, err := New(name, []Backend{b2})
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, holder)
		closedWait{
			e: e, backend1: b1, queue: "netlock:{" + name + "}:waiters", channel: w1.waitChan,
			lock1: w1.LockCtx, lock2: w2.LockCtx,
			calls1: func() int { return c1.count(acquireScript.Name()) },
			calls2: func() int { return c2.count(acquireScript.Name()) },
			unlock: func() error { return holder.UnlockCtx(context.Background()) },
			close1: close1,
		}.run(t)
		mustUnlock(t, w2)
	})
}

func TestClosedClientWaiterFailsAtItsAttempt(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) { // the holder's TTL runs out of waiter 1's wait
		const name = "closedattempt"
		opt := WithExpiry(closedAttemptExpiry)
		holder := e.newMutex(t, name, opt)
		b1, close1 := closableBackend(t, e.client, e.addr)
		b1, c1 := countedBackend(b1)
		b2, c2 := countedBackend(e.backend(t))
		w1, err := New(name, []Backend{b1}, opt)
		if err != nil {
			t.Fatal(err)
		}
		w2, err := New(name, []Backend{b2}, opt)
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, holder)
		closedWait{
			e: e, backend1: b1, queue: "netlock:{" + name + "}:waiters", channel: w1.waitChan,
			lock1: w1.LockCtx, lock2: w2.LockCtx,
			calls1: func() int { return c1.count(acquireScript.Name()) },
			calls2: func() int { return c2.count(acquireScript.Name()) },
			unlock: func() error { return holder.UnlockCtx(context.Background()) },
			close1: close1, attemptFirst: true,
		}.run(t)
		mustUnlock(t, w2)
	})
}

// closedLocks makes the holder and the two waiters of a closedWait, each
// by newLock on a Backend of its own: waiter 1's on a client that close1
// closes; c1 and c2 count the waiters' calls.
func closedLocks[L any](t *testing.T, e *env, newLock func(Backend) (L, error)) (holder, w1, w2 L, b1 Backend, c1, c2 *countingBackend, close1 func()) {
	t.Helper()
	mk := func(b Backend) L {
		l, err := newLock(b)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	holder = mk(e.backend(t))
	b1, close1 = closableBackend(t, e.client, e.addr)
	b1, c1 = countedBackend(b1)
	b2, c2 := countedBackend(e.backend(t))
	return holder, mk(b1), mk(b2), b1, c1, c2, close1
}

func TestClosedClientRWWaiterFails(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const name = "closedrw"
		holder, w1, w2, b1, c1, c2, close1 := closedLocks(t, e, func(b Backend) (*NetRWMutex, error) {
			return NewRW(name, []Backend{b})
		})
		if err := holder.LockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		closedWait{
			e: e, backend1: b1, queue: "netlock:{" + name + "}:rw:writers", channel: w1.w.waitChan,
			lock1: w1.LockCtx, lock2: w2.LockCtx,
			calls1: func() int { return c1.count(rwAcquireScript.Name()) },
			calls2: func() int { return c2.count(rwAcquireScript.Name()) },
			unlock: func() error { return holder.UnlockCtx(context.Background()) },
			close1: close1,
		}.run(t)
		if err := w2.UnlockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestClosedProbeSendsNothing: asking an open client whether it is closed,
// as a waiter does at every grant by message, sends no command (rueidis;
// redigo with an idle connection in the pool).
func TestClosedProbeSendsNothing(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		c, ok := e.backend(t).(closable)
		if !ok {
			t.Skipf("%s: its Listener fails with its client; nothing to ask", e.client)
		}
		ctx := context.Background()
		if _, err := c.(Backend).Eval(ctx, probeScript, nil, nil); err != nil {
			t.Fatal(err) // a connection dialed, and idle
		}
		before := callsPerCommand(t, e)
		for range 100 {
			if err := c.closed(ctx); err != nil {
				t.Fatalf("closed on an open client: %v", err)
			}
		}
		if after := callsPerCommand(t, e); !maps.Equal(before, after) {
			t.Fatalf("commands run by 100 probes: got %v, then %v; want none", before, after)
		}
	})
}

// probeScript is a script that does nothing: a call that leaves a
// connection idle in a pool.
var probeScript = newScript("probe", "return {1}")

// callsPerCommand returns the server's count of calls per command, from INFO
// commandstats, but for INFO itself and PING (rueidis pings idle
// connections).
func callsPerCommand(t *testing.T, e *env) map[string]string {
	t.Helper()
	info, err := redis.String(e.do(t, "INFO", "commandstats"), nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]string{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || name == "info" || name == "ping" {
			continue
		}
		calls[name], _, _ = strings.Cut(rest, ",")
	}
	return calls
}

// BenchmarkClosedProbe measures what a waiter granted the lock by message
// pays to ask an open client whether it is closed.
//
//	go test -run '^$' -bench ClosedProbe -benchmem .
func BenchmarkClosedProbe(b *testing.B) {
	for _, client := range testClients() {
		b.Run(client, func(b *testing.B) {
			c, ok := newBackend(b, client, miniredis.RunT(b).Addr()).(closable)
			if !ok {
				b.Skip("not closable")
			}
			ctx := context.Background()
			if _, err := c.(Backend).Eval(ctx, probeScript, nil, nil); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := c.closed(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestClosedClientSemWaiterFails: a Semaphore's waiter on a redigo pool or
// rueidis client (listening on a dedicated connection) closed while it
// waits fails with an error matching ErrQuorum, and the permits a release
// granted it go on to the next waiter. (Where its Listener closes with its
// client, go-redis and rueidis on RESP3, the waiter fails as the Listener
// does; a release's grant to it, which nobody hears, waits for its place
// to lapse: a Semaphore's release does not count its waiters' listeners.)
func TestClosedClientSemWaiterFails(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) { closedSemWait(t, e, "closedsem", false) })
}

// TestClosedClientSemWaiterFailsAtItsAttempt: the waiter on the closed
// client fails at its next attempt (when the holder's lease would end),
// leaving its place over a connection that outlives the client, before the
// holder's release.
func TestClosedClientSemWaiterFailsAtItsAttempt(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) { closedSemWait(t, e, "closedsemattempt", true) })
}

// closedSemWait plays closedWait with Semaphores of one permit.
func closedSemWait(t *testing.T, e *env, name string, attemptFirst bool) {
	t.Helper()
	if !listenerOutlivesClient(e.backend(t)) {
		t.Skipf("%s: its Listener fails with its client, and a release's grant to the waiter waits for its place to lapse", e.client)
	}
	opt := WithExpiry(closedWaitExpiry)
	if attemptFirst {
		opt = WithExpiry(closedAttemptExpiry)
	}
	holder, w1, w2, b1, c1, c2, close1 := closedLocks(t, e, func(b Backend) (*Semaphore, error) {
		return NewSemaphore(name, 1, []Backend{b}, opt)
	})
	if err := holder.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	closedWait{
		e: e, backend1: b1, queue: "netlock:{" + name + "}:sem:queue", channel: w1.m.waitChan,
		lock1:  func(ctx context.Context) error { return w1.Acquire(ctx, 1) },
		lock2:  func(ctx context.Context) error { return w2.Acquire(ctx, 1) },
		calls1: func() int { return c1.count(semAcquireScript.Name()) },
		calls2: func() int { return c2.count(semAcquireScript.Name()) },
		unlock: func() error { return holder.ReleaseCtx(context.Background(), 1) },
		close1: close1, attemptFirst: attemptFirst,
	}.run(t)
	if err := w2.ReleaseCtx(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
}

// listenerOutlivesClient reports whether b's Listener outlives the Close of
// b's client (see closable): a redigo pool's; a rueidis client's where it
// listens on a dedicated connection (not on RESP3, see pushable).
func listenerOutlivesClient(b Backend) bool {
	switch b := b.(type) {
	case *rueidisBackend:
		return !pushable(context.Background(), b.client, &b.push)
	case closable:
		return true
	}
	return false
}
