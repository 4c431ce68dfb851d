package goredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

// newClient returns a go-redis client on addr, as the package advises
// (ContextTimeoutEnabled), closed when the test ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newMutex returns a NetMutex for name over backends.
func newMutex(t testing.TB, name string, backends []netlock.Backend, opts ...netlock.Option) *netlock.NetMutex {
	t.Helper()
	m, err := netlock.New(name, backends, opts...)
	if err != nil {
		t.Fatalf("netlock.New(%q): %v", name, err)
	}
	return m
}

// call is one Eval that netlock made.
type call struct {
	script     *netlock.Script
	keys, args []string
}

// counting wraps a Backend, counting its Evals by script and keeping the
// last of each. It forwards Hub and Final, so that netlock uses the wrapped
// Backend's wake-ups and error classes.
type counting struct {
	netlock.Backend

	mu    sync.Mutex
	calls map[string]int
	last  map[string]call
}

func newCounting(b netlock.Backend) *counting {
	return &counting{Backend: b, calls: map[string]int{}, last: map[string]call{}}
}

func (c *counting) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	c.mu.Lock()
	c.calls[s.Name()]++
	c.last[s.Name()] = call{s, keys, args}
	c.mu.Unlock()
	return c.Backend.Eval(ctx, s, keys, args)
}

func (c *counting) Hub() *netlock.Hub { return c.Backend.(netlock.Subscriber).Hub() }

func (c *counting) Final(err error) bool { return c.Backend.(netlock.ErrorClassifier).Final(err) }

func (c *counting) count(script string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[script]
}

// scripts returns an acquire and a release as netlock calls them, for lock
// name, taken from a lock and unlock through a counting Backend on
// miniredis. netlock's scripts are not otherwise within reach of a test
// outside package netlock.
func scripts(t *testing.T, name string) (acquire, release call) {
	t.Helper()
	c := newCounting(New(newClient(t, miniredis.RunT(t).Addr())))
	m := newMutex(t, name, []netlock.Backend{c})
	mustLock(t, m)
	mustUnlock(t, m)
	return c.last["acquire"], c.last["release"]
}

func mustLock(t testing.TB, m *netlock.NetMutex) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.LockCtx(ctx); err != nil {
		t.Fatalf("LockCtx(%s): %v", m.Name(), err)
	}
}

func mustUnlock(t testing.TB, m *netlock.NetMutex) {
	t.Helper()
	if err := m.UnlockCtx(context.Background()); err != nil {
		t.Fatalf("UnlockCtx(%s): %v", m.Name(), err)
	}
}

// eventually fails the test unless cond holds within d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// sdo runs a command on s and fails the test on error.
func sdo(t testing.TB, s *redistest.Server, args ...string) string {
	t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return v
}

// commandCalls returns the calls of each command since the server started
// (INFO commandstats), by name: "evalsha", "client|kill".
func commandCalls(t testing.TB, s *redistest.Server) map[string]int64 {
	t.Helper()
	calls := map[string]int64{}
	for line := range strings.SplitSeq(sdo(t, s, "INFO", "commandstats"), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(rest, ":calls=")
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		calls[name] = v
	}
	return calls
}

// waiters returns the length of the waiters' queue of lock name.
func waiters(t testing.TB, s *redistest.Server, name string) int {
	t.Helper()
	n, _ := strconv.Atoi(sdo(t, s, "ZCARD", "netlock:{"+name+"}:waiters"))
	return n
}

// releaseChannels returns the subscribed release channels of lock name.
func releaseChannels(t testing.TB, s *redistest.Server, name string) string {
	t.Helper()
	return sdo(t, s, "PUBSUB", "CHANNELS", "netlock:{"+name+"}:released*")
}

func TestNewNil(t *testing.T) {
	for _, c := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		if b := New(c); b != nil {
			t.Errorf("New(%#v): got %v, want nil", c, b)
		}
		if _, err := netlock.New("n", []netlock.Backend{New(c)}); err == nil || !strings.Contains(err.Error(), "nil") {
			t.Errorf("netlock.New with New(%#v): got %v, want an error naming the nil backend", c, err)
		}
	}
}

