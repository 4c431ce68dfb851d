package netlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/netlock-go/netlock/internal/redistest"
)

func TestExpiryFreesTheLock(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		a := e.newMutex(t, "expiry", WithExpiry(time.Second), WithAutoExtend(false))
		b := e.newMutex(t, "expiry")
		mustLock(t, a)
		if b.TryLock() {
			t.Fatal("b.TryLock while a holds it: got true, want false")
		}
		e.mini.FastForward(1100 * time.Millisecond)
		if !b.TryLock() {
			t.Fatal("b.TryLock after a's key expired: got false, want true")
		}
		if tb, ta := b.Token(), a.Token(); tb <= ta {
			t.Errorf("tokens: b got %d after a's %d, want greater", tb, ta)
		}
		// a's release finds b's value: a's hold was lost, b's key untouched.
		if err := a.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("a.UnlockCtx after expiry: got %v, want ErrLockLost", err)
		}
		if !e.exists(t, "netlock:{expiry}") {
			t.Error("a's Unlock deleted b's key")
		}
		b.Unlock()
	})
}

func TestLostByLocalClock(t *testing.T) {
	// With auto-extend off and nothing extending, the hold is lost when its
	// local deadline passes, whatever the server says: miniredis's clock
	// never moves here, so its key would live forever.
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		// The node timeout would be a tenth of the expiry, 10ms: too short
		// for a first call (dial, NOSCRIPT, EVAL) on a loaded machine.
		m := e.newMutex(t, "clock", WithExpiry(100*time.Millisecond), WithAutoExtend(false), WithNodeTimeout(50*time.Millisecond))
		mustLock(t, m)
		lost := m.Lost()
		redistest.Within(t, 10*time.Second, "Lost()", func() { <-lost })
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("ExtendCtx after loss: got %v, want ErrLockLost", err)
		}
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx after loss: got %v, want ErrLockLost", err)
		}
		if e.exists(t, "netlock:{clock}") {
			t.Error("lock key left behind after Unlock of a lost hold")
		}
		// The NetMutex is usable again.
		mustLock(t, m)
		mustUnlock(t, m)
	})
}

func TestLostWhenKeyDeleted(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m := e.newMutex(t, "deleted", WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond))
		mustLock(t, m)
		e.do(t, "DEL", "netlock:{deleted}")
		// The watchdog's next extend (a third of the expiry on) finds the key
		// gone and declares the hold lost at once.
		lost := m.Lost()
		redistest.Within(t, 10*time.Second, "Lost()", func() { <-lost })
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("ExtendCtx: got %v, want ErrLockLost", err)
		}
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx: got %v, want ErrLockLost", err)
		}
	})
}

func TestExtendKeepsHold(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		a := e.newMutex(t, "extend", WithExpiry(8*time.Second), WithAutoExtend(false))
		b := e.newMutex(t, "extend")
		mustLock(t, a)
		e.mini.FastForward(5 * time.Second)
		if err := a.ExtendCtx(context.Background()); err != nil {
			t.Fatalf("ExtendCtx: %v", err)
		}
		e.mini.FastForward(5 * time.Second) // 10s after the lock, 2s past the first expiry
		if b.TryLock() {
			t.Fatal("b.TryLock past the original expiry of an extended hold: got true, want false")
		}
		if err := a.ExtendCtx(context.Background()); err != nil {
			t.Errorf("second ExtendCtx: %v", err)
		}
		mustUnlock(t, a)
		if err := a.ExtendCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("ExtendCtx after Unlock: got %v, want ErrNotHeld", err)
		}
	})
}

func TestAutoExtend(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m := e.newMutex(t, "auto", WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond))
		other := e.newMutex(t, "auto")
		mustLock(t, m)
		// Hold for five expiries of real time. miniredis's clock only moves
		// when told, so move it along with ours.
		for range 10 {
			time.Sleep(150 * time.Millisecond)
			if e.mini != nil {
				e.mini.FastForward(150 * time.Millisecond)
			}
		}
		select {
		case <-m.Lost():
			t.Fatal("hold lost although auto-extend is on")
		default:
		}
		if other.TryLock() {
			t.Fatal("another client took an auto-extended lock")
		}
		mustUnlock(t, m)
	})
}

