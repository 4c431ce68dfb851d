package netlock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock/internal/redistest"
)

// Unlock panics only on misuse: a hold lost (the case: Redis stalled
// for 1s under a 500ms expiry), a key deleted behind our back, or Redis not
// answering at unlock all return, log at Warn, and leave m usable.
func TestUnlockNeverPanicsOnWhatRedisDoes(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		t.Run("stalled past the expiry", func(t *testing.T) {
			logs := &logRecords{level: slog.LevelWarn}
			m := e.newMutex(t, "stall", WithExpiry(500*time.Millisecond), WithLogger(slog.New(logs)))
			mustLock(t, m)
			token := m.Token()
			e.server.Pause()
			lost := m.Lost()
			redistest.Within(t, 5*time.Second, "Lost()", func() { <-lost })
			time.Sleep(time.Second - 500*time.Millisecond) // stalled 1s in all: the stall's length
			e.server.Resume()
			if err := recoverErr(m.Unlock); err != nil {
				t.Fatalf("Unlock of a hold lost to a stall: got panic %v, want none", err)
			}
			recs := logs.find(slog.LevelWarn, "lock lost")
			if len(recs) != 1 {
				t.Fatalf("Warn records of the lost hold: got %d, want 1 (all: %+v)", len(recs), logs.recs)
			}
			if got := recs[0].attrs["lock"]; got != "stall" {
				t.Errorf("lost hold's record: lock=%q, want %q", got, "stall")
			}
			if got, want := recs[0].attrs["token"], uintString(token); got != want {
				t.Errorf("lost hold's record: token=%q, want %q", got, want)
			}
			mustLock(t, m) // usable again
			mustUnlock(t, m)
		})
		t.Run("key deleted", func(t *testing.T) {
			m := e.newMutex(t, "deleted", WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
			mustLock(t, m)
			e.do(t, "DEL", "netlock:{deleted}")
			lost := m.Lost()
			redistest.Within(t, 10*time.Second, "Lost()", func() { <-lost })
			if err := recoverErr(m.Unlock); err != nil {
				t.Fatalf("Unlock of a hold whose key was deleted: got panic %v, want none", err)
			}
		})
		t.Run("server down at unlock", func(t *testing.T) {
			logs := &logRecords{level: slog.LevelWarn}
			m := e.newMutex(t, "down", WithExpiry(2*time.Second), WithLogger(slog.New(logs)))
			mustLock(t, m)
			e.server.Stop()
			if err := recoverErr(m.Unlock); err != nil {
				t.Fatalf("Unlock with the server down: got panic %v, want none", err)
			}
			recs := logs.find(slog.LevelWarn, "release not delivered")
			if len(recs) != 1 || !strings.Contains(recs[0].attrs["error"], "node 0") || recs[0].attrs["lock"] != "down" {
				t.Errorf("Warn records of the undelivered release: got %+v, want one naming lock down and node 0", recs)
			}
			e.server.Restart()
			if err := recoverErr(m.Unlock); !errors.Is(err, ErrNotHeld) {
				t.Errorf("second Unlock: got panic %v, want one matching ErrNotHeld", err)
			}
			// Usable again; a release the reconnecting client could not
			// deliver at once is delivered by the reaper.
			mustLock(t, m)
			m.Unlock()
			eventually(t, 10*time.Second, "the lock key gone", func() bool { return !e.exists(t, "netlock:{down}") })
		})
	})
}

func uintString(n uint64) string { return slog.Uint64Value(n).String() }

// WithLogger gets Debug records for acquire, unlock and extend, naming the
// lock and token; without it, only Warn and above reach slog.Default().
func TestLogger(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		logs := &logRecords{level: slog.LevelDebug}
		m := e.newMutex(t, "logged", WithLogger(slog.New(logs)), WithAutoExtend(false))
		mustLock(t, m)
		token := m.Token()
		if err := m.ExtendCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustUnlock(t, m)
		for _, msg := range []string{"netlock: acquire", "netlock: extend", "netlock: unlock"} {
			recs := logs.find(slog.LevelDebug, msg)
			if len(recs) != 1 {
				t.Errorf("Debug records %q: got %d, want 1", msg, len(recs))
				continue
			}
			if recs[0].attrs["lock"] != "logged" || recs[0].attrs["token"] != uintString(token) {
				t.Errorf("record %q: attrs %v, want lock=logged token=%d", msg, recs[0].attrs, token)
			}
		}
		if n := logs.count(slog.LevelWarn); n != 0 {
			t.Errorf("Warn records of a clean hold: got %d, want 0", n)
		}
	})
}

