package netlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
)

// Tests of a Semaphore's waiters across processes: the order in which they
// get in, and what a waiter that gives up leaves behind (nothing). The
// basic cases (FIFO, a cancelled head, batches) are in semaphore_test.go.

// Waiters get in in order of arrival across processes, a process's second
// waiter included: when its first waiter gets in, the second takes its
// place in Redis at once, so a later waiter of another process that fits
// does not pass it.
func TestSemaphoreSecondLocalWaiterKeepsOrder(t *testing.T) {
	srv := miniredis.RunT(t)
	h, _ := newFaultSem(t, srv, "order", 2)
	p, pb := newFaultSem(t, srv, "order", 2)
	q, _ := newFaultSem(t, srv, "order", 2)
	if !h.TryAcquire(2) {
		t.Fatal("TryAcquire(2): false")
	}
	ctx := context.Background()
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(ctx, 1) }()
	eventually(t, 10*time.Second, "one process queued in Redis", func() bool { return semQueued(t, srv, "order") == 1 })
	go func() { bDone <- p.Acquire(ctx, 2) }()
	eventually(t, 10*time.Second, "p's second waiter queued in its process", func() bool { p.m.mu.Lock(); defer p.m.mu.Unlock(); return len(p.line()) == 2 })
	p.m.mu.Lock()
	pb.slow.Store(p.line()[1].arrival) // B's own attempts are slow
	p.m.mu.Unlock()
	time.Sleep(time.Millisecond) // arrivals are the clock's µs: the next waiter's comes later
	go func() { cDone <- q.Acquire(ctx, 1) }()
	eventually(t, 10*time.Second, "two processes queued in Redis", func() bool { return semQueued(t, srv, "order") == 2 })
	h.Release(2)
	select {
	case err := <-aDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first waiter was not let in")
	}
	select {
	case err := <-cDone:
		t.Fatalf("a later waiter of another process got in (%v) while an earlier one of 2 permits waits", err)
	case err := <-bDone:
		t.Fatalf("the waiter of 2 permits returned %v with 1 free", err)
	case <-time.After(time.Second):
	}
	p.Release(1)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	p.Release(2)
	if err := <-cDone; err != nil {
		t.Fatal(err)
	}
	q.Release(1)
}

// A process's second waiter that gives up leaves no place behind: the first
// waiter's entry in Redis, which named the second's arrival as its next, is
// rewritten at once, so a release that grants the first does not keep the
// process's place (flagged "-") for a waiter that is gone, keeping every
// later waiter out for three expiries.
func TestSemaphoreCancelledSecondWaiterKeepsNoPlace(t *testing.T) {
	srv := miniredis.RunT(t)
	opts := []Option{WithExpiry(5 * time.Second)}
	h, _ := newFaultSem(t, srv, "second", 1, opts...)
	p, _ := newFaultSem(t, srv, "second", 1, opts...)
	q, _ := newFaultSem(t, srv, "second", 1, opts...)
	if !h.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx := context.Background()
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(ctx, 1) }()
	eventually(t, 10*time.Second, "one process queued in Redis", func() bool { return semQueued(t, srv, "second") == 1 })
	bctx, cancel := context.WithCancel(ctx)
	go func() { bDone <- p.Acquire(bctx, 1) }()
	wants := "netlock:{second}:sem:wants"
	eventually(t, 10*time.Second, "p's entry in Redis naming B", func() bool { return semNext(srv, "second", p.m.waiterID) > 0 })
	cancel()
	if err := <-bDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	// At once: well before A's timer, seconds away.
	eventually(t, time.Second, "p's entry in Redis naming no next waiter", func() bool { return semNext(srv, "second", p.m.waiterID) == 0 })
	go func() { cDone <- q.Acquire(ctx, 1) }()
	eventually(t, 10*time.Second, "two processes queued in Redis", func() bool { return semQueued(t, srv, "second") == 2 })
	h.Release(1) // grants A
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	p.Release(1)
	select {
	case err := <-cDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("a waiter was kept out after every permit came back; queue %v, wants %v", semDump(srv, q.keys), hashOf(srv, wants))
	}
	q.Release(1)
}

