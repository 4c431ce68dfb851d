package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Tests of a Semaphore's hand-on: a release passes its permits to the
// waiters of its own process without a round trip (see
// Semaphore.handOnLocked), in their order, within WithLocalHandoffs' bound
// and while the lease is well within its validity.

// What a gate holds in these tests: every call of the Semaphore but the
// waiters' attempts (sem_acquire), or every call. The ACL check of a
// waiter's first listen (lua/channels.lua) is not one of the Semaphore's
// calls: never held.
func butAttempts(s *Script) bool { return s != channelsScript && s != semAcquireScript }
func allCalls(s *Script) bool    { return s != channelsScript }

// newGateSem returns a Semaphore on a gateBackend of its own, as another
// process would have.
func newGateSem(t *testing.T, srv *miniredis.Miniredis, name string, size int64, opts ...Option) (*Semaphore, *gateBackend) {
	t.Helper()
	b := &gateBackend{countingBackend: counting(newBackend(t, "redigo", srv.Addr()))}
	s, err := NewSemaphore(name, size, []Backend{b}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

// acquireLater starts Acquire(ctx, n) on s and returns its result's
// channel, once the call is queued in its process (at position len-1 of
// s's queue) and, if it is first, has attempted in Redis.
func acquireLater(t *testing.T, ctx context.Context, srv *miniredis.Miniredis, s *Semaphore, n int64) <-chan error {
	t.Helper()
	s.m.mu.Lock()
	pos := len(s.line())
	s.m.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- s.Acquire(ctx, n) }()
	eventually(t, 5*time.Second, "waiter queued in its process", func() bool {
		s.m.mu.Lock()
		defer s.m.mu.Unlock()
		return len(s.line()) == pos+1
	})
	id, name := s.m.waiterID, s.Name()
	switch pos {
	case 0:
		eventually(t, 5*time.Second, "waiter queued in Redis", func() bool { return semNext(srv, name, id) >= 0 })
	case 1:
		// The first waiter's entry names it as the next (see
		// lua/sem_wake.lua): the first waiter's call for that is over.
		s.m.mu.Lock()
		arrival := s.line()[1].arrival
		s.m.mu.Unlock()
		eventually(t, 5*time.Second, "waiter named in Redis", func() bool { return semNext(srv, name, id) == arrival })
	}
	return done
}

// received returns what done gave within d, failing the test otherwise.
func received(t *testing.T, done <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
		return nil
	}
}

// pending fails the test if done has given a result.
func pending(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned %v; want it waiting", what, err)
	default:
	}
}

// A release handed on to a waiter of the same process makes no call to
// Redis: with every call but the waiters' attempts held at the gate, the
// waiter gets in and Release returns; the next waiter of ours takes the
// process's place over.
func TestSemaphoreHandOnNoRoundTrip(t *testing.T) {
	srv := miniredis.RunT(t)
	// A call held at the gate longer than the node timeout would fail, and
	// its count be sent again: a long one.
	s, b := newGateSem(t, srv, "handon", 1, WithExpiry(time.Minute), WithNodeTimeout(30*time.Second))
	mustAcquire(t, s, 1)
	ctx := context.Background()
	first := acquireLater(t, ctx, srv, s, 1)
	second := acquireLater(t, ctx, srv, s, 1)
	calls := func() int { // the waiters' attempts left out
		b.countingBackend.mu.Lock()
		defer b.countingBackend.mu.Unlock()
		n := 0
		for script, c := range b.calls {
			if script != "sem_acquire" {
				n += c
			}
		}
		return n
	}
	before := calls()
	open := b.close(butAttempts)
	released := make(chan error, 1)
	go func() { released <- s.ReleaseCtx(ctx, 1) }()
	if err := received(t, released, 5*time.Second, "ReleaseCtx with sem_release and sem_leave held"); err != nil {
		t.Fatalf("ReleaseCtx: %v", err)
	}
	if err := received(t, first, 5*time.Second, "the first waiter, handed on to"); err != nil {
		t.Fatalf("Acquire of the first waiter: %v", err)
	}
	open()
	if got := b.count("sem_release"); got != 0 {
		t.Errorf("sem_release calls: got %d, want 0", got)
	}
	if s.Held() != 1 {
		t.Errorf("Held: got %d, want 1", s.Held())
	}
	pending(t, second, "the second waiter")
	if got := calls() - before; got > 0 {
		t.Errorf("calls while handing on, the waiters' attempts left out: got %d, want 0", got)
	}
	// The second waiter is handed on to as well; then nobody of ours waits:
	// the release leaves the process's place, instead of a sem_release.
	s.Release(1)
	if err := received(t, second, 5*time.Second, "the second waiter"); err != nil {
		t.Fatal(err)
	}
	if got := b.count("sem_release"); got != 0 {
		t.Errorf("sem_release calls: got %d, want 0", got)
	}
	if got := semQueued(t, srv, "handon"); got != 0 {
		t.Errorf("waiters queued in Redis: got %d, want 0", got)
	}
	s.Release(1)
	if got := srv.Exists("netlock:{handon}:sem"); got {
		t.Error("leases left in Redis after the last release")
	}
}