func TestDefaultLoggerWarnOnly(t *testing.T) {
	logs := &logRecords{level: slog.LevelDebug}
	old := slog.Default()
	slog.SetDefault(slog.New(logs))
	t.Cleanup(func() { slog.SetDefault(old) })
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "quiet", WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond))
		mustLock(t, m)
		e.do(t, "DEL", "netlock:{quiet}")
		lost := m.Lost()
		redistest.Within(t, 10*time.Second, "Lost()", func() { <-lost })
		m.Unlock()
	})
	if n := logs.count(slog.LevelDebug); n != 0 {
		t.Errorf("Debug records through slog.Default without WithLogger: got %d, want 0", n)
	}
	if n, want := len(logs.find(slog.LevelWarn, "lock lost")), len(testClients()); n != want {
		t.Errorf("Warn records of the lost holds through slog.Default: got %d, want %d (one per client)", n, want)
	}
}

func TestWithLoggerNil(t *testing.T) {
	_, err := New("x", []Backend{&countingBackend{}}, WithLogger(nil))
	if err == nil || !strings.Contains(err.Error(), "logger is nil") {
		t.Errorf("New with WithLogger(nil): got %v, want an error saying the logger is nil", err)
	}
}

// The Observer hears every acquire (contended or not, handed over or not),
// unlock, extend and lost hold, with the lock's name and token.
func TestObserver(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		var mu sync.Mutex
		var starts []AcquireStart
		var acquires []AcquireDone
		var unlocks []UnlockDone
		var extends []ExtendDone
		var losts []LostHold
		obs := Observer{
			Acquire: func(_ context.Context, a AcquireStart) (context.Context, func(AcquireDone)) {
				mu.Lock()
				starts = append(starts, a)
				mu.Unlock()
				return nil, func(d AcquireDone) {
					mu.Lock()
					acquires = append(acquires, d)
					mu.Unlock()
				}
			},
			Unlock: func(_ context.Context, u UnlockDone) { mu.Lock(); unlocks = append(unlocks, u); mu.Unlock() },
			Extend: func(_ context.Context, x ExtendDone) { mu.Lock(); extends = append(extends, x); mu.Unlock() },
			Lost:   func(l LostHold) { mu.Lock(); losts = append(losts, l); mu.Unlock() },
		}
		m := e.newMutex(t, "seen", WithObserver(obs), WithAutoExtend(false))
		other := e.newMutex(t, "seen")

		// Uncontended, then a TryLock that finds it held elsewhere.
		mustLock(t, m)
		first := m.Token()
		if err := m.ExtendCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustUnlock(t, m)
		mustLock(t, other)
		if m.TryLock() {
			t.Fatal("TryLock of a lock held elsewhere: got true")
		}
		// A waiter that waits for the other client.
		done := make(chan error, 1)
		go func() { done <- m.LockCtx(context.Background()) }()
		// Released only once the waiter is queued in Redis: it has been
		// refused, so its acquire is contended however slow the machine.
		look := []Backend{e.backend(t)}
		eventually(t, 10*time.Second, "the waiter queued in Redis", func() bool {
			info, err := Inspect(context.Background(), "seen", look)
			return err == nil && info.Nodes[0].Waiters == 1
		})
		mustUnlock(t, other)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		second := m.Token()
		mustUnlock(t, m)

		mu.Lock()
		defer mu.Unlock()
		want := []AcquireDone{
			{Name: "seen", Acquired: true, Token: first},
			{Name: "seen", Try: true, Contended: true},
			{Name: "seen", Acquired: true, Token: second, Contended: true},
		}
		if len(acquires) != len(want) {
			t.Fatalf("acquires: got %d, want %d: %+v", len(acquires), len(want), acquires)
		}
		for i, w := range want {
			got := acquires[i]
			if got.Name != w.Name || got.Try != w.Try || got.Acquired != w.Acquired || got.Token != w.Token || got.Contended != w.Contended || got.HandedOver || got.Err != nil || got.Wait <= 0 {
				t.Errorf("acquire %d: got %+v, want %+v with a positive Wait", i, got, w)
			}
		}
		if len(unlocks) != 2 || unlocks[0].Token != first || unlocks[1].Token != second || unlocks[0].Err != nil || unlocks[0].Held <= 0 {
			t.Errorf("unlocks: got %+v, want tokens %d and %d, no error, a positive Held", unlocks, first, second)
		}
		if len(extends) != 1 || extends[0].Token != first || extends[0].Err != nil {
			t.Errorf("extends: got %+v, want one of token %d", extends, first)
		}
		if len(losts) != 0 {
			t.Errorf("lost holds: got %+v, want none", losts)
		}
	})
}

