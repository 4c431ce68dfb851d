package netlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// TestMaxHold: a hold under WithMaxHold ends at the bound though the
// watchdog was extending it: Lost() closes then (not at the deadline), the
// key's TTL never reaches past the bound plus the expiry, ExtendCtx refuses
// without extending, and UnlockCtx reports the loss and deletes the key.
func TestMaxHold(t *testing.T) {
	forEachEnv(t, realOnly, func(t *testing.T, e *env) {
		const expiry, bound = 600 * time.Millisecond, 900 * time.Millisecond
		m, err := New("maxhold", []Backend{e.backend(t)}, WithExpiry(expiry), WithMaxHold(bound))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		mustLock(t, m)
		pttl := func() time.Duration {
			ms, err := redis.Int64(e.do(t, "PTTL", "netlock:{maxhold}"), nil)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(ms) * time.Millisecond
		}
		// Extended meanwhile (a third of the expiry), never past the bound:
		// no extend is sent after it, so the key expires by the bound plus
		// the expiry, and the moment the last extend took to reach Redis
		// (in flight: at most inFlight here). The time is read before the
		// PTTL is sent, so that its reply's way back is not counted.
		const inFlight = 5 * time.Millisecond
		for !!isOpen(m.Lost()) && time.Since(start) < 5*time.Second {
			at := time.Since(start)
			if left := pttl(); at+left > bound+expiry+inFlight {
				t.Fatalf("the key's TTL reaches %v after the acquire, past the bound %v plus the expiry %v (and %v for the last extend in flight)", at+left, bound, expiry, inFlight)
			}
			time.Sleep(20 * time.Millisecond) // sampling the TTL, not an ordering
		}
		ended := time.Since(start)
		if !!isOpen(m.Lost()) {
			t.Fatal("Lost() not closed 5s after the acquire")
		}
		if ended < bound || ended > bound+expiry/2 {
			t.Errorf("Lost() closed %v after the acquire; want at the bound %v (the hold was being extended)", ended, bound)
		}
		before := pttl()
		if err := m.ExtendCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("ExtendCtx after the bound: %v, want ErrLockLost", err)
		}
		if after := pttl(); after > before {
			t.Errorf("ExtendCtx after the bound extended the key: TTL %v, then %v", before, after)
		}
		if err := m.UnlockCtx(context.Background()); !errors.Is(err, ErrLockLost) {
			t.Errorf("UnlockCtx after the bound: %v, want ErrLockLost", err)
		}
		if n, _ := redis.Int64(e.do(t, "EXISTS", "netlock:{maxhold}"), nil); n != 0 {
			t.Error("the key is still there after UnlockCtx")
		}
	})
}

// TestMaxHoldDo: Do's fn sees its context end at the bound, with a cause
// matching ErrLockLost that names WithMaxHold, and Do returns the loss.
func TestMaxHoldDo(t *testing.T) {
	forEachEnv(t, allEnvs, func(t *testing.T, e *env) {
		m, err := New("maxholddo", []Backend{e.backend(t)}, WithExpiry(time.Second), WithMaxHold(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var cause error
		_, err = Do(context.Background(), m, func(ctx context.Context) (struct{}, error) {
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(5 * time.Second):
			}
			return struct{}{}, nil
		})
		if !errors.Is(cause, ErrLockLost) || !strings.Contains(cause.Error(), "WithMaxHold's 200ms") {
			t.Errorf("fn's context cause: %v, want ErrLockLost naming WithMaxHold's 200ms", cause)
		}
		if !errors.Is(err, ErrLockLost) {
			t.Errorf("Do: %v, want ErrLockLost", err)
		}
	})
}

// TestMaxHoldBadInput: a negative bound is refused by New, by name.
func TestMaxHoldBadInput(t *testing.T) {
	_, err := New("x", []Backend{newBackend(t, "redigo", "127.0.0.1:1")}, WithMaxHold(-time.Second))
	if err == nil || !strings.Contains(err.Error(), "maximum hold -1s is negative") {
		t.Errorf("WithMaxHold(-1s): %v, want the bound named as negative", err)
	}
}