// Hand-ons keep the order of the process's waiters, weights included: a
// release of 1 does not let a later waiter of 1 pass an earlier one of 2
// (the permit goes back to Redis), and the permits go to each waiter in
// turn as releases cover it.
func TestSemaphoreHandOnFIFOWeights(t *testing.T) {
	srv := miniredis.RunT(t)
	s, b := newGateSem(t, srv, "weights", 3)
	mustAcquire(t, s, 3)
	ctx := context.Background()
	big := acquireLater(t, ctx, srv, s, 2)
	small := acquireLater(t, ctx, srv, s, 1)
	s.Release(1) // covers the small waiter, not the big one before it
	if got := b.count("sem_release"); got != 1 {
		t.Fatalf("sem_release calls: got %d, want 1 (a release not handed on goes to Redis)", got)
	}
	pending(t, small, "the waiter of 1 behind a waiter of 2")
	pending(t, big, "the waiter of 2 with 1 free")
	s.Release(2) // covers the big one: handed on
	if err := received(t, big, 5*time.Second, "the waiter of 2"); err != nil {
		t.Fatal(err)
	}
	if got := b.count("sem_release"); got != 1 {
		t.Errorf("sem_release calls: got %d, want 1 (the release of 2 is handed on)", got)
	}
	// First now, the small one takes the permit given back to Redis.
	if err := received(t, small, 5*time.Second, "the waiter of 1"); err != nil {
		t.Fatal(err)
	}
	if s.Held() != 3 {
		t.Errorf("Held: got %d, want 3", s.Held())
	}
	s.Release(3)
}

// After WithLocalHandoffs' bound of hand-ons in a row, a release goes to
// Redis, where a waiter of another process that came first gets in; once
// the process gets permits from Redis again, hand-ons resume.
func TestSemaphoreHandOnBound(t *testing.T) {
	srv := miniredis.RunT(t)
	a, ab := newGateSem(t, srv, "bound", 1, WithLocalHandoffs(2))
	other, _ := newGateSem(t, srv, "bound", 1)
	mustAcquire(t, a, 1)
	ctx := context.Background()
	theirs := acquireLater(t, ctx, srv, other, 1)
	time.Sleep(time.Millisecond) // arrivals are the clock's µs: ours come later
	var ours []<-chan error
	for range 3 {
		ours = append(ours, acquireLater(t, ctx, srv, a, 1))
	}
	for i := range 2 {
		a.Release(1)
		if err := received(t, ours[i], 5*time.Second, "a handed-on waiter"); err != nil {
			t.Fatal(err)
		}
	}
	if got := ab.count("sem_release"); got != 0 {
		t.Fatalf("sem_release calls within the bound: got %d, want 0", got)
	}
	a.Release(1) // the third in a row: to Redis
	if err := received(t, theirs, 5*time.Second, "the other process's waiter after the bound"); err != nil {
		t.Fatal(err)
	}
	pending(t, ours[2], "our third waiter, while the other process holds")
	if got := ab.count("sem_release"); got != 1 {
		t.Errorf("sem_release calls: got %d, want 1", got)
	}
	other.Release(1)
	if err := received(t, ours[2], 5*time.Second, "our third waiter"); err != nil {
		t.Fatal(err)
	}
	a.m.mu.Lock()
	handons := a.m.handoffs
	a.m.mu.Unlock()
	if handons != 0 {
		t.Errorf("hand-ons in a row after a grant from Redis: got %d, want 0", handons)
	}
	a.Release(1)
}