// Eval runs a script by EVALSHA; once the server has lost its scripts
// (SCRIPT FLUSH), it answers NOSCRIPT and Eval runs it by EVAL, once: the
// script is then cached again.
func TestEvalFallsBackToEval(t *testing.T) {
	acquire, release := scripts(t, "eval")
	s := redistest.Start(t)
	b := New(newClient(t, s.Addr()))
	ctx := context.Background()
	for i, want := range []struct{ evalsha, eval int64 }{
		{1, 1}, // a fresh server has no script
		{1, 0},
		{1, 1}, // flushed
	} {
		if i == 2 {
			sdo(t, s, "SCRIPT", "FLUSH")
		}
		before := commandCalls(t, s)
		reply, err := b.Eval(ctx, acquire.script, acquire.keys, acquire.args)
		if err != nil || len(reply) == 0 {
			t.Fatalf("call %d: Eval(acquire): got %v, %v; want a reply", i, reply, err)
		}
		after := commandCalls(t, s)
		if got, want := [2]int64{after["evalsha"] - before["evalsha"], after["eval"] - before["eval"]}, [2]int64{want.evalsha, want.eval}; got != want {
			t.Errorf("call %d: EVALSHA and EVAL run: got %v, want %v", i, got, want)
		}
		if _, err := b.Eval(ctx, release.script, release.keys, release.args); err != nil {
			t.Fatalf("call %d: Eval(release): %v", i, err)
		}
	}
	// Through netlock, a flush never shows.
	m := newMutex(t, "eval", []netlock.Backend{b})
	for range 2 {
		sdo(t, s, "SCRIPT", "FLUSH")
		mustLock(t, m)
		sdo(t, s, "SCRIPT", "FLUSH")
		if err := m.ExtendCtx(ctx); err != nil {
			t.Fatalf("ExtendCtx after SCRIPT FLUSH: %v", err)
		}
		sdo(t, s, "SCRIPT", "FLUSH")
		mustUnlock(t, m)
	}
}

// Eval returns when its context ends, whether or not the client applies
// the deadline to the socket (ContextTimeoutEnabled): here the server is
// stopped (SIGSTOP) and the client's ReadTimeout is 30s.
func TestEvalEndsWithContext(t *testing.T) {
	acquire, _ := scripts(t, "ctx")
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", bounded), func(t *testing.T) {
			s := redistest.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 30 * time.Second, ContextTimeoutEnabled: bounded})
			t.Cleanup(func() { rdb.Close() })
			b := New(rdb)
			if b.(*backend).bounded != bounded {
				t.Fatalf("bounded: got %v, want %v", b.(*backend).bounded, bounded)
			}
			ctx := context.Background()
			if err := rdb.Ping(ctx).Err(); err != nil { // a connection in the pool
				t.Fatal(err)
			}

			done, cancel := context.WithCancel(ctx)
			cancel()
			before := commandCalls(t, s)
			if _, err := b.Eval(done, acquire.script, acquire.keys, acquire.args); !errors.Is(err, context.Canceled) {
				t.Errorf("Eval with a done context: got %v, want context.Canceled", err)
			}
			if after := commandCalls(t, s); after["evalsha"] != before["evalsha"] {
				t.Errorf("Eval with a done context sent EVALSHA")
			}

			s.Pause()
			// Resumed before the server is stopped at cleanup, so that a
			// command left running by Eval ends with its reply.
			t.Cleanup(s.Resume)
			ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			var err error
			redistest.Within(t, 5*time.Second, "Eval on a stopped server", func() { _, err = b.Eval(ctx, acquire.script, acquire.keys, acquire.args) })
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Eval on a stopped server: got %v, want context.DeadlineExceeded", err)
			}
			if b.(netlock.ErrorClassifier).Final(err) {
				t.Errorf("Final(%v): got true, want false (the command may be in flight)", err)
			}
		})
	}
}

