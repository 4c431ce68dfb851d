package netlock

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Permits are counted across processes: TryAcquire succeeds while they fit,
// Release gives them back, and the last one leaves nothing in Redis.
func TestSemaphoreBasic(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newSem(t, "sem", 3)
		b := e.newSem(t, "sem", 3)
		mustAcquire(t, a, 2)
		if b.TryAcquire(2) {
			t.Fatal("TryAcquire(2) with 2 of 3 out elsewhere: got true")
		}
		if !b.TryAcquire(1) {
			t.Fatal("TryAcquire(1) with 2 of 3 out: got false")
		}
		if got := semOut(t, e, "sem"); got != 3 {
			t.Fatalf("permits out in Redis: %d, want 3", got)
		}
		if a.Held() != 2 || b.Held() != 1 {
			t.Fatalf("Held: %d and %d, want 2 and 1", a.Held(), b.Held())
		}
		select {
		case <-a.Lost():
			t.Fatal("Lost() closed while held")
		default:
		}
		mustAcquire(t, a, 0) // nothing to wait for
		a.Release(1)
		if !b.TryAcquire(1) {
			t.Fatal("TryAcquire(1) after a Release(1): got false")
		}
		a.Release(1)
		b.Release(2)
		if a.Held() != 0 || b.Held() != 0 {
			t.Fatalf("Held after releasing all: %d and %d", a.Held(), b.Held())
		}
		select {
		case <-a.Lost():
		default:
			t.Fatal("Lost() with nothing held: want a closed channel")
		}
		for _, k := range []string{"", ":permits", ":queue", ":places", ":wants"} {
			if e.exists(t, "netlock:{sem}:sem"+k) {
				t.Errorf("key netlock:{sem}:sem%s left after every permit came back", k)
			}
		}
	})
}

// A waiter is told when permits come back (no polling: its retry delay is
// an hour), and in order: a request for 1 that came after a request for 3
// waits, though 1 is free, and both get in when the permits come back.
func TestSemaphoreWaitFIFO(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newSem(t, "fifo", 4)
		big := e.newSem(t, "fifo", 4, WithRetryDelay(time.Hour, time.Hour))
		small := e.newSem(t, "fifo", 4, WithRetryDelay(time.Hour, time.Hour))
		mustAcquire(t, holder, 2)

		done := make(chan error, 2)
		go func() { done <- big.Acquire(context.Background(), 3) }()
		eventually(t, 10*time.Second, "one waiter queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{fifo}:sem:queue"), nil); return n == 1 })
		go func() { done <- small.Acquire(context.Background(), 1) }()
		eventually(t, 10*time.Second, "two waiters queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{fifo}:sem:queue"), nil); return n == 2 })
		if got := semOut(t, e, "fifo"); got != 2 || len(done) != 0 {
			t.Fatalf("permits out while both wait: %d, want 2 (the small request must not pass the big one)", got)
		}
		holder.Release(2)
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waiters not woken within 10s of the release")
			}
		}
		if got := semOut(t, e, "fifo"); got != 4 {
			t.Fatalf("permits out: %d, want 4", got)
		}
		big.Release(3)
		small.Release(1)
	})
}

// A waiter whose ctx ends leaves nothing queued; if it was first, the
// smaller requests behind it that fit are told at once.
func TestSemaphoreCancelledHeadWakesNext(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newSem(t, "cancel", 4)
		big := e.newSem(t, "cancel", 4, WithRetryDelay(time.Hour, time.Hour))
		small := e.newSem(t, "cancel", 4, WithRetryDelay(time.Hour, time.Hour))
		mustAcquire(t, holder, 3)
		ctx, cancel := context.WithCancel(context.Background())
		bigDone := make(chan error, 1)
		go func() { bigDone <- big.Acquire(ctx, 4) }()
		eventually(t, 10*time.Second, "one waiter queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{cancel}:sem:queue"), nil); return n == 1 })
		smallDone := make(chan error, 1)
		go func() { smallDone <- small.Acquire(context.Background(), 1) }()
		eventually(t, 10*time.Second, "two waiters queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{cancel}:sem:queue"), nil); return n == 2 })
		cancel()
		if err := <-bigDone; !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire: %v, want ErrNotObtained and context.Canceled", err)
		}
		select {
		case err := <-smallDone:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the small waiter was not told when the big one ahead of it gave up")
		}
		if big.Held() != 0 {
			t.Fatalf("cancelled waiter holds %d", big.Held())
		}
		if n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{cancel}:sem:queue"), nil); n != 0 {
			t.Fatalf("%d waiters left queued", n)
		}
		holder.Release(3)
		small.Release(1)
	})
}

