package netlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestLimiterBoundsCallsInFlight fills a Backend's budget of calls with
// acquires that do not return, and checks that no more are sent, that the
// watchdog's extends still go through on their own budget, that a call that
// finds no slot before its context ends fails without being sent (and so
// without a release to undo it), and that the calls that waited go through
// once slots come free.
func TestLimiterBoundsCallsInFlight(t *testing.T) {
	g := &gateBackend{countingBackend: counting(newBackend(t, "redigo", miniredis.RunT(t).Addr())), ignoreCtx: true}
	ctx := context.Background()
	held, err := New("held", []Backend{g})
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, held)
	defer mustUnlock(t, held)

	open := sync.OnceFunc(g.close(func(s *Script) bool { return s == acquireScript }))
	others := maxCalls - extendCalls
	n := others + 10 // 10 wait for a slot
	var wg sync.WaitGroup
	defer func() {
		open()
		wg.Wait()
	}()
	got := make([]bool, n)
	for i := range n {
		m, err := New(fmt.Sprintf("crowd:%d", i), []Backend{g}, WithNodeTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			got[i], _ = m.TryLockCtx(ctx)
			if got[i] {
				if err := m.UnlockCtx(ctx); err != nil {
					t.Errorf("UnlockCtx: %v", err)
				}
			}
		})
	}
	eventually(t, 10*time.Second, "every call but the waiting ones in flight", func() bool { return g.inFlight.Load() >= int64(others) })

	// The extends' budget is their own.
	if err := held.ExtendCtx(ctx); err != nil {
		t.Fatalf("ExtendCtx with the acquires' budget full: %v, want nil", err)
	}
	// A call waits for a slot within its context, and is not sent if none
	// comes free.
	releases := g.releases.Load()
	late, err := New("late", []Backend{g})
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	ok, err := late.TryLockCtx(lctx)
	if ok || !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLockCtx with no slot free = %v, %v; want false, ErrNotObtained and the context's error", ok, err)
	}
	if r := g.releases.Load(); r != releases {
		t.Fatalf("an acquire that was never sent was followed by %d releases, want none", r-releases)
	}
	if p := g.peak.Load(); p != int64(others) {
		t.Fatalf("got %d acquires in flight at once, want %d (maxCalls − extendCalls)", p, others)
	}

	open()
	wg.Wait()
	for i, ok := range got {
		if !ok {
			t.Fatalf("acquire %d of %d, which waited for a slot, failed", i, n)
		}
	}
}

// TestNextExtendJitter checks that the watchdog's extends fall in the last
// quarter of the interval before they are due, spread over it.
func TestNextExtendJitter(t *testing.T) {
	m, err := New("jitter", []Backend{newBackend(t, "redigo", miniredis.RunT(t).Addr())}, WithExpiry(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	interval := time.Second
	lo, hi := interval, time.Duration(0)
	for range 1000 {
		d := m.nextExtend(from).Sub(from)
		if d < interval*3/4 || d > interval {
			t.Fatalf("next extend %v after the last, want %v to %v", d, interval*3/4, interval)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > interval*4/5 || hi < interval*19/20 {
		t.Fatalf("1000 extends fell between %v and %v after the last, want them spread over %v to %v", lo, hi, interval*3/4, interval)
	}
}

// TestLimiterWaitWithoutDeadline checks that a call whose context has no
// deadline (a release under context.WithoutCancel) waits for a slot at most
// the bound it is given, and that a free slot is taken without waiting.
func TestLimiterWaitWithoutDeadline(t *testing.T) {
	l := newLimiter()
	for range cap(l.others) {
		l.others <- struct{}{}
	}
	ctx := context.WithoutCancel(context.Background())
	if _, waited, err := l.enter(ctx, releaseScript, 20*time.Millisecond); !waited || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("enter with every slot taken = waited %v, %v; want a wait that ends in context.DeadlineExceeded", waited, err)
	}
	slots, waited, err := l.enter(ctx, extendScript, 20*time.Millisecond)
	if err != nil || waited || slots != l.extends {
		t.Fatalf("enter of an extend with the others' slots taken = waited %v, %v; want the extends' slot at once", waited, err)
	}
	exit(slots)
	<-l.others
	if slots, waited, err := l.enter(ctx, releaseScript, 20*time.Millisecond); err != nil || waited || slots != l.others {
		t.Fatalf("enter with a slot free = waited %v, %v; want it at once", waited, err)
	}
}