// Final tells the errors after which nothing of the call is in flight: an
// error reply of the server and a closed client; not a timeout or a
// connection lost.
func TestFinal(t *testing.T) {
	acquire, _ := scripts(t, "final")
	s := redistest.Start(t)
	ctx := context.Background()
	b := New(newClient(t, s.Addr()))
	final := b.(netlock.ErrorClassifier).Final

	sdo(t, s, "HSET", acquire.keys[0], "f", "v")
	_, err := b.Eval(ctx, acquire.script, acquire.keys, acquire.args)
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !final(err) {
		t.Errorf("Eval on a hash: got %v, Final %v; want WRONGTYPE, final", err, err != nil && final(err))
	}
	sdo(t, s, "DEL", acquire.keys[0])

	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	closed := New(rdb)
	rdb.Close()
	_, err = closed.Eval(ctx, acquire.script, acquire.keys, acquire.args)
	if !errors.Is(err, redis.ErrClosed) || !final(err) {
		t.Errorf("Eval on a closed client: got %v, Final %v; want redis.ErrClosed, final", err, err != nil && final(err))
	}

	killed := New(newClient(t, s.Addr()))
	if _, err := killed.Eval(ctx, acquire.script, acquire.keys, acquire.args); err != nil {
		t.Fatal(err)
	}
	ctx1, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// The pooled connection is lost, and go-redis's new dials are refused
	// (netlock takes a refusal for final by itself).
	s.Kill()
	_, err = killed.Eval(ctx1, acquire.script, acquire.keys, acquire.args)
	if err == nil || final(err) {
		t.Errorf("Eval with the server gone: got %v, Final %v; want an error, not final", err, err != nil && final(err))
	}
	for _, err := range []error{context.Canceled, context.DeadlineExceeded, errors.New("i/o timeout")} {
		if final(err) {
			t.Errorf("Final(%v): got true, want false", err)
		}
	}
}

