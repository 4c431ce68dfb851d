package netlock

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// semRegressBackend wraps a redigo Backend on miniredis for the regression
// tests of TestSemProperty's findings.
type semRegressBackend struct {
	inner Backend
	// fail: 1 makes the next call fail with a non-final error (its reply
	// lost) and every later one with a final error (the client closed).
	fail atomic.Int32
	// late: armed, the next sem_acquire call waits for its ctx to end,
	// reports the ctx's error, and reaches Redis only when go is closed.
	late     atomic.Bool
	entered  chan struct{}
	lateGo   chan struct{}
	lateDone chan struct{}
	// slow: sem_acquire calls of the waiter with this arrival are delayed.
	slow atomic.Int64
}

func (b *semRegressBackend) Eval(ctx context.Context, s *Script, keys, args []string) ([]int64, error) {
	switch b.fail.Load() {
	case 1:
		b.fail.Store(2)
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	case 2:
		return nil, errCrashed
	}
	if s == semAcquireScript {
		if a := b.slow.Load(); a != 0 && strings.Split(args[0], ":")[8] == strconv.FormatInt(a, 10) {
			time.Sleep(300 * time.Millisecond)
		}
		if b.late.CompareAndSwap(true, false) {
			close(b.entered)
			select {
			case <-ctx.Done():
				go func() {
					<-b.lateGo
					b.inner.Eval(context.Background(), s, keys, args)
					close(b.lateDone)
				}()
				return nil, ctx.Err()
			case <-time.After(300 * time.Millisecond):
				close(b.lateDone) // not cut short: sent as usual
			}
		}
	}
	return b.inner.Eval(ctx, s, keys, args)
}

func (b *semRegressBackend) Hub() *Hub { return b.inner.(Subscriber).Hub() }

func (b *semRegressBackend) Final(err error) bool {
	return errors.Is(err, errCrashed) || finalErr(b.inner, err)
}