// A process's first waiter at the head of the queue that gives up, while
// another waiter of the process still waits, moves the process's place back
// to that waiter's arrival: the waiters of other processes it kept out that
// fit are told at once, as when a waiter at the head leaves, not when
// their timers fire, up to an expiry later.
func TestSemaphorePlaceMovedBackWakes(t *testing.T) {
	srv := miniredis.RunT(t)
	opts := []Option{WithExpiry(5 * time.Second)}
	h, _ := newFaultSem(t, srv, "moved", 3, opts...)
	p, _ := newFaultSem(t, srv, "moved", 3, opts...)
	q, _ := newFaultSem(t, srv, "moved", 3, opts...)
	if !h.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx := context.Background()
	actx, cancel := context.WithCancel(ctx)
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(actx, 3) }()
	eventually(t, 10*time.Second, "one process queued in Redis", func() bool { return semQueued(t, srv, "moved") == 1 })
	time.Sleep(time.Millisecond) // arrivals are the clock's µs: the next waiter's comes later
	go func() { bDone <- q.Acquire(ctx, 2) }()
	eventually(t, 10*time.Second, "two processes queued in Redis", func() bool { return semQueued(t, srv, "moved") == 2 })
	time.Sleep(time.Millisecond) // arrivals are the clock's µs: the next waiter's comes later
	go func() { cDone <- p.Acquire(ctx, 2) }()
	eventually(t, 10*time.Second, "p's second waiter queued in its process", func() bool { p.m.mu.Lock(); defer p.m.mu.Unlock(); return len(p.line()) == 2 })
	eventually(t, 10*time.Second, "p's entry in Redis naming C", func() bool { return semNext(srv, "moved", p.m.waiterID) > 0 })
	cancel() // A gives up; P's place moves back behind B, who fits
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	select {
	case err := <-bDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(1500 * time.Millisecond):
		t.Fatalf("a waiter that fits and is first now was not told; %v", semDump(srv, q.keys))
	}
	q.Release(2)
	h.Release(1)
	if err := <-cDone; err != nil {
		t.Fatal(err)
	}
	p.Release(2)
}

// Two waiters of a process give up together (one ctx), as a release of
// another process comes. Whatever the order in which they leave, the
// process's place in Redis is given up, and a grant made to the first
// one's call, which nobody takes in, is taken back. Neither may stay
// behind for an expiry (the place would keep the other processes' waiters
// out, the grant its permits).
func TestSemaphoreWaitersGiveUpTogether(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		holder := e.newSem(t, "together", 1)
		for i := range 30 {
			p := e.newSem(t, "together", 1, WithRetryDelay(time.Hour, time.Hour))
			mustAcquire(t, holder, 1)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 2)
			for range 2 {
				go func() { done <- p.Acquire(ctx, 1) }()
			}
			// Queued, and the first waiter's attempt that tells Redis of
			// the second (see Semaphore.pokeFirstLocked) has run: an attempt still on
			// its way when the waiters give up may reach Redis after their
			// leave, which is another matter.
			eventually(t, 10*time.Second, "both waiters queued, the second told to Redis", func() bool {
				p.m.mu.Lock()
				queued := len(p.line())
				p.m.mu.Unlock()
				w, _ := redis.String(e.do(t, "HGET", "netlock:{together}:sem:wants", p.m.waiterID), nil)
				f := strings.Split(w, ":")
				return queued == 2 && len(f) >= 5 && f[4] != "0"
			})
			go func() {
				time.Sleep(time.Duration(i%4) * 200 * time.Microsecond) // rounds vary the interleaving
				holder.Release(1)
			}()
			time.Sleep(time.Duration(i%3) * 200 * time.Microsecond) // rounds vary the interleaving
			cancel()
			for range 2 {
				if err := <-done; err == nil {
					p.Release(1) // granted before it gave up
				}
			}
			deadline := time.Now().Add(time.Second) // the expiry is DefaultExpiry
			for {
				queued, _ := redis.Int(e.do(t, "ZCARD", "netlock:{together}:sem:queue"), nil)
				out := semOut(t, e, "together")
				if queued == 0 && out == 0 {
					break
				}
				if time.Now().After(deadline) {
					permits, _ := redis.Strings(e.do(t, "HGETALL", "netlock:{together}:sem:permits"), nil)
					t.Fatalf("round %d: both waiters gave up, the holder released: %d waiters still queued, %d permits out (%q) a second later", i, queued, out, permits)
				}
				time.Sleep(5 * time.Millisecond) // between looks
			}
		}
	})
}
