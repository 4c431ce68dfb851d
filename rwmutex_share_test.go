package netlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Readers of a process under its write lock (NetRWMutex.sharesWrite): a
// writer's Unlock hands the write lock to the readers of its process that
// wait next, together, and a reader that comes while they read joins
// them, without a round trip, within WithLocalHandoffs; longer read
// sections take a lease instead.

// countedRW returns a NetRWMutex on a counting backend of its own.
func countedRW(t *testing.T, e *env, name string, opts ...Option) (*NetRWMutex, *countingBackend) {
	t.Helper()
	cb := counting(e.backend(t))
	rw, err := NewRW(name, []Backend{cb}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw, cb
}

// rlockAsync calls rw.RLockCtx in a goroutine and returns where its error
// arrives.
func rlockAsync(rw *NetRWMutex) <-chan error { return async(rw.RLockCtx) }

func TestRWReadersShareOwnWriteLock(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		rw, cb := countedRW(t, e, "share")
		other := e.newRW(t, "share")
		rw.Lock()
		var in []<-chan error
		for range 3 {
			in = append(in, rlockAsync(rw))
		}
		eventually(t, 5*time.Second, "three readers queued behind the writer", func() bool {
			_, shared := rw.w.localWaiters()
			return shared == 3
		})
		before := cb.scripts()
		rw.Unlock()
		for _, done := range in {
			if err := <-done; err != nil {
				t.Fatalf("RLockCtx: %v", err)
			}
		}
		if n := cb.scripts() - before; n != 0 {
			t.Fatalf("the write lock went to the process's readers with %d script calls, want none", n)
		}
		if h, n := rw.readHold(); h == nil || n != 3 {
			t.Fatalf("readHold: %v, %d readers; want the write lock, 3", h, n)
		}
		if !isOpen(rw.RLost()) {
			t.Fatal("RLost() closed while the readers hold the write lock")
		}
		if !!isOpen(rw.Lost()) || rw.Token() != 0 {
			t.Fatalf("Lost() open or Token() %d while only readers hold", rw.Token())
		}
		if err := rw.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("UnlockCtx with only readers in: %v, want ErrNotHeld", err)
		}
		// Another process is kept out by the write lock, for reading too.
		if ok, err := other.TryRLockCtx(context.Background()); ok || err != nil {
			t.Fatalf("another process's TryRLockCtx: %v, %v; want false, nil", ok, err)
		}
		for range 3 {
			if err := rw.RUnlockCtx(context.Background()); err != nil {
				t.Fatalf("RUnlockCtx: %v", err)
			}
		}
		if err := rw.RUnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("a fourth RUnlockCtx: %v, want ErrNotHeld", err)
		}
		if ok, err := other.TryLockCtx(context.Background()); !ok || err != nil {
			t.Fatalf("another process's TryLockCtx after the last reader left: %v, %v", ok, err)
		}
		other.Unlock()
	})
}

// TestRWReadersShareWithinHandoffs: joining the readers under the write
// lock counts as a hand-off; past WithLocalHandoffs a reader waits for the
// write lock to be released, and takes it again in Redis.
func TestRWReadersShareWithinHandoffs(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		rw, cb := countedRW(t, e, "budget", WithLocalHandoffs(2))
		rw.Lock()
		first := rlockAsync(rw)
		eventually(t, 5*time.Second, "a reader queued behind the writer", func() bool {
			_, shared := rw.w.localWaiters()
			return shared == 1
		})
		rw.Unlock() // hand-off 1
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-rlockAsync(rw); err != nil { // joins: hand-off 2
			t.Fatal(err)
		}
		third := rlockAsync(rw)
		eventually(t, 5*time.Second, "the third reader queued", func() bool {
			_, shared := rw.w.localWaiters()
			return shared == 1
		})
		before := cb.scripts()
		rw.RUnlock()
		rw.RUnlock() // releases the write lock; the third reader acquires it again
		if err := <-third; err != nil {
			t.Fatal(err)
		}
		if n := cb.scripts() - before; n < 2 {
			t.Fatalf("%d script calls between the second reader's leaving and the third reader's getting in, want a release and an acquire", n)
		}
		rw.RUnlock()
		if e.exists(t, DefaultPrefix+"{budget}:rw") {
			t.Fatal("the write lock is left after the last reader")
		}
	})
}

// TestRWLongReadsTakeLease: with read sections long beside a round trip,
// a reader that comes while a writer of its process holds takes a lease,
// queued in Redis behind the writer, as another process's reader would;
// and while readers share the write lock, a reader waits for them to leave
// before it takes a lease.
func TestRWLongReadsTakeLease(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		rw := e.newRW(t, "long")
		readers := DefaultPrefix + "{long}:rw:readers"
		leases := DefaultPrefix + "{long}:rw:leases"
		rw.Lock()
		shortReads(rw)
		under := rlockAsync(rw)
		eventually(t, 5*time.Second, "a reader queued behind the writer", func() bool {
			_, shared := rw.w.localWaiters()
			return shared == 1
		})
		rw.Unlock()
		if err := <-under; err != nil {
			t.Fatal(err)
		}
		longReads(rw)
		leased := rlockAsync(rw)
		eventually(t, 5*time.Second, "the reader waits for the one under the write lock", func() bool {
			rw.w.mu.Lock()
			defer rw.w.mu.Unlock()
			return rw.w.drained != nil
		})
		if e.exists(t, readers) || e.exists(t, leases) {
			t.Fatal("a lease asked for while a reader of the process reads under the write lock")
		}
		rw.RUnlock()
		if err := <-leased; err != nil {
			t.Fatal(err)
		}
		if n := e.do(t, "ZCARD", leases); n != int64(1) {
			t.Fatalf("%v leases, want 1", n)
		}
		rw.RUnlock()

		rw.Lock()
		queued := rlockAsync(rw)
		eventually(t, 5*time.Second, "the reader queued in Redis behind the writer", func() bool { return e.do(t, "ZCARD", readers) == int64(1) })
		if all, _ := rw.w.localWaiters(); all != 0 {
			t.Fatalf("%d local waiters on the write lock, want the reader in Redis", all)
		}
		rw.Unlock()
		if err := <-queued; err != nil {
			t.Fatal(err)
		}
		if n := e.do(t, "ZCARD", leases); n != int64(1) {
			t.Fatalf("%v leases, want 1", n)
		}
		rw.RUnlock()
	})
}

// shortReads and longReads set what rw has measured of its read sections
// and of a round trip, as sharesWrite reads them.
func shortReads(rw *NetRWMutex) {
	rw.sections.avg.Store(int64(time.Microsecond))
	rw.w.rtt.Store(int64(time.Millisecond))
}

func longReads(rw *NetRWMutex) {
	rw.sections.avg.Store(int64(time.Second))
	rw.w.rtt.Store(int64(time.Millisecond))
	rw.r.rtt.Store(int64(time.Millisecond))
}

func TestSectionMeter(t *testing.T) {
	var s sectionMeter
	t0 := time.Unix(0, 0)
	// Two readers at a time, each 10ms, overlapping: the mean is 10ms.
	for i := range sectionSample / 2 {
		at := t0.Add(time.Duration(i) * 20 * time.Millisecond)
		s.enter(at)
		s.enter(at.Add(5 * time.Millisecond))
		s.leave(at.Add(10 * time.Millisecond))
		s.leave(at.Add(15 * time.Millisecond))
	}
	if got := s.mean(); got != 10*time.Millisecond {
		t.Fatalf("mean %v, want 10ms", got)
	}
}
