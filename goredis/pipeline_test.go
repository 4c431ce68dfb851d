package goredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/internal/redistest"
)

var (
	// echoScript returns its argument, so that each caller can tell its
	// own reply.
	echoScript = netlock.NewScript("echo", "return {tonumber(ARGV[1])}")
	// slowScript keeps the server busy for about ARGV[1] ms, so that the
	// calls that come meanwhile queue for a pipeline.
	slowScript = netlock.NewScript("slow", `
local t = redis.call('TIME')
local from = t[1] * 1000 + math.floor(t[2] / 1000)
while true do
  t = redis.call('TIME')
  if t[1] * 1000 + math.floor(t[2] / 1000) - from >= tonumber(ARGV[1]) then
    return {1}
  end
end`)
)

// slowCall starts a call of slowScript on b that keeps the server s busy
// for d, and returns once it is in flight and running (a PING of another
// client gets no answer): the calls made until it returns go to b's
// pipeline, and wait behind it.
func slowCall(t *testing.T, s *redistest.Server, b *backend, d time.Duration) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := b.Eval(ctx, slowScript, []string{"slow"}, []string{strconv.FormatInt(d.Milliseconds(), 10)})
		done <- err
	}()
	eventually(t, time.Second, "the slow call in flight", func() bool {
		b.pipe.mu.Lock()
		defer b.pipe.mu.Unlock()
		return b.pipe.inFlight == 1
	})
	probe := newClient(t, s.Addr())
	eventually(t, time.Second, "the server running the slow script", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	})
	return done
}

// TestPipelineRepliesToEachCaller: calls made while another is in flight go
// in one pipeline, each caller gets its own reply, and scripts the server
// does not have (NOSCRIPT) are sent again with their source.
func TestPipelineRepliesToEachCaller(t *testing.T) {
	s := redistest.Start(t)
	b := New(newClient(t, s.Addr())).(*backend)
	sdo(t, s, "SCRIPT", "LOAD", slowScript.Source()) // echoScript is not loaded
	before := commandCalls(t, s)
	slow := slowCall(t, s, b, 300*time.Millisecond)
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := b.Eval(ctx, echoScript, []string{"echo"}, []string{strconv.Itoa(i)})
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %w", i, err)
			case len(reply) != 1 || reply[0] != int64(i):
				errs <- fmt.Errorf("call %d: got reply %v, want [%d]", i, reply, i)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-slow; err != nil {
		t.Fatalf("the slow call: %v", err)
	}
	after := commandCalls(t, s)
	// The echo calls queued behind the slow one and went in pipelines as
	// they arrived: the first one's EVALSHA answered NOSCRIPT, and each
	// call of that pipeline ran EVAL; not one connection each, which
	// would have taken up to the pool's 20.
	if got := after["eval"] - before["eval"]; got < 1 || got > n {
		t.Errorf("EVALs run: got %d, want 1 to %d (the calls of the pipeline that met NOSCRIPT)", got, n)
	}
	if got := after["evalsha"] - before["evalsha"]; got != n+1 {
		t.Errorf("EVALSHAs run: got %d, want %d (one per call)", got, n+1)
	}
	if conns := clientConns(t, s); conns > 3 {
		t.Errorf("the client has %d connections open; want at most 3 (the slow call's and the pipelines')", conns)
	}
}

