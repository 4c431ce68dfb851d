package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Tests of a Semaphore's calls whose reply was lost: the count is sent
// again in the background (the reaper's resend) until Redis takes it or
// never will, and a call still on its way that reaches Redis after a later
// one changes nothing.

// The resend of a lease's count after a call's reply was lost stops when
// an error says Redis will never take it (a closed client), not when it
// gives up, ten expiries later.
func TestSemaphoreFixStopsOnClosedClient(t *testing.T) {
	s := redistest.Start(t)
	p := redistest.StartProxy(t, s.Addr())
	pool := &redis.Pool{MaxIdle: 4, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", p.Addr())
	}}
	defer pool.Close()
	sem, err := NewSemaphore("fixstops", 2, []Backend{NewRedigo(pool)}, WithExpiry(time.Second),
		WithNodeTimeout(100*time.Millisecond), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, sem, 1)
	p.SetReplyDelay(500 * time.Millisecond) // the release's reply is lost: a resend is queued
	if err := sem.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
		t.Fatalf("ReleaseCtx with its reply delayed past the node timeout: got %v, want ErrQuorum", err)
	}
	if !fixRuns(sem) {
		t.Fatal("no resend queued after a release whose reply was lost")
	}
	pool.Close()
	// A second is a few retry delays; giving up would take ten expiries.
	eventually(t, time.Second, "resend stopped after the client was closed", func() bool { return !fixRuns(sem) })
}

// fixRuns reports whether a resend of sem's count is queued in its reaper.
func fixRuns(sem *Semaphore) bool {
	sem.m.mu.Lock()
	defer sem.m.mu.Unlock()
	return sem.fixing
}

// A Release whose reply was lost is sent again in the background (resend);
// once every call gets a final error (the client closed), it stops at
// once rather than for ten expiries, and does not outlive the clients it
// sends on.
func TestSemaphoreFixStopsOnFinalError(t *testing.T) {
	srv := miniredis.RunT(t)
	s, b := newFaultSem(t, srv, "fixstop", 2, WithExpiry(10*time.Second), WithAutoExtend(false), WithRetryDelay(time.Millisecond, 2*time.Millisecond))
	if !s.TryAcquire(2) {
		t.Fatal("TryAcquire(2) of a free semaphore: false")
	}
	b.fail.Store(1)
	if err := s.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
		t.Fatalf("ReleaseCtx with its reply lost: %v, want ErrQuorum", err)
	}
	// Not when the lease ends, or after ten expiries.
	eventually(t, 3*time.Second, "resend stopped after every call got a final error", func() bool { return !fixRuns(s) })
	s.m.mu.Lock()
	lease := s.lease
	s.m.mu.Unlock()
	if lease != nil {
		lease.end()
	}
}

// The calls that change a lease's count send the whole count so that a
// call whose reply was lost can be sent again. A call whose reply was lost
// may still be on its way (a slow link, a connection the client gave up
// on, a stalled process's bytes delivered late), and the next call goes on
// another connection: it can arrive after a later one, and must then
// change nothing. Here a Release(2) whose reply is lost (its "V:0", and
// the reaper's resends of it, held back), then an Acquire(2), which reuses the
// value V (its count was uncertain) and is granted, then the held-back
// releases arrive: they must not delete the lease that holds the two
// permits, or another process would take them.
func TestSemaphoreLateCallAfterGrant(t *testing.T) {
	a, b, late := lateSemPair(t)
	late.hold.Store(true)
	if err := a.ReleaseCtx(context.Background(), 2); !errors.Is(err, ErrQuorum) {
		t.Fatalf("ReleaseCtx with its reply lost: got %v, want ErrQuorum", err)
	}
	eventually(t, 5*time.Second, "the reaper sending the release again, held back too", func() bool { return late.heldBack.Load() >= 2 })
	mustAcquire(t, a, 2)
	late.deliver() // the held-back calls arrive
	if b.TryAcquire(1) {
		t.Fatalf("TryAcquire(1) in another process while this one holds both permits (Held %d, Lost() open %v): granted", a.Held(), isOpen(a.Lost()))
	}
	a.Release(2)
}