// A Ring is refused: its Backend's every Eval fails, at once, with an error
// that says why, and LockCtx reports it at once instead of riding it out.
func TestRingRefused(t *testing.T) {
	acquire, _ := scripts(t, "ring")
	mini := miniredis.RunT(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": mini.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { ring.Close() })
	b := New(ring)
	if h := b.(netlock.Subscriber).Hub(); h != nil {
		t.Errorf("Hub of a Ring's Backend: got %p, want nil", h)
	}
	_, err := b.Eval(context.Background(), acquire.script, acquire.keys, acquire.args)
	if err == nil || !strings.Contains(err.Error(), "*redis.Ring") || !b.(netlock.ErrorClassifier).Final(err) {
		t.Errorf("Eval on a Ring: got %v; want a final error naming *redis.Ring", err)
	}
	m := newMutex(t, "ring", []netlock.Backend{b}, netlock.WithOutageWindow(time.Hour))
	redistest.Within(t, 5*time.Second, "LockCtx on a Ring", func() { err = m.LockCtx(context.Background()) })
	if !errors.Is(err, netlock.ErrQuorum) || !strings.Contains(err.Error(), "*redis.Ring") {
		t.Errorf("LockCtx on a Ring: got %v, want ErrQuorum naming *redis.Ring", err)
	}
	if keys := mini.Keys(); len(keys) != 0 {
		t.Errorf("keys on the Ring's server: got %q, want none", keys)
	}
}

// The Listener passes messages on and confirms subscriptions in order, and
// reports the failure of its connection instead of letting go-redis replace
// it unseen.
func TestListener(t *testing.T) {
	s := redistest.Start(t)
	rdb := newClient(t, s.Addr())
	b := New(rdb).(*backend)
	ctx := context.Background()

	type message struct{ channel, payload string }
	open := func(t *testing.T) (*listener, <-chan message, <-chan string, <-chan error) {
		messages := make(chan message, 16)
		l, err := b.listen(ctx, func(channel, payload string) { messages <- message{channel, payload} })
		if err != nil {
			t.Fatal(err)
		}
		confirmed, failed := make(chan string, 16), make(chan error, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				ch, err := l.Confirmed()
				if err != nil {
					failed <- err
					return
				}
				confirmed <- ch
			}
		}()
		t.Cleanup(func() {
			l.Close()
			<-done
		})
		return l.(*listener), messages, confirmed, failed
	}
	wantConfirmed := func(t *testing.T, confirmed <-chan string, want string) {
		t.Helper()
		select {
		case ch := <-confirmed:
			if ch != want {
				t.Fatalf("Confirmed: got %q, want %q", ch, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no confirmation of %q within 5s", want)
		}
	}
	wantFailed := func(t *testing.T, failed <-chan error, what string) error {
		t.Helper()
		select {
		case err := <-failed:
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: Confirmed returned no error within 5s", what)
			return nil
		}
	}

	t.Run("messages", func(t *testing.T) {
		l, messages, confirmed, _ := open(t)
		for _, ch := range []string{"a", "b", "a"} {
			if err := l.Subscribe(ctx, ch); err != nil {
				t.Fatal(err)
			}
		}
		for _, ch := range []string{"a", "b", "a"} {
			wantConfirmed(t, confirmed, ch)
		}
		sdo(t, s, "PUBLISH", "b", "hello")
		if m := <-messages; m != (message{"b", "hello"}) {
			t.Errorf("message: got %v, want b hello", m)
		}
		if err := l.Unsubscribe(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if err := l.Subscribe(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		wantConfirmed(t, confirmed, "c") // the UNSUBSCRIBE's confirmation is dropped
		if n := sdo(t, s, "PUBLISH", "b", "gone"); n != "0" {
			t.Errorf("PUBLISH to an unsubscribed channel reached %s subscribers, want 0", n)
		}
	})

	t.Run("connection killed", func(t *testing.T) {
		l, _, confirmed, failed := open(t)
		if err := l.Subscribe(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		wantConfirmed(t, confirmed, "k")
		sdo(t, s, "CLIENT", "KILL", "TYPE", "pubsub")
		if err := wantFailed(t, failed, "connection killed"); errors.Is(err, errClosed) {
			t.Errorf("Confirmed after CLIENT KILL: got %v, want the connection's error", err)
		}
		// go-redis has dialed a replacement and subscribed it to "k"; the
		// Hub closes the listener on the error, and the replacement with it.
		l.Close()
		eventually(t, 5*time.Second, "no pub/sub connection left", func() bool {
			return sdo(t, s, "CLIENT", "LIST", "TYPE", "pubsub") == ""
		})
	})

	t.Run("replaced connection", func(t *testing.T) {
		l, _, confirmed, failed := open(t)
		if err := l.Subscribe(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		wantConfirmed(t, confirmed, "r")
		// What go-redis sends on a connection it made to replace another:
		// SUBSCRIBE for every channel, confirmed or not.
		if err := l.ps.Subscribe(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if err := wantFailed(t, failed, "a confirmation not asked for"); !errors.Is(err, errReplaced) {
			t.Errorf("Confirmed after a confirmation not asked for: got %v, want errReplaced", err)
		}
	})

	t.Run("closed before subscribing", func(t *testing.T) {
		l, _, _, failed := open(t)
		l.Close()
		l.Close() // idempotent
		if err := wantFailed(t, failed, "closed"); !errors.Is(err, errClosed) {
			t.Errorf("Confirmed on a listener closed before its first SUBSCRIBE: got %v, want errClosed", err)
		}
		if err := l.Subscribe(ctx, "x"); err == nil {
			t.Errorf("Subscribe on a closed listener: got nil, want an error")
		}
	})
}

// Waiting costs Redis (almost) nothing: 8 waiters, each a process with a
// client of its own, wait behind a holder with the default options, and the
// server runs at most one command per waiter-second, counting the holder's
// extends and the commands inside scripts (go-redis's own commands are
// reported apart). The window is longer than the expiry, so that every
// waiter's look at the holder's TTL (the only thing a waiter does while it
// waits) falls inside it. Their turns come by message, in order of
// arrival, as soon as the holder unlocks.
func TestWaitingCost(t *testing.T) {
	t.Parallel()
	const (
		name    = "cost"
		n       = 8
		window  = netlock.DefaultExpiry + 2*time.Second
		library = "ping hello client|setinfo client|setname"
	)
	s := redistest.Start(t)
	mutex := func() *netlock.NetMutex {
		return newMutex(t, name, []netlock.Backend{New(newClient(t, s.Addr()))})
	}
	holder := mutex()
	mustLock(t, holder)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var order []int
	for i := range n {
		m := mutex()
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := m.LockCtx(ctx); err != nil {
				t.Errorf("waiter %d: LockCtx: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := m.UnlockCtx(context.Background()); err != nil {
				t.Errorf("waiter %d: UnlockCtx: %v", i, err)
			}
		})
		// One at a time, so that the order of arrival is known.
		eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return waiters(t, s, name) == i+1 })
	}
	before := commandCalls(t, s)
	time.Sleep(window)
	after := commandCalls(t, s)
	var ran, own int64
	for cmd, calls := range after {
		d := calls - before[cmd]
		switch {
		case cmd == "info":
		case strings.Contains(" "+library+" ", " "+cmd+" "):
			own += d
		default:
			ran += d
		}
	}
	per := float64(ran) / n / window.Seconds()
	redistest.Report(t, "%d waiters for %v: %d commands of netlock's, %.2f per waiter-second; go-redis's own: %d", n, window, ran, per, own)
	if per > 1 {
		t.Errorf("waiting cost: got %.2f commands per waiter-second, want at most 1", per)
	}
	mustUnlock(t, holder)
	redistest.Within(t, 20*time.Second, "every waiter locking in turn", wg.Wait)
	for i := range order {
		if order[i] != i {
			t.Errorf("turns: got %v, want the order of arrival", order)
			break
		}
	}
}

// A waiter whose pub/sub connection is killed (CLIENT KILL TYPE pubsub)
// hears of it from netlock/goredis at once: it looks at the lock again and
// subscribes on a new connection, and the next release still wakes it.
// Its expiry (30s) and retry delay (10s) are so long that only the news of
// the failure explains the attempt, and only a message the prompt lock.
func TestWaiterSurvivesPubSubKill(t *testing.T) {
	const name = "killed"
	s := redistest.Start(t)
	opts := []netlock.Option{netlock.WithExpiry(30 * time.Second), netlock.WithRetryDelay(10*time.Second, 10*time.Second)}
	holder := newMutex(t, name, []netlock.Backend{New(newClient(t, s.Addr()))}, opts...)
	c := newCounting(New(newClient(t, s.Addr())))
	waiter := newMutex(t, name, []netlock.Backend{c}, opts...)
	mustLock(t, holder)
	locked := make(chan error, 1)
	go func() { locked <- waiter.LockCtx(context.Background()) }()
	eventually(t, 5*time.Second, "the waiter queued and subscribed", func() bool {
		return waiters(t, s, name) == 1 && releaseChannels(t, s, name) != ""
	})
	attempts := c.count("acquire")
	sdo(t, s, "CLIENT", "KILL", "TYPE", "pubsub")
	eventually(t, 5*time.Second, "the waiter's attempt after the kill", func() bool { return c.count("acquire") > attempts })
	eventually(t, 5*time.Second, "the waiter subscribed again", func() bool { return releaseChannels(t, s, name) != "" })
	mustUnlock(t, holder)
	redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
		if err := <-locked; err != nil {
			t.Errorf("LockCtx: %v", err)
		}
	})
	mustUnlock(t, waiter)
}

// On a three-master Redis Cluster through a *redis.ClusterClient: locks of
// many names spread over the nodes, each script on one node (no CROSSSLOT),
// clients of their own exclude each other with strictly increasing tokens,
// and a waiter gets its turn, and the lock, by a sharded message (SPUBLISH),
// no PUBLISH running on any node.
func TestCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	newBackend := func(t *testing.T) netlock.Backend {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return New(c)
	}
	ctx := context.Background()

	t.Run("ManyNames", func(t *testing.T) {
		b := newBackend(t)
		owners := map[string]int{}
		for i := range 30 {
			name := fmt.Sprintf("many-%d", i)
			m := newMutex(t, name, []netlock.Backend{b})
			mustLock(t, m)
			if m.Token() == 0 {
				t.Errorf("%s: token 0 with fencing on", name)
			}
			if err := m.ExtendCtx(ctx); err != nil {
				t.Fatalf("%s: ExtendCtx: %v", name, err)
			}
			for _, s := range cluster.Servers() {
				if v, err := s.Do("EXISTS", "netlock:{"+name+"}"); err == nil && v == "1" {
					owners[s.Addr()]++
				}
			}
			mustUnlock(t, m)
		}
		if len(owners) != len(cluster.Addrs()) {
			t.Errorf("names spread over %d nodes, want all %d: %v", len(owners), len(cluster.Addrs()), owners)
		}
	})

	t.Run("MutualExclusion", func(t *testing.T) {
		const clients, rounds = 4, 10
		var inside atomic.Int32
		var mu sync.Mutex
		var tokens []uint64
		var wg sync.WaitGroup
		for i := range clients {
			m := newMutex(t, "excluded", []netlock.Backend{newBackend(t)})
			wg.Go(func() {
				for r := range rounds {
					ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
					err := m.LockCtx(ctx)
					cancel()
					if err != nil {
						t.Errorf("client %d, round %d: LockCtx: %v", i, r, err)
						return
					}
					if inside.Add(1) != 1 {
						t.Errorf("client %d, round %d: another client inside", i, r)
					}
					mu.Lock()
					tokens = append(tokens, m.Token())
					mu.Unlock()
					time.Sleep(200 * time.Microsecond)
					inside.Add(-1)
					if err := m.UnlockCtx(context.Background()); err != nil {
						t.Errorf("client %d, round %d: UnlockCtx: %v", i, r, err)
						return
					}
				}
			})
		}
		redistest.Within(t, 60*time.Second, "4 clients x 10 rounds", wg.Wait)
		if len(tokens) != clients*rounds {
			t.Fatalf("critical sections: got %d, want %d", len(tokens), clients*rounds)
		}
		for j := 1; j < len(tokens); j++ {
			if tokens[j] <= tokens[j-1] {
				t.Errorf("token %d granted after %d", tokens[j], tokens[j-1])
			}
		}
	})

	t.Run("WaiterWokenByMessage", func(t *testing.T) {
		opts := []netlock.Option{netlock.WithExpiry(30 * time.Second), netlock.WithRetryDelay(10*time.Second, 10*time.Second)}
		holder := newMutex(t, "woken", []netlock.Backend{newBackend(t)}, opts...)
		c := newCounting(newBackend(t))
		waiter := newMutex(t, "woken", []netlock.Backend{c}, opts...)
		mustLock(t, holder)
		locked := make(chan error, 1)
		go func() { locked <- waiter.LockCtx(context.Background()) }()
		eventually(t, 10*time.Second, "the waiter queued", func() bool {
			for _, s := range cluster.Servers() {
				if v, err := s.Do("ZCARD", "netlock:{woken}:waiters"); err == nil && v == "1" {
					return true
				}
			}
			return false
		})
		attempts := c.count("acquire")
		mustUnlock(t, holder)
		redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
			if err := <-locked; err != nil {
				t.Errorf("LockCtx: %v", err)
			}
		})
		// With sharded pub/sub SPUBLISH counts the waiter's subscription,
		// on the master the release runs on, so the release grants it the
		// lock (see netlock.HubConfig.Shard): no attempt.
		if got := c.count("acquire") - attempts; got != 0 {
			t.Errorf("attempts after the release: got %d, want 0", got)
		}
		mustUnlock(t, waiter)
		var published, spublished int64
		for _, s := range cluster.Servers() {
			calls := commandCalls(t, s)
			published += calls["publish"]
			spublished += calls["spublish"]
		}
		if published != 0 || spublished == 0 {
			t.Errorf("commands run on the cluster: PUBLISH %d, SPUBLISH %d; want none, some", published, spublished)
		}
	})
}

