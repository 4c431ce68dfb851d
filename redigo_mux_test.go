package netlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// echoScript replies with its argument, so that a test can tell whose reply
// a caller got.
var echoScript = newScript("echo", "return {tonumber(ARGV[1])}")

// muxBackend returns a redigo Backend on addr, and the Backend itself.
func muxBackend(t *testing.T, addr string) (Backend, *redigoBackend) {
	t.Helper()
	b := newBackend(t, "redigo", addr)
	return b, b.(*redigoBackend)
}

// echo calls echoScript with n on b, bounded by timeout.
func echo(b Backend, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	reply, err := b.Eval(ctx, echoScript, []string{"k"}, []string{fmt.Sprint(n)})
	if err != nil {
		return err
	}
	if len(reply) != 1 || reply[0] != int64(n) {
		return fmt.Errorf("echo %d: got reply %v, someone else's", n, reply)
	}
	return nil
}

// concurrentEchoes runs goroutines × calls echoes at once on b and returns
// the first error.
func concurrentEchoes(b Backend, goroutines, calls int, timeout time.Duration) error {
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				if err := echo(b, g*calls+i, timeout); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// TestRedigoMux: calls made while others are in flight are pipelined on the
// Backend's own connection, and each caller gets its own reply, the script
// loaded on first use (NOSCRIPT: EVAL on a connection of the pool) and
// again after SCRIPT FLUSH.
func TestRedigoMux(t *testing.T) {
	server := redistest.Start(t)
	b, rb := muxBackend(t, server.Addr())
	if err := concurrentEchoes(b, 32, 200, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rb.mux.mu.Lock()
	dialed := rb.mux.cur != nil
	rb.mux.mu.Unlock()
	if !dialed {
		t.Fatal("32 goroutines calling at once: the pipeline's connection was never dialed")
	}
	if _, err := server.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := concurrentEchoes(b, 32, 20, 5*time.Second); err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
}

// TestRedigoMuxStalled: with the server stalled, pipelined calls fail by
// their own deadlines, nothing hangs, and once the server is back the
// pipeline dials a new connection.
func TestRedigoMuxStalled(t *testing.T) {
	server := redistest.Start(t)
	b, rb := muxBackend(t, server.Addr())
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatal(err) // warm up: script loaded, pipeline dialed
	}
	server.Pause()
	resumed := false
	defer func() {
		if !resumed {
			server.Resume()
		}
	}()

	// A call alone takes a connection of the pool; the next two are
	// pipelined, the first with a long deadline, then one with a short.
	var wg sync.WaitGroup
	long := make(chan error, 2)
	for i := range 2 {
		wg.Go(func() { long <- echo(b, i, time.Second) })
		eventually(t, 10*time.Second, fmt.Sprintf("%d calls in flight", i+1), func() bool { return rb.inFlight.Load() == int32(i+1) })
	}
	start := time.Now()
	err := echo(b, 2, 100*time.Millisecond)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 600*time.Millisecond {
		t.Errorf("a call with a deadline of 100ms behind one of 1s, server stalled: %v after %v; want DeadlineExceeded by its own deadline", err, took)
	}
	redistest.Within(t, 3*time.Second, "the calls of 1s with the server stalled", wg.Wait)
	close(long)
	for err := range long {
		if err == nil {
			t.Error("a call succeeded with the server stalled")
		}
	}

	server.Resume()
	resumed = true
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatalf("after the server came back: %v", err)
	}
}

