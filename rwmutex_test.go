package netlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

func TestRWReadersShareWritersExclude(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		ctx := context.Background()
		a, b, c := e.newRW(t, "rw"), e.newRW(t, "rw"), e.newRW(t, "rw")
		a.RLock()
		b.RLock()
		if c.TryLock() {
			t.Fatal("TryLock succeeded while two processes read")
		}
		if !c.TryRLock() {
			t.Fatal("TryRLock failed while only readers hold")
		}
		c.RUnlock()
		got := make(chan error, 1)
		go func() { got <- c.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the writer queued", func() bool { return e.do(t, "ZCARD", DefaultPrefix+"{rw}:rw:writers") == int64(1) })
		select {
		case err := <-got:
			t.Fatalf("writer got in while readers hold: %v", err)
		default:
		}
		// A waiting writer keeps new readers of other processes out.
		if a2 := e.newRW(t, "rw"); a2.TryRLock() {
			t.Fatal("a new reader got in while a writer waits")
		}
		a.RUnlock()
		b.RUnlock()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		tok := c.Token()
		if tok == 0 {
			t.Fatal("writer has no fencing token")
		}
		if a.TryRLock() || b.TryLock() {
			t.Fatal("a reader or writer got in while a writer holds")
		}
		c.Unlock()
		b.Lock()
		if b.Token() <= tok {
			t.Fatalf("token %d after %d", b.Token(), tok)
		}
		b.Unlock()
		// Nothing left behind.
		for _, k := range []string{DefaultPrefix + "{rw}:rw", DefaultPrefix + "{rw}:rw:writers", DefaultPrefix + "{rw}:rw:readers", DefaultPrefix + "{rw}:rw:leases"} {
			if e.exists(t, k) {
				t.Errorf("%s left behind", k)
			}
		}
	})
}

func TestRWMisusePanics(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		rw := e.newRW(t, "misuse")
		if err := recoverErr(rw.RUnlock); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("RUnlock without RLock: %v", err)
		}
		if err := recoverErr(rw.Unlock); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Unlock without Lock: %v", err)
		}
		rw.RLock()
		if err := recoverErr(rw.Unlock); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Unlock while read-locked: %v", err)
		}
		rw.RUnlock()
		var zero NetRWMutex
		if err := recoverErr(zero.RLock); !errors.Is(err, errZeroRW) {
			t.Fatalf("zero value RLock: %v", err)
		}
		if _, err := NewRW("", []Backend{e.backend(t)}); err == nil {
			t.Fatal("NewRW accepted an empty name")
		}
	})
}

// TestRWSharedLease: the readers of one process cost one lease in Redis.
func TestRWSharedLease(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		rw := e.newRW(t, "shared")
		var wg sync.WaitGroup
		start := make(chan struct{})
		in := make(chan struct{}, 1000)
		for range 1000 {
			wg.Go(func() {
				<-start
				rw.RLock()
				in <- struct{}{}
			})
		}
		close(start)
		for range 1000 {
			<-in
		}
		if n := e.do(t, "ZCARD", DefaultPrefix+"{shared}:rw:leases"); n != int64(1) {
			t.Fatalf("%v leases for 1000 readers of one process", n)
		}
		for range 1000 {
			rw.RUnlock()
		}
		wg.Wait()
		if e.exists(t, DefaultPrefix+"{shared}:rw:leases") {
			t.Fatal("lease left after the last RUnlock")
		}
	})
}