// No hand-on while the lease is not well within its validity (extends
// failing), nor without auto-extend: the release goes to Redis, which lets
// the waiter in.
func TestSemaphoreHandOnNeedsValidity(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		near bool // the lease's deadline is moved within half the expiry
	}{
		{"near its deadline", []Option{WithExpiry(30 * time.Second)}, true},
		{"no auto-extend", []Option{WithExpiry(30 * time.Second), WithAutoExtend(false)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := miniredis.RunT(t)
			s, b := newGateSem(t, srv, "valid", 1, tc.opts...)
			mustAcquire(t, s, 1)
			done := acquireLater(t, context.Background(), srv, s, 1)
			if tc.near {
				// As if extends failed: a third of the expiry left. The
				// watchdog's next extend is two thirds of the expiry away.
				h := s.lease
				h.mu.Lock()
				h.until = s.m.clk.Now().Add(10 * time.Second)
				h.mu.Unlock()
			}
			s.Release(1)
			if err := received(t, done, 5*time.Second, "the waiter"); err != nil {
				t.Fatal(err)
			}
			if got := b.count("sem_release"); got != 1 {
				t.Errorf("sem_release calls: got %d, want 1 (not handed on)", got)
			}
			if s.Held() != 1 {
				t.Errorf("Held: got %d, want 1", s.Held())
			}
			s.Release(1)
		})
	}
}

// A waiter whose ctx ends as a release hands it its permits never holds
// them: they pass on to the next waiter of ours (or go back), whichever of
// the two came first.
func TestSemaphoreHandOnCancelledWaiter(t *testing.T) {
	srv := miniredis.RunT(t)
	s, _ := newGateSem(t, srv, "cancel", 1)
	mustAcquire(t, s, 1)
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		gone := acquireLater(t, ctx, srv, s, 1)
		next := acquireLater(t, context.Background(), srv, s, 1)
		released := make(chan error, 1)
		go func() { released <- s.ReleaseCtx(context.Background(), 1) }()
		cancel()
		err := received(t, gone, 5*time.Second, "the cancelled waiter")
		if err == nil {
			// It got in before its ctx ended: it holds, and gives back.
			s.Release(1)
		} else if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: cancelled waiter: got %v, want ErrNotObtained and context.Canceled", i, err)
		}
		if err := received(t, released, 5*time.Second, "ReleaseCtx"); err != nil {
			t.Fatalf("round %d: ReleaseCtx: %v", i, err)
		}
		if err := received(t, next, 5*time.Second, "the next waiter"); err != nil {
			t.Fatalf("round %d: next waiter: %v", i, err)
		}
		if got := s.Held(); got != 1 {
			t.Fatalf("round %d: Held: got %d, want 1", i, got)
		}
	}
	s.Release(1)
	eventually(t, 5*time.Second, "nothing out or queued in Redis", func() bool {
		return !srv.Exists("netlock:{cancel}:sem") && semQueued(t, srv, "cancel") == 0
	})
}

// A release does not hand permits to a first waiter whose call is in
// flight (its reply may grant it permits as well): it waits for the call,
// and hands on once the reply refused them.
func TestSemaphoreHandOnWaitsForCall(t *testing.T) {
	srv := miniredis.RunT(t)
	s, b := newGateSem(t, srv, "incall", 1, WithExpiry(time.Minute), WithNodeTimeout(30*time.Second))
	mustAcquire(t, s, 1)
	ctx := context.Background()
	first := acquireLater(t, ctx, srv, s, 1)
	open := b.close(allCalls)
	// A second waiter pokes the first, whose call to say so is held.
	second := make(chan error, 1)
	go func() { second <- s.Acquire(ctx, 1) }()
	eventually(t, 5*time.Second, "the first waiter in a call", func() bool {
		s.m.mu.Lock()
		defer s.m.mu.Unlock()
		return len(s.line()) == 2 && s.calling == s.line()[0]
	})
	s.m.mu.Lock()
	handed := s.handOnAllLocked(1)
	s.m.mu.Unlock()
	if handed {
		t.Fatal("permits handed on, without s.op, to a waiter in a call")
	}
	released := make(chan error, 1)
	go func() { released <- s.ReleaseCtx(ctx, 1) }()
	open()
	if err := received(t, released, 5*time.Second, "ReleaseCtx"); err != nil {
		t.Fatal(err)
	}
	if err := received(t, first, 5*time.Second, "the first waiter"); err != nil {
		t.Fatal(err)
	}
	if got := b.count("sem_release"); got != 0 {
		t.Errorf("sem_release calls: got %d, want 0 (handed on once the call was over)", got)
	}
	s.Release(1)
	if err := received(t, second, 5*time.Second, "the second waiter"); err != nil {
		t.Fatal(err)
	}
	if s.Held() != 1 {
		t.Errorf("Held: got %d, want 1", s.Held())
	}
	s.Release(1)
}
