package netlock

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/netlock-go/netlock/internal/redistest"
)

// kept returns how many lock objects c keeps.
func (c *Client) kept() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mutexes) + len(c.rws) + len(c.sems)
}

func newTestClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	srv := miniredis.RunT(t)
	c, err := NewClient([]Backend{newBackend(t, "redigo", srv.Addr())}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClientShares: goroutines asking a Client for one name get one lock
// object, so that they hand the hold on locally: one acquire in Redis
// serves several of them.
func TestClientShares(t *testing.T) {
	c := newTestClient(t)
	a, err := c.Mutex("shared")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := c.Mutex("shared")
	if a != b {
		t.Fatal("two Mutex calls for one name in use: got two lock objects, want one")
	}
	if other, _ := c.Mutex("other"); other == a {
		t.Fatal("two names: got one lock object")
	}
	rw1, _ := c.RWMutex("shared")
	rw2, _ := c.RWMutex("shared")
	s1, _ := c.Semaphore("shared", 2)
	s2, _ := c.Semaphore("shared", 2)
	s3, _ := c.Semaphore("shared", 3)
	if rw1 != rw2 || s1 != s2 || s1 == s3 {
		t.Fatalf("RWMutex shared %v, Semaphore of one size shared %v, of two sizes shared %v; want true, true, false", rw1 == rw2, s1 == s2, s1 == s3)
	}
	if own, _ := c.Mutex("shared", WithExpiry(3*time.Second)); own == a {
		t.Fatal("Mutex with options of its own: got the shared lock object")
	}

	var acquires atomic.Int64
	obs, _ := NewClient(c.backends, WithObserver(Observer{Acquire: func(ctx context.Context, _ AcquireStart) (context.Context, func(AcquireDone)) {
		return ctx, func(d AcquireDone) {
			if d.Acquired && !d.HandedOver {
				acquires.Add(1)
			}
		}
	}}))
	var wg sync.WaitGroup
	var in, max atomic.Int64
	for range 4 {
		wg.Go(func() {
			for range 25 {
				m, err := obs.Mutex("handon")
				if err != nil {
					t.Error(err)
					return
				}
				m.Lock()
				if n := in.Add(1); n > max.Load() {
					max.Store(n)
				}
				time.Sleep(100 * time.Microsecond) // a critical section others queue behind
				in.Add(-1)
				m.Unlock()
			}
		})
	}
	wg.Wait()
	if max.Load() != 1 {
		t.Fatalf("%d goroutines inside at once, want 1", max.Load())
	}
	if n := acquires.Load(); n >= 100 {
		t.Fatalf("100 sections made %d acquires in Redis: the goroutines did not share the lock object", n)
	}
	t.Logf("100 sections of 4 goroutines, %d acquires in Redis", acquires.Load())
}

// TestClientForgets: a lock object nobody refers to is forgotten, so
// locking many distinct names keeps memory bounded.
//
// $NETLOCK_CLIENT_NAMES sets how many names (default 20,000).
func TestClientForgets(t *testing.T) {
	srv := redistest.Start(t) // a server of its own process: the heap is the client's alone
	c, err := NewClient([]Backend{newBackend(t, "rueidis", srv.Addr())})
	if err != nil {
		t.Fatal(err)
	}
	names := 20000
	if v := os.Getenv("NETLOCK_CLIENT_NAMES"); v != "" {
		if names, err = strconv.Atoi(v); err != nil || names < 1 {
			t.Fatalf("NETLOCK_CLIENT_NAMES=%q: want a count", v)
		}
	}
	ctx := context.Background()
	start := time.Now()
	var peak uint64
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range names {
		m, err := c.Mutex("name:" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.LockCtx(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.UnlockCtx(ctx); err != nil {
			t.Fatal(err)
		}
		if i%10000 == 0 {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		}
	}
	took := time.Since(start)
	// A released lock object is kept by its watchdog's timer until that
	// fires (an extend interval, expiry/3, after its last hold began), and
	// cleanups run after a collection, on a goroutine of the runtime's.
	eventually(t, 15*time.Second, "the lock objects of names nobody uses forgotten", func() bool {
		runtime.GC()
		return c.kept() <= 100
	})
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("%d names locked and unlocked in %v: %d lock objects kept after; heap %d KiB before, peak %d KiB (sampled every 10,000), %d KiB after",
		names, took.Round(time.Millisecond), c.kept(), before.HeapAlloc>>10, peak>>10, after.HeapAlloc>>10)
}

// TestClientBadInput: NewClient validates the backends and options as New
// does; a zero Client says so.
func TestClientBadInput(t *testing.T) {
	srv := miniredis.RunT(t)
	b := newBackend(t, "redigo", srv.Addr())
	for _, tc := range []struct {
		what     string
		backends []Backend
		opts     []Option
	}{
		{"no backends", nil, nil},
		{"nil backend", []Backend{nil}, nil},
		{"the same backend twice", []Backend{b, b}, nil},
		{"bad expiry", []Backend{b}, []Option{WithExpiry(-time.Second)}},
		{"nil option", []Backend{b}, []Option{nil}},
	} {
		if c, err := NewClient(tc.backends, tc.opts...); err == nil || c != nil {
			t.Errorf("NewClient with %s: got %v, %v; want an error", tc.what, c, err)
		}
	}
	c, err := NewClient([]Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex(""); err == nil {
		t.Error("Mutex(\"\"): got nil error, want New's")
	}
	if _, err := c.Semaphore("s", 0); err == nil {
		t.Error("Semaphore of size 0: got nil error, want NewSemaphore's")
	}
	var zero Client
	if _, err := zero.Mutex("x"); !errors.Is(err, errZeroClient) {
		t.Errorf("zero Client's Mutex: got %v, want %v", err, errZeroClient)
	}
	if _, err := zero.Inspect(context.Background(), "x"); !errors.Is(err, errZeroClient) {
		t.Errorf("zero Client's Inspect: got %v, want %v", err, errZeroClient)
	}
}

// TestTryDo: TryDo runs fn only when the lock is free, and reports whether
// it ran; a holder elsewhere makes it skip at once.
func TestTryDo(t *testing.T) {
	c := newTestClient(t)
	ctx := context.Background()
	m, _ := c.Mutex("job")
	v, ran, err := TryDo(ctx, m, func(ctx context.Context) (int, error) { return 7, errors.New("job failed") })
	if v != 7 || !ran || err == nil || err.Error() != "job failed" {
		t.Fatalf("TryDo on a free lock: got %d, %v, %v; want 7, true, job failed", v, ran, err)
	}
	other, _ := c.Mutex("job", WithExpiry(8*time.Second)) // a lock object of its own, as another process's
	mustLock(t, other)
	start := time.Now()
	v, ran, err = TryDo(ctx, m, func(ctx context.Context) (int, error) {
		t.Error("fn ran while another held the lock")
		return 1, nil
	})
	if v != 0 || ran || err != nil {
		t.Fatalf("TryDo on a held lock: got %d, %v, %v; want 0, false, nil", v, ran, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("TryDo on a held lock took %v: it must not wait", d)
	}
	other.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ran, err := TryDo(cctx, m, func(ctx context.Context) (int, error) { return 1, nil }); ran || !errors.Is(err, context.Canceled) {
		t.Fatalf("TryDo with an ended ctx: got %v, %v; want false and ctx's error", ran, err)
	}
	if ok, err := m.TryLockCtx(ctx); !ok || err != nil {
		t.Fatalf("after TryDo: TryLockCtx %v, %v; want the lock free", ok, err)
	}
	m.Unlock()
}