// TestRWReadersBeforeLaterWriter: readers waiting behind a writer all get
// in when it leaves, before a writer that came after them.
func TestRWReadersBeforeLaterWriter(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		ctx := context.Background()
		w1 := e.newRW(t, "order")
		w1.Lock()
		var readers [3]*NetRWMutex
		var in atomic.Int64
		var wg sync.WaitGroup
		for i := range readers {
			readers[i] = e.newRW(t, "order")
			wg.Go(func() {
				readers[i].RLock()
				in.Add(1)
			})
		}
		eventually(t, 5*time.Second, "the three readers queued", func() bool { return e.do(t, "ZCARD", DefaultPrefix+"{order}:rw:readers") == int64(3) })
		w2 := e.newRW(t, "order")
		w2in := make(chan int64, 1)
		go func() {
			if err := w2.LockCtx(ctx); err != nil {
				t.Error(err)
			}
			w2in <- in.Load()
		}()
		eventually(t, 5*time.Second, "the later writer queued", func() bool { return e.do(t, "ZCARD", DefaultPrefix+"{order}:rw:writers") == int64(1) })
		w1.Unlock()
		wg.Wait()
		for _, r := range readers {
			r.RUnlock()
		}
		if n := <-w2in; n != 3 {
			t.Fatalf("the later writer got in with %d of 3 waiting readers in before it", n)
		}
		w2.Unlock()
	})
}

// TestRWWriterNotStarved: readers of two processes overlapping all the time
// do not keep a writer out.
func TestRWWriterNotStarved(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var c rwChecker
		for range 2 {
			rw := e.newRW(t, "starve", WithExpiry(900*time.Millisecond))
			for range 3 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						rw.RLock()
						c.read(time.Duration(rand.N(5)) * time.Millisecond)
						rw.RUnlock()
					}
				})
			}
		}
		eventually(t, 5*time.Second, "the readers reading", func() bool { return c.reads.Load() >= 6 })
		w := e.newRW(t, "starve", WithExpiry(900*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range 3 {
			if err := w.LockCtx(ctx); err != nil {
				t.Fatalf("writer starved: %v (reads %d)", err, c.reads.Load())
			}
			c.write(time.Millisecond)
			w.Unlock()
		}
		close(stop)
		wg.Wait()
		if v := c.violations.Load(); v != 0 {
			t.Fatalf("%d overlaps", v)
		}
	})
}

// TestRWExclusion runs readers and writers of several processes at random
// and checks that a writer never overlaps anyone.
func TestRWExclusion(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		var c rwChecker
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Second)
		var last atomic.Uint64
		for p := range 4 {
			rw := e.newRW(t, "excl")
			for g := range 3 {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if (p+g)%3 == 0 && rand.N(3) == 0 {
							rw.Lock()
							tok := rw.Token()
							// Never down; the same when handed to
							// another writer of the process.
							if prev := last.Swap(tok); tok < prev {
								t.Errorf("token %d after %d", tok, prev)
							}
							c.write(time.Duration(rand.N(2)) * time.Millisecond)
							rw.Unlock()
						} else {
							rw.RLock()
							c.read(time.Duration(rand.N(2)) * time.Millisecond)
							rw.RUnlock()
						}
					}
				})
			}
		}
		wg.Wait()
		if v := c.violations.Load(); v != 0 {
			t.Fatalf("%d overlaps (%d reads, %d writes)", v, c.reads.Load(), c.writes.Load())
		}
		if c.writes.Load() == 0 || c.reads.Load() == 0 {
			t.Fatalf("%d reads, %d writes", c.reads.Load(), c.writes.Load())
		}
		t.Logf("%d reads, %d writes", c.reads.Load(), c.writes.Load())
	})
}

// TestRWCancelLeavesNothing: a reader and a writer giving up while waiting
// leave no place in the queues, and the readers a cancelled writer kept
// out get in at once.
func TestRWCancelLeavesNothing(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		r := e.newRW(t, "cancel")
		r.RLock()
		w := e.newRW(t, "cancel")
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := w.LockCtx(ctx); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockCtx: %v", err)
		}
		if e.exists(t, DefaultPrefix+"{cancel}:rw:writers") {
			t.Fatal("a cancelled writer left its place")
		}
		// No writer waits: a new reader of another process gets in.
		if r2 := e.newRW(t, "cancel"); !r2.TryRLock() {
			t.Fatal("a reader was kept out by a writer that gave up")
		} else {
			r2.RUnlock()
		}
		r.RUnlock()
		w.Lock()
		rd := e.newRW(t, "cancel")
		ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel2()
		if err := rd.RLockCtx(ctx2); !errors.Is(err, ErrNotObtained) {
			t.Fatalf("RLockCtx: %v", err)
		}
		w.Unlock()
		for _, k := range []string{DefaultPrefix + "{cancel}:rw", DefaultPrefix + "{cancel}:rw:writers", DefaultPrefix + "{cancel}:rw:readers", DefaultPrefix + "{cancel}:rw:leases"} {
			if e.exists(t, k) {
				t.Errorf("%s left behind: %v", k, e.do(t, "TYPE", k))
			}
		}
	})
}