func newSemRegress(t *testing.T, srv *miniredis.Miniredis, name string, size int64, opts ...Option) (*Semaphore, *semRegressBackend) {
	t.Helper()
	b := &semRegressBackend{inner: newBackend(t, "redigo", srv.Addr()),
		entered: make(chan struct{}), lateGo: make(chan struct{}), lateDone: make(chan struct{})}
	s, err := NewSemaphore(name, size, []Backend{b}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

func semQueued(t *testing.T, srv *miniredis.Miniredis, name string) int {
	t.Helper()
	m, _ := srv.ZMembers("netlock:{" + name + "}:sem:queue")
	return len(m)
}

// A Release whose reply was lost is sent again in the background (fix);
// once the client is closed (a final error), fix stops at once rather
// than for ten expiries (found by TestSemProperty: the fix goroutine
// outlived the pools it sent on).
func TestSemRegressFixStopsOnFinalError(t *testing.T) {
	srv := miniredis.RunT(t)
	s, b := newSemRegress(t, srv, "fixstop", 2, WithExpiry(10*time.Second), WithAutoExtend(false), WithRetryDelay(time.Millisecond, 2*time.Millisecond))
	if !s.TryAcquire(2) {
		t.Fatal("TryAcquire(2) of a free semaphore: false")
	}
	b.fail.Store(1)
	if err := s.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
		t.Fatalf("ReleaseCtx with its reply lost: %v, want ErrQuorum", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		s.mu.Lock()
		fixing := s.fixing
		s.mu.Unlock()
		if !fixing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fix still sending 3s after every call got a final error (it stops only when the lease ends, or after ten expiries)")
		}
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	if lease != nil {
		lease.end()
	}
}

// A waiter whose ctx ends while its attempt is on the wire leaves nothing
// queued, even if the attempt reaches Redis after the leave (found by
// TestSemProperty: the place, requeued by the late attempt, kept every
// later waiter out for three expiries).
func TestSemRegressCancelledAttemptLeavesNoPlace(t *testing.T) {
	srv := miniredis.RunT(t)
	holder, _ := newSemRegress(t, srv, "late", 1)
	w, b := newSemRegress(t, srv, "late", 1, WithRetryDelay(time.Hour, time.Hour))
	if !holder.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Acquire(ctx, 1) }()
	waitFor(t, func() bool { return semQueued(t, srv, "late") == 1 })
	time.Sleep(10 * time.Millisecond) // listening for its wake-up
	b.late.Store(true)
	srv.Publish(w.channel, "w") // it looks again
	<-b.entered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	close(b.lateGo)
	<-b.lateDone
	if n := semQueued(t, srv, "late"); n != 0 {
		t.Fatalf("%d waiters queued after the only one gave up (its attempt reached Redis after its leave)", n)
	}
	holder.Release(1)
}

// Waiters get in in order of arrival across processes, a process's second
// waiter included: when its first waiter gets in, the second takes its
// place in Redis at once, so a later waiter of another process that fits
// does not pass it (found by TestSemProperty).
func TestSemRegressSecondLocalWaiterKeepsOrder(t *testing.T) {
	srv := miniredis.RunT(t)
	h, _ := newSemRegress(t, srv, "order", 2)
	p, pb := newSemRegress(t, srv, "order", 2)
	q, _ := newSemRegress(t, srv, "order", 2)
	if !h.TryAcquire(2) {
		t.Fatal("TryAcquire(2): false")
	}
	ctx := context.Background()
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(ctx, 1) }()
	waitFor(t, func() bool { return semQueued(t, srv, "order") == 1 })
	go func() { bDone <- p.Acquire(ctx, 2) }()
	waitFor(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.queue) == 2 })
	p.mu.Lock()
	pb.slow.Store(p.queue[1].arrival) // B's own attempts are slow
	p.mu.Unlock()
	time.Sleep(time.Millisecond)
	go func() { cDone <- q.Acquire(ctx, 1) }()
	waitFor(t, func() bool { return semQueued(t, srv, "order") == 2 })
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
// later waiter out for three expiries (found by TestSemProperty).
func TestSemRegressCancelledSecondWaiterKeepsNoPlace(t *testing.T) {
	srv := miniredis.RunT(t)
	opts := []Option{WithExpiry(5 * time.Second)}
	h, _ := newSemRegress(t, srv, "second", 1, opts...)
	p, _ := newSemRegress(t, srv, "second", 1, opts...)
	q, _ := newSemRegress(t, srv, "second", 1, opts...)
	if !h.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx := context.Background()
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(ctx, 1) }()
	waitFor(t, func() bool { return semQueued(t, srv, "second") == 1 })
	bctx, cancel := context.WithCancel(ctx)
	go func() { bDone <- p.Acquire(bctx, 1) }()
	wants := "netlock:{second}:sem:wants"
	waitFor(t, func() bool { return !strings.HasSuffix(srv.HGet(wants, p.m.waiterID), ":0") }) // names B
	cancel()
	if err := <-bDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	go func() { cDone <- q.Acquire(ctx, 1) }()
	waitFor(t, func() bool { return semQueued(t, srv, "second") == 2 })
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
// fit are told at once, as when a waiter at the head leaves (found by
// TestSemProperty: they waited for their timers, up to an expiry).
func TestSemRegressPlaceMovedBackWakes(t *testing.T) {
	srv := miniredis.RunT(t)
	opts := []Option{WithExpiry(5 * time.Second)}
	h, _ := newSemRegress(t, srv, "moved", 3, opts...)
	p, _ := newSemRegress(t, srv, "moved", 3, opts...)
	q, _ := newSemRegress(t, srv, "moved", 3, opts...)
	if !h.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx := context.Background()
	actx, cancel := context.WithCancel(ctx)
	aDone, bDone, cDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { aDone <- p.Acquire(actx, 3) }()
	waitFor(t, func() bool { return semQueued(t, srv, "moved") == 1 })
	time.Sleep(time.Millisecond)
	go func() { bDone <- q.Acquire(ctx, 2) }()
	waitFor(t, func() bool { return semQueued(t, srv, "moved") == 2 })
	time.Sleep(time.Millisecond)
	go func() { cDone <- p.Acquire(ctx, 2) }()
	waitFor(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.queue) == 2 })
	time.Sleep(20 * time.Millisecond)
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