// A failover client (redis.NewFailoverClient) finds the primary through
// Sentinel, and netlock locks and waits by message on it. (That a failover
// is ridden out is the Sentinel tests' business, not this smoke test's.)
func TestFailoverClient(t *testing.T) {
	primary := redistest.Start(t)
	sentinel := startSentinel(t, "netlock", primary)
	newBackend := func() netlock.Backend {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "netlock", SentinelAddrs: []string{sentinel}, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return New(c)
	}
	opts := []netlock.Option{netlock.WithExpiry(30 * time.Second), netlock.WithRetryDelay(10*time.Second, 10*time.Second)}
	holder := newMutex(t, "failover", []netlock.Backend{newBackend()}, opts...)
	waiter := newMutex(t, "failover", []netlock.Backend{newBackend()}, opts...)
	mustLock(t, holder)
	if sdo(t, primary, "EXISTS", "netlock:{failover}") != "1" {
		t.Fatal("lock key not on the primary")
	}
	locked := make(chan error, 1)
	go func() { locked <- waiter.LockCtx(context.Background()) }()
	eventually(t, 5*time.Second, "the waiter queued and subscribed", func() bool {
		return waiters(t, primary, "failover") == 1 && releaseChannels(t, primary, "failover") != ""
	})
	mustUnlock(t, holder)
	redistest.Within(t, 5*time.Second, "LockCtx after the release", func() {
		if err := <-locked; err != nil {
			t.Errorf("LockCtx: %v", err)
		}
	})
	mustUnlock(t, waiter)
}