func TestCancelWhileWaiting(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		holder := e.newMutex(t, "cancel")
		waiter := e.newMutex(t, "cancel")
		mustLock(t, holder)

		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- waiter.LockCtx(ctx) }()
		eventually(t, 5*time.Second, "the waiter queued", func() bool {
			n, _ := redis.Int(e.do(t, "ZCARD", "netlock:{cancel}:waiters"), nil)
			return n == 1
		})
		cancel()
		var err error
		redistest.Within(t, 5*time.Second, "LockCtx after cancel", func() { err = <-errc })
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Errorf("LockCtx: got %v, want an error matching ErrNotObtained and context.Canceled", err)
		}
		mustUnlock(t, holder)
		if e.exists(t, "netlock:{cancel}") {
			t.Error("lock key left behind by the cancelled waiter")
		}
		if err := waiter.UnlockCtx(context.Background()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("waiter.UnlockCtx: got %v, want ErrNotHeld", err)
		}
	})
}

func TestCancelWhileWaitingLocally(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "local")
		mustLock(t, m)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		err := m.LockCtx(ctx)
		if !errors.Is(err, ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("LockCtx behind a local holder: got %v, want ErrNotObtained and DeadlineExceeded", err)
		}
		if ok, err := m.TryLockCtx(context.Background()); ok || err != nil {
			t.Errorf("TryLockCtx behind a local holder: got (%v, %v), want (false, nil)", ok, err)
		}
		mustUnlock(t, m)
	})
}

func TestDo(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "do")
		got, err := Do(context.Background(), m, func(ctx context.Context) (string, error) {
			if m.Token() == 0 {
				t.Error("Token inside Do: got 0, want the hold's token")
			}
			return "done", nil
		})
		if got != "done" || err != nil {
			t.Errorf("Do: got (%q, %v), want (\"done\", nil)", got, err)
		}

		fnErr := errors.New("fn failed")
		if _, err := Do(context.Background(), m, func(context.Context) (int, error) { return 0, fnErr }); !errors.Is(err, fnErr) {
			t.Errorf("Do with a failing fn: got %v, want fn's error", err)
		}

		// A panic in fn unlocks and goes on.
		if p := recoverErr(func() {
			Do(context.Background(), m, func(context.Context) (int, error) { panic(errors.New("boom")) })
		}); p == nil || p.Error() != "boom" {
			t.Errorf("Do with a panicking fn: got panic %v, want boom", p)
		}
		if e.exists(t, "netlock:{do}") {
			t.Error("lock key left behind after a panic in Do")
		}
		if !m.TryLock() {
			t.Fatal("TryLock after a panic in Do: got false, want true")
		}
		m.Unlock()
	})
}

func TestDoCancelsOnLoss(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "doloss", WithExpiry(300*time.Millisecond), WithNodeTimeout(100*time.Millisecond))
		_, err := Do(context.Background(), m, func(ctx context.Context) (int, error) {
			e.do(t, "DEL", "netlock:{doloss}")
			var cause error
			redistest.Within(t, 10*time.Second, "fn's context", func() { <-ctx.Done(); cause = context.Cause(ctx) })
			if !errors.Is(cause, ErrLockLost) {
				t.Errorf("cause of fn's context: got %v, want ErrLockLost", cause)
			}
			return 0, ctx.Err()
		})
		if !errors.Is(err, ErrLockLost) {
			t.Errorf("Do: got %v, want an error matching ErrLockLost", err)
		}
	})
}

func TestUnlockFromAnotherGoroutine(t *testing.T) {
	forEachEnv(t, miniOnly, func(t *testing.T, e *env) {
		m := e.newMutex(t, "handover")
		mustLock(t, m)
		var wg sync.WaitGroup
		wg.Go(func() { m.Unlock() })
		wg.Wait()
		mustLock(t, m)
		mustUnlock(t, m)
	})
}