// A local hand-off is an acquire and an unlock like any other, marked as
// such; a lost hold is told once, with its token, even when Unlock finds it
// lost again.
func TestObserverHandOffAndLost(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		var mu sync.Mutex
		var acquires []AcquireDone
		var unlocks []UnlockDone
		var losts []LostHold
		obs := Observer{
			Acquire: func(ctx context.Context, _ AcquireStart) (context.Context, func(AcquireDone)) {
				return ctx, func(d AcquireDone) { mu.Lock(); acquires = append(acquires, d); mu.Unlock() }
			},
			Unlock: func(_ context.Context, u UnlockDone) { mu.Lock(); unlocks = append(unlocks, u); mu.Unlock() },
			Lost:   func(l LostHold) { mu.Lock(); losts = append(losts, l); mu.Unlock() },
		}
		m := e.newMutex(t, "handed", WithObserver(obs), WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond), WithLogger(slog.New(slog.DiscardHandler)))
		mustLock(t, m)
		done := make(chan error, 1)
		go func() { done <- m.LockCtx(context.Background()) }()
		eventually(t, 10*time.Second, "the waiter queued in this process", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return len(m.waiters) == 1 })
		token := m.Token()
		m.Unlock() // handed over
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		e.do(t, "DEL", "netlock:{handed}")
		lost := m.Lost()
		redistest.Within(t, 10*time.Second, "Lost()", func() { <-lost })
		m.Unlock()

		mu.Lock()
		defer mu.Unlock()
		if len(acquires) != 2 || !acquires[1].HandedOver || !acquires[1].Contended || acquires[1].Token != token {
			t.Errorf("acquires: got %+v, want the second handed over with token %d", acquires, token)
		}
		if len(unlocks) != 2 || !unlocks[0].HandedOver || !errors.Is(unlocks[1].Err, ErrLockLost) {
			t.Errorf("unlocks: got %+v, want a hand-off, then ErrLockLost", unlocks)
		}
		if len(losts) != 1 || losts[0].Token != token || losts[0].Name != "handed" || losts[0].Reason != LostExtend {
			t.Errorf("lost holds: got %+v, want one of token %d, reason LostExtend", losts, token)
		}
	})
}

// The context Observer.Acquire returns is the one the acquire's calls to
// the Backends carry, so a client library's spans nest under the acquire's.
func TestObserverContextReachesBackend(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		b := &ctxSeenBackend{Backend: e.backend(t)}
		obs := Observer{Acquire: func(ctx context.Context, _ AcquireStart) (context.Context, func(AcquireDone)) {
			return context.WithValue(ctx, observerKey{}, true), nil
		}}
		m, err := New("ctx", []Backend{b}, WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		if !m.TryLock() {
			t.Fatal("TryLock: got false")
		}
		if got := b.seen.Load(); got != 1 {
			t.Errorf("acquire calls carrying the observer's context: got %d, want 1 (without: %d)", got, b.unseen.Load())
		}
		mustUnlock(t, m)
	})
}