// TestRWReaderAfterWriterGaveUp: a writer of another process waits, the read
// lease of a process learns it (its extend), and the writer gives up. No
// writer holds or waits any more: a new reader of that process must get in
// (RLockCtx waits only "while a writer holds it or waits for it"), as a
// reader of a third process does, and not wait for the process's other
// readers to leave: a lease's extends say what the nodes say, and a writer
// that gives up is told on p{name}:rw:joined.
func TestRWReaderAfterWriterGaveUp(t *testing.T) {
	srv := miniredis.RunT(t)
	newRW := func() *NetRWMutex {
		rw, err := NewRW("gaveup", []Backend{newBackend(t, "redigo", srv.Addr())}, WithExpiry(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return rw
	}
	ctx := context.Background()
	a, b, c := newRW(), newRW(), newRW()
	a.RLock() // a long read, under way all along
	defer a.RUnlock()

	bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- b.LockCtx(bctx) }()
	writers := a.keys.Writers
	eventually(t, 5*time.Second, "the writer queued", func() bool { return srv.Exists(writers) })
	// The lease's next extend (its watchdog's, every expiry/3) learns
	// that a writer waits.
	if err := a.r.extendCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrNotObtained) {
		t.Fatalf("the writer's LockCtx: got %v, want ErrNotObtained", err)
	}
	if srv.Exists(writers) {
		t.Fatal("the writer that gave up left its place")
	}
	// No writer holds or waits: a reader of another process gets in...
	if !c.TryRLock() {
		t.Fatal("a reader of another process was kept out after the writer gave up")
	}
	c.RUnlock()
	// ... and so must a second reader of a's process.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	if err := a.RLockCtx(rctx); err != nil {
		t.Fatalf("a second reader of a process reading, with no writer holding or waiting: %v", err)
	}
	a.RUnlock()
}

// TestRWReaderAfterOwnWriterGaveUp: the same with a writer of the reading
// process itself: a reader that arrives while it waits waits too, but once
// it gives up no writer holds or waits, and the reader must get in.
func TestRWReaderAfterOwnWriterGaveUp(t *testing.T) {
	srv := miniredis.RunT(t)
	a, err := NewRW("owngaveup", []Backend{newBackend(t, "redigo", srv.Addr())}, WithExpiry(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a.RLock() // a long read, under way all along
	defer a.RUnlock()

	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- a.LockCtx(wctx) }()
	eventually(t, 5*time.Second, "the writer queued", func() bool { return srv.Exists(a.keys.Writers) })
	// A second reader arrives while the writer waits, and waits; the
	// writer gives up at 300ms.
	rctx, rcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer rcancel()
	start := time.Now()
	err = a.RLockCtx(rctx)
	if werr := <-errc; !errors.Is(werr, ErrNotObtained) {
		t.Fatalf("the writer's LockCtx: got %v, want ErrNotObtained", werr)
	}
	if err != nil {
		t.Fatalf("a second reader, waiting while a writer of its process waits, after that writer gave up (%v ago): %v", time.Since(start)-300*time.Millisecond, err)
	}
	a.RUnlock()
}

// TestRWObserverKinds: an Observer tells a read lease from the write lock.
func TestRWObserverKinds(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		var mu sync.Mutex
		var kinds []Kind
		o := Observer{Unlock: func(_ context.Context, u UnlockDone) {
			mu.Lock()
			kinds = append(kinds, u.Kind)
			mu.Unlock()
		}}
		rw := e.newRW(t, "kinds", WithObserver(o))
		rw.RLock()
		rw.RUnlock()
		rw.Lock()
		rw.Unlock()
		m := e.newMutex(t, "kinds", WithObserver(o))
		mustLock(t, m)
		mustUnlock(t, m)
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(kinds) != "[read write mutex]" {
			t.Fatalf("unlock kinds %v, want [read write mutex]", kinds)
		}
	})
}