// TestRedigoMuxConnectionKilled: the server closes the pipeline's
// connection while calls wait on it: they fail with the connection's
// error, not by a timeout, and the next calls succeed on a new one.
func TestRedigoMuxConnectionKilled(t *testing.T) {
	server := redistest.Start(t)
	pool := &redis.Pool{
		MaxIdle: 16,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", server.Addr())
		},
		// The kill closes the pool's idle connections too: a PING finds
		// them closed before a call would.
		TestOnBorrow: func(c redis.Conn, _ time.Time) error {
			_, err := c.Do("PING")
			return err
		},
	}
	t.Cleanup(func() { pool.Close() })
	b := NewRedigo(pool)
	rb := b.(*redigoBackend)
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// A script that keeps the server busy for 1.5s holds the replies of
	// the calls sent behind it; CLIENT KILL, sent on a connection of its
	// own, runs after it, before them. The window is long enough for the
	// four calls to be seen in flight on a loaded machine (300ms was not,
	// under -race beside other packages' tests).
	busy := newScript("busy", "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "+
		"repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] > s + 1500000 return {1}")
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		b.Eval(c, busy, []string{"k"}, nil) // alone: a connection of the pool
	})
	eventually(t, 10*time.Second, "the call alone in flight", func() bool { return rb.inFlight.Load() == 1 })
	// In flight is not yet running: its call may still be on its way (the
	// pool's PING, NOSCRIPT and EVAL), and calls sent now could be answered
	// before it. The server is busy when a PING of a connection of our own
	// gets no answer.
	eventually(t, 10*time.Second, "the server busy with the script", func() bool {
		c, err := redis.Dial("tcp", server.Addr())
		if err != nil {
			return false
		}
		defer c.Close()
		_, err = redis.DoWithTimeout(c, 100*time.Millisecond, "PING")
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	})
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			start := time.Now()
			err := echo(b, i, 8*time.Second)
			if err != nil && time.Since(start) > 5*time.Second {
				err = fmt.Errorf("failed only after %v: %w", time.Since(start), err)
			}
			errs <- err
		})
	}
	eventually(t, 10*time.Second, "5 calls in flight", func() bool { return rb.inFlight.Load() == 5 })
	kill, err := redis.Dial("tcp", server.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	// The pipeline's connection is the one whose last command is EVALSHA
	// and that is not the busy script's (cmd=evalsha too): kill every
	// normal client but this one; the busy script's reply is lost with
	// its connection, which is fine here.
	if _, err := kill.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
		t.Fatal(err)
	}
	redistest.Within(t, 5*time.Second, "the calls on the killed connection", wg.Wait)
	close(errs)
	for err := range errs {
		if err == nil {
			continue // sent before the kill and answered: fine
		}
		if strings.Contains(err.Error(), "failed only after") {
			t.Error(err)
		}
	}
	// A connection the server closed while no call waited on it is found
	// closed by the next call sent on it (as an idle one of a pool without
	// TestOnBorrow): that call fails; the next ones go on a new one.
	err = concurrentEchoes(b, 8, 50, 5*time.Second)
	for try := 1; err != nil && try < 3; try++ {
		t.Logf("after the kill, try %d: %v", try, err)
		err = concurrentEchoes(b, 8, 50, 5*time.Second)
	}
	if err != nil {
		t.Fatalf("after the kill, try 3: %v", err)
	}
}

// TestRedigoMuxIdleClose: the pipeline's connection is closed once unused
// for muxIdle, also after calls kept it busy past muxIdle (the idle timer
// then fires while a reply is being read).
func TestRedigoMuxIdleClose(t *testing.T) {
	server := redistest.Start(t)
	b, rb := muxBackend(t, server.Addr())
	idle := func() bool {
		rb.mux.mu.Lock()
		defer rb.mux.mu.Unlock()
		return rb.mux.cur == nil
	}
	for busy := time.Now().Add(muxIdle * 3 / 2); time.Now().Before(busy); {
		if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if idle() {
		t.Fatal("the pipeline's connection was never dialed, or closed while in use")
	}
	time.Sleep(muxIdle / 2) // unused for that long: the point of the test
	if idle() {
		t.Fatalf("the pipeline's connection closed after %v unused, before muxIdle (%v)", muxIdle/2, muxIdle)
	}
	eventually(t, 10*time.Second, "the pipeline's connection closed once unused for muxIdle", idle)
}

// TestRedigoMuxTestOnBorrow: the pool's TestOnBorrow is asked about the
// pipeline's connection as about an idle one of the pool: a connection it
// refuses (here: dialed before a restart) is closed unused, and no call
// fails on it.
func TestRedigoMuxTestOnBorrow(t *testing.T) {
	server := redistest.Start(t)
	var gen atomic.Int64
	var conns sync.Map // redis.Conn → the generation it was dialed in
	pool := &redis.Pool{
		MaxIdle: 16,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			g := gen.Load()
			c, err := redis.DialContext(ctx, "tcp", server.Addr())
			if err == nil {
				conns.Store(c, g)
			}
			return c, err
		},
		TestOnBorrow: func(c redis.Conn, _ time.Time) error {
			if g, _ := conns.Load(c); g != gen.Load() {
				return errors.New("dialed before a restart")
			}
			return nil
		},
	}
	t.Cleanup(func() { pool.Close() })
	b := NewRedigo(pool)
	rb := b.(*redigoBackend)
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	rb.mux.mu.Lock()
	before := rb.mux.cur
	rb.mux.mu.Unlock()
	if before == nil {
		t.Fatal("the pipeline's connection was never dialed")
	}
	gen.Add(1)
	server.Restart()
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatalf("after a restart, with TestOnBorrow refusing the connections dialed before: %v", err)
	}
	rb.mux.mu.Lock()
	after := rb.mux.cur
	rb.mux.mu.Unlock()
	if after == before {
		t.Error("the pipeline still sends on the connection dialed before the restart")
	}
}