// The permits out never exceed the size, with goroutines of several
// processes acquiring and releasing random weights; every waiter gets in.
func TestSemaphoreBoundConcurrent(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const size, procs, goroutines = 4, 4, 3
		var in, most atomic.Int64
		var acquired atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Second)
		for p := range procs {
			s := e.newSem(t, "bound", size)
			for g := range goroutines {
				wg.Go(func() {
					for i := 0; time.Now().Before(deadline); i++ {
						n := int64(1 + (p+g+i)%3)
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						err := s.Acquire(ctx, n)
						cancel()
						if err != nil {
							t.Errorf("Acquire(%d): %v", n, err)
							return
						}
						acquired.Add(1)
						now := in.Add(n)
						for {
							m := most.Load()
							if now <= m || most.CompareAndSwap(m, now) {
								break
							}
						}
						time.Sleep(time.Millisecond) // the section's length
						in.Add(-n)
						s.Release(n)
					}
				})
			}
		}
		wg.Wait()
		if most.Load() > size {
			t.Fatalf("%d permits held at once, size %d", most.Load(), size)
		}
		if got := semOut(t, e, "bound"); got != 0 {
			t.Fatalf("permits out after all released: %d", got)
		}
		t.Logf("%d acquisitions, at most %d permits held at once", acquired.Load(), most.Load())
	})
}

// Every bad input gets an error naming what was wrong, before any work.
func TestSemaphoreBadInput(t *testing.T) {
	b := &evalOnly{}
	for _, tc := range []struct {
		size     int64
		backends []Backend
		want     string
	}{
		{0, []Backend{b}, "size 0, want at least 1"},
		{-1, []Backend{b}, "size -1, want at least 1"},
		{2, []Backend{b, &evalOnly{}, &evalOnly{}}, "3 backends; a Semaphore runs on one"},
		{2, nil, "netlock: "},
	} {
		s, err := NewSemaphore("bad", tc.size, tc.backends)
		if s != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewSemaphore(size %d, %d backends): %v, %v; want an error containing %q", tc.size, len(tc.backends), s, err, tc.want)
		}
	}
	s, err := NewSemaphore("bad", 2, []Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Acquire(ctx, 3); err == nil || !strings.Contains(err.Error(), "Acquire of 3 permits, more than its size 2") {
		t.Errorf("Acquire(3) of 2: %v", err)
	}
	if err := s.Acquire(ctx, -1); err == nil || !strings.Contains(err.Error(), "Acquire of -1 permits") {
		t.Errorf("Acquire(-1): %v", err)
	}
	if _, err := s.TryAcquireCtx(ctx, 3); err == nil || !strings.Contains(err.Error(), "more than its size") {
		t.Errorf("TryAcquireCtx(3) of 2: %v", err)
	}
	if err := s.ReleaseCtx(ctx, 1); !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), "released 1 permits, more than the 0 held") {
		t.Errorf("ReleaseCtx(1) holding none: %v", err)
	}
	if err := s.ReleaseCtx(ctx, -1); err == nil || errors.Is(err, ErrNotHeld) {
		t.Errorf("ReleaseCtx(-1): %v", err)
	}
	func() {
		defer func() {
			if r, _ := recover().(error); !errors.Is(r, ErrNotHeld) {
				t.Errorf("Release(1) holding none: panic %v, want one matching ErrNotHeld", r)
			}
		}()
		s.Release(1)
	}()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Acquire(cancelled, 1); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with an ended ctx: %v", err)
	}
	var zero Semaphore
	if err := zero.Acquire(ctx, 1); !errors.Is(err, errZeroSemaphore) {
		t.Errorf("zero Semaphore: %v", err)
	}
	if zero.Name() != "" || zero.Held() != 0 {
		t.Error("zero Semaphore: Name or Held not empty")
	}
}