// As TestSemaphoreLateCallAfterGrant, on a lease that lives on: a
// Release(1) of two permits ("V:1") held back, an Acquire(1) on the lease
// ("V:2", granted), then the late "V:1", which must not leave the lease
// counting one permit in Redis while its process holds two.
func TestSemaphoreLateReleaseAfterGrow(t *testing.T) {
	a, b, late := lateSemPair(t)
	late.hold.Store(true)
	if err := a.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
		t.Fatalf("ReleaseCtx with its reply lost: got %v, want ErrQuorum", err)
	}
	eventually(t, 5*time.Second, "the reaper sending the release again, held back too", func() bool { return late.heldBack.Load() >= 2 })
	mustAcquire(t, a, 1)
	late.deliver() // the held-back calls arrive
	if b.TryAcquire(1) {
		t.Fatalf("TryAcquire(1) in another process while this one holds both permits (Held %d, Lost() open %v): granted", a.Held(), isOpen(a.Lost()))
	}
	a.Release(2)
}

// An acquire whose reply was lost, and which reaches Redis only after the
// resend of the process's count (0: it holds nothing) was applied, does not
// make a lease that nobody holds, keeping its permits out until it
// expires: the resend left the value's tombstone, and the acquire is late.
func TestSemaphoreLateAcquireAfterRelease(t *testing.T) {
	for _, how := range []string{"TryAcquireCtx", "Acquire"} {
		t.Run(how, func(t *testing.T) {
			s := redistest.Start(t)
			late := &heldBackBackend{wrapper: wrapper{Backend: newBackend(t, "redigo", s.Addr()), polling: true}, script: "sem_acquire", arrive: make(chan struct{})}
			a, err := NewSemaphore("lateacq", 2, []Backend{late}, WithExpiry(2*time.Second),
				WithNodeTimeout(100*time.Millisecond), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			b, err := NewSemaphore("lateacq", 2, []Backend{newBackend(t, "redigo", s.Addr())})
			if err != nil {
				t.Fatal(err)
			}
			late.hold.Store(true)
			if how == "TryAcquireCtx" {
				if _, err := a.TryAcquireCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
					t.Fatalf("TryAcquireCtx with its reply lost: got %v, want ErrQuorum", err)
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				err := a.Acquire(ctx, 1)
				cancel()
				if err == nil {
					t.Fatal("Acquire with every reply lost: got nil")
				}
			}
			eventually(t, 5*time.Second, "the resend of the count, 0, applied", func() bool {
				a.m.mu.Lock()
				defer a.m.mu.Unlock()
				return !a.dirty && !a.fixing
			})
			late.deliver() // the held-back acquires arrive
			if info, err := b.Inspect(context.Background()); err != nil || info.Out != 0 || info.Leases != 0 || info.Waiters != 0 {
				t.Errorf("after the late acquires: %+v, %v; want no permit out, no lease, no waiter", info, err)
			}
			if !b.TryAcquire(2) {
				t.Fatal("TryAcquire(2) in another process, nothing held: refused")
			}
			b.Release(2)
		})
	}
}

// lateSemPair returns two processes of a semaphore "late" of 2, a holding
// both permits, with its sem_release calls held back by late when told.
func lateSemPair(t *testing.T) (a, b *Semaphore, late *heldBackBackend) {
	t.Helper()
	s := redistest.Start(t)
	late = &heldBackBackend{wrapper: wrapper{Backend: newBackend(t, "redigo", s.Addr()), polling: true}, script: "sem_release", arrive: make(chan struct{})}
	a, err := NewSemaphore("late", 2, []Backend{late}, WithExpiry(2*time.Second),
		WithNodeTimeout(100*time.Millisecond), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	b, err = NewSemaphore("late", 2, []Backend{newBackend(t, "redigo", s.Addr())})
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, a, 2)
	return a, b, late
}

// A lease that a release's grant made (lua/sem_wake.lua) carries a
// sequence number, so a call of the process sent before the grant's
// waiter wrote its entry, whose reply was lost and which reaches Redis
// only after the process took the grant in (adopt), is fenced: a
// held-back Release's "V:0" must not find the lease the grant made, drop
// the grant and end the lease while its process holds the two permits
// with Lost() open, letting another process take them.
func TestSemaphoreLateReleaseAfterAdoptedGrant(t *testing.T) {
	for _, client := range []string{"redigo", "rueidis"} {
		t.Run(client, func(t *testing.T) {
			s := redistest.Start(t)
			late := &lateSubBackend{heldBackBackend{wrapper: wrapper{Backend: newBackend(t, client, s.Addr())}, script: "sem_release", arrive: make(chan struct{})}}
			a, err := NewSemaphore("adopted", 2, []Backend{late}, WithExpiry(5*time.Second),
				WithNodeTimeout(100*time.Millisecond), WithRetryDelay(time.Millisecond, 20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			b, err := NewSemaphore("adopted", 2, []Backend{newBackend(t, client, s.Addr())})
			if err != nil {
				t.Fatal(err)
			}
			mustAcquire(t, a, 1)
			mustAcquire(t, b, 1)
			late.hold.Store(true)
			if err := a.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrQuorum) {
				t.Fatalf("ReleaseCtx with its reply lost: got %v, want ErrQuorum", err)
			}
			// a's waiter is refused (b holds one), which sets its count in
			// Redis as it holds it (none: the lease ends) and clears dirty;
			// b's release grants it the two permits, which it takes in.
			got := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got <- a.Acquire(ctx, 2)
			}()
			eventually(t, 10*time.Second, "a's waiter queued, for b's release to grant it", func() bool {
				n, err := s.Do("HLEN", "netlock:{adopted}:sem:wants")
				return err == nil && n != "0"
			})
			b.Release(1)
			if err := <-got; err != nil {
				t.Fatalf("Acquire(2): %v", err)
			}
			late.deliver() // the held-back calls arrive
			if b.TryAcquire(1) {
				t.Errorf("TryAcquire(1) in another process while this one holds both permits (Held %d, Lost() open %v): granted", a.Held(), isOpen(a.Lost()))
				b.Release(1)
			}
			a.Release(2)
		})
	}
}

// TestSemaphoreLateCallAfterAdoptedGrant is TestSemaphoreLateReleaseAfterAdoptedGrant
// at the scripts, for both kinds of late call: a release's grant to a
// waiter whose entry an attempt of sequence number 5 wrote makes its lease
// (a grant beside no count); a TryAcquire's attempt (3, no nonce) and a
// release of the lease's count (4), sent before the entry and arriving
// now, change nothing: the process may have taken the grant in.
func TestSemaphoreLateCallAfterAdoptedGrant(t *testing.T) {
	s := redistest.Start(t)
	b := newBackend(t, "redigo", s.Addr())
	keys := semKeysOf("lategrant")
	call := func(script *Script, arg string) []int64 {
		t.Helper()
		vals, err := b.Eval(context.Background(), script, semCallKeys(keys, arg), []string{arg})
		if err != nil {
			t.Fatalf("%s %s: %v", script.Name(), arg, err)
		}
		return vals
	}
	// "<value>:<base>:<seq>:<size>:<expiry ms>:<member>:<flags>:<place ms>:<tomb ms>:<fold>:<nonce>:<batch>"
	if r := call(semAcquireScript, "B:0:1:2:5000:wb::15000:50000:::2@1"); r[0] != 1 {
		t.Fatalf("B's acquire: %v", r)
	}
	if r := call(semAcquireScript, "A:0:5:2:5000:wa:w:15000:50000::N:1@2"); r[0] != -1 {
		t.Fatalf("A's waiter: %v, want refused", r)
	}
	if r := call(semReleaseScript, "B:0:2:::5000:50000"); r[0] != 1 {
		t.Fatalf("B's release: %v", r)
	}
	grant := func(when string) {
		t.Helper()
		g, err := s.Do("HGET", keys[1], "A#g")
		if err != nil || g != "N:1" {
			t.Fatalf("%s: A's grant %q (%v), want \"N:1\"", when, g, err)
		}
	}
	grant("granted by B's release")
	if r := call(semAcquireScript, "A:0:3:2:5000:::15000:50000:::1@0"); r[0] != semAcquireLate {
		t.Errorf("late TryAcquire's attempt: %v, want %d (late)", r, semAcquireLate)
	}
	grant("after the late TryAcquire's attempt")
	if r := call(semReleaseScript, "A:0:4:::5000:50000"); r[0] != semReleaseLate {
		t.Errorf("late release: %v, want %d (late)", r, semReleaseLate)
	}
	grant("after the late release")
	// The waiter's next attempt takes the grant in, as before.
	if r := call(semAcquireScript, "A:0:6:2:5000:wa::15000:50000::N:1@2"); r[0] != 1 || r[1] != 1 {
		t.Errorf("A's waiter's next attempt: %v, want granted", r)
	}
}

// A waiter whose ctx ends while its attempt is on the wire leaves nothing
// queued, even if the attempt reaches Redis after the leave: a place
// requeued by the late attempt would keep every later waiter out for
// three expiries.
func TestSemaphoreCancelledAttemptLeavesNoPlace(t *testing.T) {
	srv := miniredis.RunT(t)
	holder, _ := newFaultSem(t, srv, "late", 1)
	w, b := newFaultSem(t, srv, "late", 1, WithRetryDelay(time.Hour, time.Hour))
	if !holder.TryAcquire(1) {
		t.Fatal("TryAcquire(1): false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Acquire(ctx, 1) }()
	eventually(t, 10*time.Second, "the waiter queued", func() bool { return semQueued(t, srv, "late") == 1 })
	eventually(t, 10*time.Second, "the waiter listening for its wake-up", func() bool { return listening(srv, w.m.waitChan) })
	b.late.Store(true)
	srv.Publish(w.m.waitChan, "w") // it looks again
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

// TestSemaphoreOneWakePerCall: a waiter's refused attempt that both sets
// its process's count back (Redis held a permit the process does not know
// of: a call whose reply was lost) and moves its place back (its first
// waiter gave up; the next arrived later) tells the queue once, of the
// permits free after both. Told twice with the count the first telling
// began from, the same 2 free permits went to both waiters of 2 behind it:
// 5 of 3 out (TestChaosSem's count of what Redis holds saw 4).
func TestSemaphoreOneWakePerCall(t *testing.T) {
	s := redistest.Start(t)
	b := newBackend(t, "redigo", s.Addr())
	keys := semKeysOf("onewake")
	call := func(script *Script, arg string) []int64 {
		t.Helper()
		vals, err := b.Eval(context.Background(), script, semCallKeys(keys, arg), []string{arg})
		if err != nil {
			t.Fatalf("%s %s: %v", script.Name(), arg, err)
		}
		return vals
	}
	// "<value>:<base>:<seq>:<size>:<expiry ms>:<member>:<flags>:<place ms>:<tomb ms>:<fold>:<nonce>:<batch>"
	// H holds 1 and P 1; A and B wait for 2 each (arrivals 3 and 4), and
	// P's waiter for 2 more (arrival 5).
	for _, c := range []struct {
		arg  string
		want int64
	}{
		{"H:0:1:3:5000:wh::15000:50000:::1@1", 1},
		{"P:0:1:3:5000:wp::15000:50000:::1@2", 1},
		{"A:0:1:3:5000:wa:w:15000:50000::NA:2@3", -1},
		{"B:0:1:3:5000:wb:w:15000:50000::NB:2@4", -1},
		{"P:1:2:3:5000:wp:gw:15000:50000::N1:2@5", -1},
	} {
		if r := call(semAcquireScript, c.arg); r[0] != c.want {
			t.Fatalf("%s: %v, want status %d", c.arg, r, c.want)
		}
	}
	// P's next attempt says it holds none (it gave its permit up) for a
	// waiter of 2 that arrived at 7: its count is set back to 0, its place
	// moves from 5 to 7, and A, first, fits in the 2 now free.
	if r := call(semAcquireScript, "P:0:3:3:5000:wp:w:15000:50000::N2:2@7"); r[0] != -1 {
		t.Fatalf("P's attempt: %v, want refused (A came first)", r)
	}
	if out := semOut(t, &env{server: s, client: "redigo", addr: s.Addr()}, "onewake"); out > 3 {
		h, _ := s.Do("HGETALL", keys[1])
		t.Errorf("%d permits out in Redis, size 3: %q", out, h)
	}
	if a, _ := s.Do("HGET", keys[1], "A#g"); a != "NA:2" {
		t.Errorf("A's grant %q, want \"NA:2\" (first in the queue, and 2 free)", a)
	}
}