// TestRWEndedCtx: a reader whose ctx has ended does not join a lease, even
// one it could join without a round trip.
func TestRWEndedCtx(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		rw := e.newRW(t, "ended")
		rw.RLock()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := rw.RLockCtx(ctx); !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("RLockCtx with an ended ctx: %v", err)
		}
		if ok, err := rw.TryRLockCtx(ctx); ok || !errors.Is(err, context.Canceled) {
			t.Fatalf("TryRLockCtx with an ended ctx: %v, %v", ok, err)
		}
		rw.RUnlock()
		if err := rw.RUnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("a reader with an ended ctx was counted: RUnlockCtx %v", err)
		}
	})
}

// TestRWExpiredLeaseRelease: a read lease that expired on the server
// (its deadline passed by the server's clock: here the server's clock runs
// ahead of the client's) is lost, as an expired write lock is: its release
// reports ErrLockLost, as rw_extend.lua and NetMutex's release do, and not
// success: rw_release.lua compares the lease's deadline with the server's
// TIME.
func TestRWExpiredLeaseRelease(t *testing.T) {
	srv := miniredis.RunT(t)
	now := time.Now()
	srv.SetTime(now)
	srv.ClockTTL(true)
	const expiry = 3 * time.Second
	rw, err := NewRW("expired", []Backend{newBackend(t, "redigo", srv.Addr())}, WithExpiry(expiry))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	rw.Lock()
	srv.SetTime(now.Add(expiry + time.Millisecond))
	if err := rw.UnlockCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("UnlockCtx of a write lock expired on the server: got %v, want ErrLockLost", err)
	}

	// The leases' key outlives our lease when another process's lease
	// came later.
	other, err := NewRW("expired", []Backend{newBackend(t, "redigo", srv.Addr())}, WithExpiry(expiry))
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(expiry + time.Millisecond)
	rw.RLock()
	srv.SetTime(now.Add(expiry / 2))
	other.RLock()
	defer other.RUnlock()
	srv.SetTime(now.Add(expiry + time.Millisecond))
	if err := rw.RUnlockCtx(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("RUnlockCtx of a read lease expired on the server: got %v, want ErrLockLost", err)
	}
}

// TestRWLocalReadersBeforeLaterWriter: the readers of one process that wait
// behind a writer all get in when it leaves, before a writer of another
// process that came after them, though one of them asked Redis for the
// lease on behalf of all.
func TestRWLocalReadersBeforeLaterWriter(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		w1 := e.newRW(t, "localorder")
		w1.Lock()
		r := e.newRW(t, "localorder")
		var in atomic.Int64
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				if err := r.RLockCtx(ctx); err != nil {
					return // the later writer went first: counted below
				}
				in.Add(1)
			})
		}
		eventually(t, 5*time.Second, "the process's readers queued", func() bool { return e.do(t, "ZCARD", DefaultPrefix+"{localorder}:rw:readers") == int64(1) })
		// The other four wait for the lease being acquired. Nothing counts
		// the readers waiting for it, so this is a pause, not an observed
		// event.
		time.Sleep(20 * time.Millisecond)
		w2 := e.newRW(t, "localorder")
		w2in := make(chan int64, 1)
		go func() {
			if err := w2.LockCtx(context.Background()); err != nil {
				t.Error(err)
			}
			w2in <- in.Load()
		}()
		eventually(t, 5*time.Second, "the later writer queued", func() bool { return e.do(t, "ZCARD", DefaultPrefix+"{localorder}:rw:writers") == int64(1) })
		w1.Unlock()
		wg.Wait()
		for range in.Load() {
			r.RUnlock()
		}
		if n := <-w2in; n != 5 {
			t.Fatalf("the later writer got in with %d of 5 waiting readers in before it", n)
		}
		w2.Unlock()
	})
}