// TestMuxShortDeadlineSparesOthers: on a Backend shared by callers with
// deadlines of 200µs and callers with none of their own (bounded by the
// node timeout), a server slowed by another client's commands fails only
// the short calls: every lock and unlock of the others succeeds.
func TestMuxShortDeadlineSparesOthers(t *testing.T) {
	server := redistest.Start(t, "--enable-debug-command", "yes")
	b := newBackend(t, "redigo", server.Addr())
	mutex := func(name string) *NetMutex {
		m, err := New(name, []Backend{b})
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		return m
	}
	short, others := mutex("short"), []*NetMutex{mutex("b"), mutex("c")}

	slow, err := redis.Dial("tcp", server.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()

	const run = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var wg sync.WaitGroup
	// Another client keeps the server slow: each DEBUG SLEEP holds the
	// replies to every other client for 5ms.
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := slow.Do("DEBUG", "SLEEP", "0.005"); err != nil {
				t.Errorf("DEBUG SLEEP: %v", err)
				return
			}
		}
	})
	wg.Go(func() {
		for ctx.Err() == nil {
			c, cancel := context.WithTimeout(ctx, 200*time.Microsecond)
			if ok, _ := short.TryLockCtx(c); ok {
				short.UnlockCtx(ctx)
			}
			cancel()
		}
	})
	var calls, failed atomic.Int64
	failures := make(chan error, 8)
	fail := func(err error) {
		failed.Add(1)
		select {
		case failures <- err:
		default:
		}
	}
	for _, m := range others {
		wg.Go(func() {
			for ctx.Err() == nil {
				calls.Add(1)
				ok, err := m.TryLockCtx(context.Background())
				if !ok {
					fail(fmt.Errorf("TryLockCtx(%q): got %v, %v; want true, nil", m.Name(), ok, err))
					continue
				}
				calls.Add(1)
				if err := m.UnlockCtx(context.Background()); err != nil {
					fail(fmt.Errorf("UnlockCtx(%q): %v", m.Name(), err))
				}
			}
		})
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Log(err)
	}
	t.Logf("%d calls of b and c", calls.Load())
	if n := failed.Load(); n != 0 {
		t.Errorf("got %d failed calls of %d, want 0", n, calls.Load())
	}
}

// TestMuxCallReturnsAtOwnDeadline: with the server stalled, each pipelined
// call returns its context's error at its own deadline, neither before (at
// an earlier deadline of another call) nor long after (at a later one),
// the call whose deadline is the latest included; then the connection is
// closed.
func TestMuxCallReturnsAtOwnDeadline(t *testing.T) {
	server := redistest.Start(t)
	b, rb := muxBackend(t, server.Addr())
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatal(err) // warm up: script loaded, pipeline dialed
	}
	server.Pause()
	resumed := false
	defer func() {
		if !resumed {
			server.Resume()
		}
	}()

	// The first call, alone, takes a connection of the pool; the others
	// are pipelined: one of 600ms, one of 300ms ending before it, and one
	// of 900ms ending after it, the latest.
	type result struct {
		timeout time.Duration
		late    time.Duration // after its deadline
		err     error
	}
	timeouts := []time.Duration{time.Second, 600 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond}
	results := make([]result, len(timeouts))
	var wg sync.WaitGroup
	for i, timeout := range timeouts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			dl, _ := ctx.Deadline()
			_, err := b.Eval(ctx, echoScript, []string{"k"}, []string{fmt.Sprint(i)})
			results[i] = result{timeout, time.Since(dl), err}
		})
		eventually(t, 10*time.Second, fmt.Sprintf("%d calls in flight", i+1), func() bool { return rb.inFlight.Load() == int32(i+1) })
	}
	redistest.Within(t, 5*time.Second, "the calls with the server stalled", wg.Wait)
	for i, r := range results[1:] {
		t.Logf("pipelined call %d of %v: %v after its deadline", i+1, r.timeout, r.late)
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("pipelined call %d of %v, server stalled: got %v, want DeadlineExceeded", i+1, r.timeout, r.err)
		}
		// Measured: a few ms at most; the bound is for a loaded machine.
		if r.late < 0 || r.late > 150*time.Millisecond {
			t.Errorf("pipelined call %d of %v returned %v after its deadline, want 0 to 150ms", i+1, r.timeout, r.late)
		}
	}
	eventually(t, 5*time.Second, "the stalled pipeline's connection closed", func() bool {
		rb.mux.mu.Lock()
		defer rb.mux.mu.Unlock()
		return rb.mux.cur == nil
	})

	server.Resume()
	resumed = true
	if err := concurrentEchoes(b, 8, 50, 5*time.Second); err != nil {
		t.Fatalf("after the server came back: %v", err)
	}
}