// startSentinel starts a Redis Sentinel (redis-server --sentinel) on a free
// loopback port, monitoring primary as master, and returns its address. It
// is killed when the test ends.
func startSentinel(t *testing.T, master string, primary *redistest.Server) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		redistest.Require(t) // skips, or fails under NETLOCK_REQUIRE_REDIS=1
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	host, primaryPort, _ := net.SplitHostPort(primary.Addr())
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it: it must be writable
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\n", port, dir, master, host, primaryPort)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own copy
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile // *os.File: no copying goroutines
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sentinel: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := sc.GetMasterAddrByName(context.Background(), master).Result()
		if err == nil && net.JoinHostPort(got[0], got[1]) == primary.Addr() {
			return addr
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel on %s: master %q not %s within 10s (last: %v, %v); log:\n%s", addr, master, primary.Addr(), got, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WithSyncReplicas on a *redis.ClusterClient: the script and WAIT run on
// the node of the lock's slot. With masters that have no replica, an
// acquire of names in every node's slots fails as not replicated (a script
// sent to another node would fail with MOVED instead), and nothing is left
// held.
//
// The scripts are first loaded on every node by a lock without
// WithSyncReplicas: a node's first EVALSHA gets NOSCRIPT only after the
// WAIT sent with it has waited out its timeout for no write, and the EVAL
// that follows has the rest of the node timeout, less than WAIT's 100ms
// granularity may need (see WaitTimeout).
func TestClusterSyncReplicas(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	b := New(c)
	ctx := context.Background()
	for i := range 6 {
		m, err := netlock.New(fmt.Sprintf("sync-%d", i), []netlock.Backend{b})
		if err != nil {
			t.Fatal(err)
		}
		if !m.TryLock() {
			t.Fatalf("%s: TryLock without WithSyncReplicas failed", m.Name())
		}
		m.Unlock()
	}
	for i := range 6 {
		name := fmt.Sprintf("sync-%d", i)
		m, err := netlock.New(name, []netlock.Backend{b}, netlock.WithSyncReplicas(1),
			netlock.WithNodeTimeout(time.Second)) // WAIT 750ms: room for a loaded machine to read its reply
		if err != nil {
			t.Fatal(err)
		}
		ok, err := m.TryLockCtx(ctx)
		if ok || !errors.Is(err, netlock.ErrNotReplicated) || !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Fatalf("TryLockCtx(%s) on masters without replicas: got %v, %v; want ErrNotReplicated, 0 of 1", name, ok, err)
		}
		if n, err := c.Exists(ctx, netlock.DefaultPrefix+"{"+name+"}").Result(); n != 0 || err != nil {
			t.Errorf("%s: EXISTS of the lock key after the failed acquire: %d, %v; want 0", name, n, err)
		}
	}
}