// Every process must agree on the size: a mismatch is an error, nothing is
// taken, and it names both sizes.
func TestSemaphoreSizeMismatch(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newSem(t, "size", 3)
		b := e.newSem(t, "size", 5)
		mustAcquire(t, a, 1)
		ok, err := b.TryAcquireCtx(context.Background(), 1)
		if ok || !errors.Is(err, ErrSizeMismatch) || !strings.Contains(err.Error(), "size 5 here, but its holders and waiters in Redis use 3") {
			t.Fatalf("TryAcquireCtx with another size: %v, %v", ok, err)
		}
		if err := b.Acquire(context.Background(), 1); !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("Acquire with another size: %v", err)
		}
		if got := semOut(t, e, "size"); got != 1 {
			t.Fatalf("permits out: %d, want 1", got)
		}
		a.Release(1)
		// Nothing held or waiting: the size may change.
		mustAcquire(t, b, 5)
		b.Release(5)
	})
}

// A key of another type under the semaphore's name is a clear error, and
// nothing is changed.
func TestSemaphoreWrongType(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		e.do(t, "SET", "netlock:{wt}:sem:permits", "x")
		s := e.newSem(t, "wt", 2)
		_, err := s.TryAcquireCtx(context.Background(), 1)
		if err == nil || !strings.Contains(err.Error(), "another type") {
			t.Fatalf("TryAcquireCtx over a string key: %v", err)
		}
		if err := s.Acquire(context.Background(), 1); err == nil || !strings.Contains(err.Error(), "another type") {
			t.Fatalf("Acquire over a string key: %v", err)
		}
		if s.Held() != 0 {
			t.Fatalf("Held: %d", s.Held())
		}
		if got, _ := redis.String(e.do(t, "GET", "netlock:{wt}:sem:permits"), nil); got != "x" {
			t.Fatalf("the foreign key was changed: %q", got)
		}
	})
}

// A lease that is not extended lapses: Lost() closes by the local clock,
// the permits come back in Redis for others, and Release gives the lost
// permits back without a panic, with ErrLockLost from ReleaseCtx.
func TestSemaphoreLeaseLost(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		const expiry = 300 * time.Millisecond
		a := e.newSem(t, "lost", 2, WithExpiry(expiry), WithAutoExtend(false))
		b := e.newSem(t, "lost", 2, WithExpiry(expiry))
		mustAcquire(t, a, 2)
		select {
		case <-a.Lost():
		case <-time.After(10 * time.Second):
			t.Fatal("Lost() not closed after the lease's expiry")
		}
		if e.mini != nil {
			e.mini.FastForward(expiry)
		}
		mustAcquire(t, b, 2) // the lapsed permits came back
		if a.Held() != 0 {
			t.Fatalf("Held after the lease was lost: %d", a.Held())
		}
		if err := a.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrLockLost) {
			t.Fatalf("ReleaseCtx of a lost permit: %v, want ErrLockLost", err)
		}
		a.Release(1) // no panic
		if err := a.ReleaseCtx(context.Background(), 1); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("ReleaseCtx after every lost permit was given back: %v", err)
		}
		b.Release(2)
	})
}