// TestPipelineCallerLeaves: a queued call whose context ends returns at
// once with its context's error; the others of its pipeline get their
// replies.
func TestPipelineCallerLeaves(t *testing.T) {
	s := redistest.Start(t)
	b := New(newClient(t, s.Addr())).(*backend)
	slow := slowCall(t, s, b, 500*time.Millisecond)

	stay := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reply, err := b.Eval(ctx, echoScript, []string{"echo"}, []string{"7"})
		if err == nil && (len(reply) != 1 || reply[0] != 7) {
			err = fmt.Errorf("got reply %v, want [7]", reply)
		}
		stay <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Eval(ctx, echoScript, []string{"echo"}, []string{"8"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a queued call whose context ended: got %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 300*time.Millisecond {
		t.Errorf("it returned after %v, not when its context ended (50ms)", took)
	}
	if err := <-stay; err != nil {
		t.Errorf("the call that stayed: %v", err)
	}
	if err := <-slow; err != nil {
		t.Errorf("the slow call: %v", err)
	}
}

// TestPipelineLocks: 64 goroutines lock and unlock keys of their own through
// one Backend; every lock excludes (a counter per key checked under it),
// and the calls take a few connections, not one each.
func TestPipelineLocks(t *testing.T) {
	s := redistest.Start(t)
	b := New(newClient(t, s.Addr()))
	const goroutines, rounds = 64, 30
	var wg sync.WaitGroup
	var inside [16]atomic.Int32 // holders of each name now
	errs := make(chan error, goroutines)
	for g := range goroutines {
		m := newMutex(t, fmt.Sprintf("pipe-%d", g%16), []netlock.Backend{b})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for range rounds {
				if err := m.LockCtx(ctx); err != nil {
					errs <- err
					return
				}
				if n := inside[g%16].Add(1); n != 1 {
					errs <- fmt.Errorf("%s: %d holders at once", m.Name(), n)
				}
				inside[g%16].Add(-1)
				if err := m.UnlockCtx(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if conns := clientConns(t, s); conns > 6 {
		t.Errorf("the client has %d connections open after 64 goroutines locked; want a few (pipelined), not one each", conns)
	}
}

// clientConns returns the connections open to the server (INFO clients),
// besides the one that asks.
func clientConns(t *testing.T, s *redistest.Server) int {
	t.Helper()
	for line := range strings.SplitSeq(sdo(t, s, "INFO", "clients"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO clients: %q", line)
			}
			return n - 1
		}
	}
	t.Fatal("INFO clients has no connected_clients")
	return 0
}

// TestPipelineNoScript: a pipeline whose EVALSHAs the server answers
// NOSCRIPT sends those calls again with their source, in one more
// pipeline, and each caller gets its own reply.
func TestPipelineNoScript(t *testing.T) {
	s := redistest.Start(t)
	b := New(newClient(t, s.Addr())).(*backend)
	sdo(t, s, "SCRIPT", "FLUSH")
	before := commandCalls(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const n = 5
	calls := make([]*pipedCall, n)
	for i := range calls {
		calls[i] = &pipedCall{ctx: ctx, s: echoScript, keys: []string{"echo"}, args: []string{strconv.Itoa(i)}, done: make(chan pipedReply, 1)}
	}
	b.pipe.sendAll(calls)
	for i, c := range calls {
		r := <-c.done
		if r.err != nil || len(r.reply) != 1 || r.reply[0] != int64(i) {
			t.Errorf("call %d: got %v, %v; want [%d]", i, r.reply, r.err, i)
		}
	}
	after := commandCalls(t, s)
	if got := [2]int64{after["evalsha"] - before["evalsha"], after["eval"] - before["eval"]}; got != [2]int64{n, n} {
		t.Errorf("EVALSHAs and EVALs run: got %v, want [%d %d]", got, n, n)
	}
}

// TestPipelineServerDown: the calls of a pipeline to a server that is gone
// (its address refuses connections) each get an error, not an empty reply,
// and so does a script run with WAIT (EvalWait's pipeline).
func TestPipelineServerDown(t *testing.T) {
	s := redistest.Start(t)
	addr := s.Addr()
	s.Kill()
	b := New(newClient(t, addr)).(*backend)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls := make([]*pipedCall, 3)
	for i := range calls {
		calls[i] = &pipedCall{ctx: ctx, s: echoScript, keys: []string{"echo"}, args: []string{strconv.Itoa(i)}, done: make(chan pipedReply, 1)}
	}
	b.pipe.sendAll(calls)
	for i, c := range calls {
		if r := <-c.done; r.err == nil {
			t.Errorf("call %d of a pipeline to a server that is gone: got reply %v and no error", i, r.reply)
		}
	}
	reply, acked, err := b.EvalWait(ctx, echoScript, []string{"echo"}, []string{"1"}, 1)
	if err == nil {
		t.Errorf("EvalWait on a server that is gone: got reply %v, %d acknowledged, and no error", reply, acked)
	}
}
