package netlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Regression tests for NetRWMutex, found while writing TestRWProperty: a
// read lease that learned that a writer waits forgot it only when the lease
// ended, so a reader parked behind a writer that gave up waited for the
// process's other readers (now: extends say what the nodes say, and a
// writer that gives up is told on p{name}:rw:joined); a read lease that
// had expired on the server was released with success (now: rw_release.lua
// compares its deadline with the server's TIME, as rw_extend.lua does).

// TestRWReaderAfterWriterGaveUp: a writer of another process waits, the read
// lease of a process learns it (its extend), and the writer gives up. No
// writer holds or waits any more: a new reader of that process must get in
// (RLockCtx waits only "while a writer holds it or waits for it"), as a
// reader of a third process does, and not wait for the process's other
// readers to leave.
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
	waitUntil(t, func() bool { return srv.Exists(writers) })
	// The lease's next extend (its watchdog's, every expiry/3) learns
	// that a writer waits.
	if err := a.r.ExtendCtx(ctx); err != nil {
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
	waitUntil(t, func() bool { return srv.Exists(a.keys.Writers) })
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

// TestRWExpiredLeaseRelease: a read lease that expired on the server
// (its deadline passed by the server's clock: here the server's clock runs
// ahead of the client's) is lost, as an expired write lock is: its release
// reports ErrLockLost, as rw_extend.lua and NetMutex's release do, and not
// success.
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