// Waiters of one process get in together, in one call, as far as they fit
// and came before every waiter of another process: a waiter of another
// process that arrived between two of them keeps the second out.
func TestSemaphoreBatchInOrder(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newSem(t, "batch", 4)
		local := e.newSem(t, "batch", 4, WithRetryDelay(time.Hour, time.Hour))
		other := e.newSem(t, "batch", 4, WithRetryDelay(time.Hour, time.Hour))
		mustAcquire(t, holder, 4)
		queue := "netlock:{batch}:sem:queue"
		done := make(chan string, 4)
		acquire := func(s *Semaphore, n int64, name string) {
			go func() {
				if err := s.Acquire(context.Background(), n); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				done <- name
			}()
		}
		acquire(local, 1, "local1")
		eventually(t, 10*time.Second, "local1 queued in Redis", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", queue), nil); return n == 1 })
		acquire(local, 1, "local2")
		// Redis knows local2 waits behind local1 once local's entry names
		// its arrival (local1's process tells it as local2 arrives).
		eventually(t, 10*time.Second, "local's entry in Redis naming local2", func() bool {
			w, _ := redis.String(e.do(t, "HGET", "netlock:{batch}:sem:wants", local.m.waiterID), nil)
			f := strings.Split(w, ":")
			return len(f) >= 5 && f[4] != "0"
		})
		acquire(other, 2, "other")
		eventually(t, 10*time.Second, "other queued in Redis behind local", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", queue), nil); return n == 2 })
		acquire(local, 1, "local3") // after other
		eventually(t, 10*time.Second, "local3 queued in its process", func() bool { local.m.mu.Lock(); defer local.m.mu.Unlock(); return len(local.line()) == 3 })

		// Room for three: local1 and local2 (in one call); other needs 2,
		// and local3, which would fit, came after it.
		holder.Release(3)
		got := map[string]bool{}
		for range 2 {
			select {
			case name := <-done:
				got[name] = true
			case <-time.After(10 * time.Second):
				t.Fatalf("only %v got in after a release of 3", got)
			}
		}
		if !got["local1"] || !got["local2"] {
			t.Fatalf("got in: %v, want local1 and local2", got)
		}
		select {
		case name := <-done:
			t.Fatalf("%s got in with one permit free and other (2) waiting first", name)
		case <-time.After(100 * time.Millisecond):
		}
		holder.Release(1)
		if name := <-done; name != "other" {
			t.Fatalf("got %s, want other", name)
		}
		if local.Held() != 2 || other.Held() != 2 {
			t.Fatalf("Held: local %d, other %d; want 2 and 2", local.Held(), other.Held())
		}
		local.Release(2)
		if name := <-done; name != "local3" {
			t.Fatalf("got %s, want local3", name)
		}
		local.Release(1)
		other.Release(2)
		if got := semOut(t, e, "batch"); got != 0 {
			t.Fatalf("permits out: %d", got)
		}
	})
}

// A call sent again after its reply was lost finds what its first sending
// was granted; a call that reaches Redis after a later one changes nothing.
func TestSemaphoreCallsSentAgainOrLate(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		s := e.newSem(t, "again", 5)
		node := s.m.nodes[0]
		call := func(script *Script, arg string) []int64 {
			t.Helper()
			vals, err := node.Eval(context.Background(), script, semCallKeys(s.keys, arg), []string{arg})
			if err != nil {
				t.Fatal(err)
			}
			return vals
		}
		acq := func(base, seq int, batch string) []int64 {
			return call(semAcquireScript, "v:"+strconv.Itoa(base)+":"+strconv.Itoa(seq)+":5:"+s.m.expiryMS+":me::"+s.placeMS+":"+s.m.tombMS+":::"+batch)
		}
		if got := acq(0, 1, "2@1,1@2"); got[0] != 1 || got[1] != 2 {
			t.Fatalf("first sending: %v, want both granted", got)
		}
		if got := semOut(t, e, "again"); got != 3 {
			t.Fatalf("out: %d", got)
		}
		// Sent again (same batch, a new sequence number): the count says
		// both were granted; nothing more is taken.
		if got := acq(0, 2, "2@1,1@2"); got[0] != 1 || got[1] != 2 {
			t.Fatalf("sent again: %v, want both granted", got)
		}
		if got := semOut(t, e, "again"); got != 3 {
			t.Fatalf("out after sending again: %d, want 3", got)
		}
		// Late: sequence 1 again, after 2 was applied.
		if got := call(semReleaseScript, "v:0:1:::"+s.m.expiryMS+":"+s.m.tombMS); got[0] != semReleaseLate {
			t.Fatalf("a late release: %v, want %d", got, semReleaseLate)
		}
		if got := semOut(t, e, "again"); got != 3 {
			t.Fatalf("out after a late release: %d, want 3", got)
		}
		// The batch changed (the first waiter gave up): a count that no
		// prefix explains is set back to base, then granted anew.
		if got := acq(0, 3, "1@2"); got[0] != 1 || got[1] != 1 {
			t.Fatalf("another batch: %v, want granted", got)
		}
		if got := semOut(t, e, "again"); got != 1 {
			t.Fatalf("out: %d, want 1", got)
		}
		if got := call(semReleaseScript, "v:0:4:::"+s.m.expiryMS+":"+s.m.tombMS); got[0] != 1 {
			t.Fatalf("release: %v", got)
		}
		if got := semOut(t, e, "again"); got != 0 {
			t.Fatalf("out: %d, want 0", got)
		}
		// Late after the release that ended the lease (sequence 3 again,
		// its reply lost, held up on the way): the value's tombstone keeps
		// it from making a lease again that nobody holds.
		if got := acq(0, 3, "1@2"); got[0] != semAcquireLate {
			t.Fatalf("an acquire arriving after the release that ended the lease: %v, want %d (late)", got, semAcquireLate)
		}
		if got := semOut(t, e, "again"); got != 0 {
			t.Fatalf("out after the late acquire: %d, want 0", got)
		}
		// A later call of the process is not late: it takes a lease.
		if got := acq(0, 5, "1@3"); got[0] != 1 || got[1] != 1 {
			t.Fatalf("the next call: %v, want granted", got)
		}
		if got := call(semReleaseScript, "v:0:6:::"+s.m.expiryMS+":"+s.m.tombMS); got[0] != 1 || got[1] != 0 {
			t.Fatalf("release: %v", got)
		}
		// A release that finds no lease (the acquire it follows is still on
		// its way) leaves the tombstone too: the acquire, arriving after
		// it, is late.
		if got := call(semReleaseScript, "u:0:2:::"+s.m.expiryMS+":"+s.m.tombMS); got[0] != semReleaseGone {
			t.Fatalf("a release of a value with no lease: %v, want %d (gone)", got, semReleaseGone)
		}
		if got := call(semAcquireScript, "u:0:1:5:"+s.m.expiryMS+":::"+s.placeMS+":"+s.m.tombMS+":::1@4"); got[0] != semAcquireLate {
			t.Fatalf("an acquire arriving after its release: %v, want %d (late)", got, semAcquireLate)
		}
		if got := call(semReleaseScript, "u:0:1:::"+s.m.expiryMS+":"+s.m.tombMS); got[0] != semReleaseLate {
			t.Fatalf("a release arriving after a later one: %v, want %d (late)", got, semReleaseLate)
		}
		if got := semOut(t, e, "again"); got != 0 {
			t.Fatalf("out at the end: %d, want 0", got)
		}
	})
}

