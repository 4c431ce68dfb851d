package netlock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// TestMinHold: a NetMutex unlocked before WithMinHold's time leaves its key
// to expire when that time is over: another process, and this one, get in
// then and not before; unlocked after it, the key goes at once.
func TestMinHold(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const least = 700 * time.Millisecond
		a, err := New("minhold", []Backend{e.backend(t)}, WithMinHold(least))
		if err != nil {
			t.Fatal(err)
		}
		b, err := New("minhold", []Backend{e.backend(t)})
		if err != nil {
			t.Fatal(err)
		}
		begun := time.Now()
		mustLock(t, a)
		if err := a.UnlockCtx(context.Background()); err != nil {
			t.Fatalf("UnlockCtx before the minimum: %v", err)
		}
		// The time is read before the PTTL is sent: the server reads the
		// TTL after it, so asked+left is no later than the key's expiry,
		// however long the reply takes on a loaded machine.
		asked := time.Since(begun)
		ms, _ := redis.Int64(e.do(t, "PTTL", "netlock:{minhold}"), nil)
		if left := time.Duration(ms) * time.Millisecond; left <= 0 || asked+left > least+50*time.Millisecond {
			t.Errorf("after an early UnlockCtx the key expires in %v (%v after the acquire); want by the minimum %v", left, asked+left, least)
		}
		for _, m := range []*NetMutex{a, b} {
			if ok, err := m.TryLockCtx(context.Background()); ok || err != nil {
				t.Fatalf("TryLockCtx within the minimum: %v, %v; want false, nil", ok, err)
			}
		}
		mustLock(t, b) // waits for the key to expire
		if took := time.Since(begun); took < least {
			t.Errorf("another process got in %v after the acquire, before the minimum %v", took, least)
		}
		if err := b.UnlockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}

		// Unlocked after the minimum: released at once.
		mustLock(t, a)
		time.Sleep(least) // the hold outlasts the minimum
		if err := a.UnlockCtx(context.Background()); err != nil {
			t.Fatalf("UnlockCtx after the minimum: %v", err)
		}
		if ok, err := b.TryLockCtx(context.Background()); !ok || err != nil {
			t.Fatalf("TryLockCtx after a release past the minimum: %v, %v; want true", ok, err)
		}
		b.UnlockCtx(context.Background())
	})
}

// TestMinHoldRW: WithMinHold bounds a NetRWMutex's write lock: readers get
// in when it is over, not at the early Unlock.
func TestMinHoldRW(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const least = 500 * time.Millisecond
		w, err := NewRW("minholdrw", []Backend{e.backend(t)}, WithMinHold(least))
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewRW("minholdrw", []Backend{e.backend(t)})
		if err != nil {
			t.Fatal(err)
		}
		begun := time.Now()
		if err := w.LockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := w.UnlockCtx(context.Background()); err != nil {
			t.Fatal(err)
		}
		if ok, err := r.TryRLockCtx(context.Background()); ok || err != nil {
			t.Fatalf("TryRLockCtx within the writer's minimum: %v, %v; want false, nil", ok, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.RLockCtx(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begun); took < least {
			t.Errorf("a reader got in %v after the write lock, before its minimum %v", took, least)
		}
		r.RUnlockCtx(context.Background())
	})
}

// TestMinHoldBadInput: a negative minimum is refused by name, and a
// Semaphore refuses any.
func TestMinHoldBadInput(t *testing.T) {
	b := newBackend(t, "redigo", "127.0.0.1:1")
	if _, err := New("x", []Backend{b}, WithMinHold(-time.Second)); err == nil || !strings.Contains(err.Error(), "minimum hold -1s is negative") {
		t.Errorf("WithMinHold(-1s): %v, want the minimum named as negative", err)
	}
	if _, err := NewSemaphore("x", 2, []Backend{b}, WithMinHold(time.Second)); err == nil || !strings.Contains(err.Error(), "WithMinHold applies to a NetMutex") {
		t.Errorf("NewSemaphore with WithMinHold: %v, want it refused by name", err)
	}
}