// Inspect reads the size, the permits out, the leases and the waiters,
// across processes, and writes nothing.
func TestSemaphoreInspect(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		a := e.newSem(t, "insp", 3)
		b := e.newSem(t, "insp", 3)
		ctx := context.Background()
		info, err := a.Inspect(ctx)
		if err != nil || !reflect.DeepEqual(info, SemaphoreInfo{}) {
			t.Fatalf("Inspect of an unused semaphore: %+v, %v; want zero", info, err)
		}
		mustAcquire(t, a, 2)
		mustAcquire(t, b, 1)
		waited := make(chan error, 1)
		go func() { waited <- b.Acquire(ctx, 2) }()
		eventually(t, 10*time.Second, "one waiter queued", func() bool { n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{insp}:sem:queue"), nil); return n == 1 })
		info, err = b.Inspect(ctx)
		self := selfHolder(t)
		if want := (SemaphoreInfo{Size: 3, Out: 3, Leases: 2, Waiters: 1, Holders: []string{self, self}}); err != nil || !reflect.DeepEqual(info, want) {
			t.Fatalf("Inspect: %+v, %v; want %+v", info, err, want)
		}
		a.Release(2)
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		info, err = a.Inspect(ctx)
		if want := (SemaphoreInfo{Size: 3, Out: 3, Leases: 1, Waiters: 0, Holders: []string{self}}); err != nil || !reflect.DeepEqual(info, want) {
			t.Fatalf("Inspect after the release: %+v, %v; want %+v", info, err, want)
		}
		b.Release(3)
		e.do(t, "SET", "netlock:{insp}:sem:places", "x")
		if _, err := a.Inspect(ctx); !errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), "another type") {
			t.Fatalf("Inspect over a key of another type: %v", err)
		}
		var zero Semaphore
		if _, err := zero.Inspect(ctx); !errors.Is(err, errZeroSemaphore) {
			t.Fatalf("zero Semaphore: %v", err)
		}
	})
}
