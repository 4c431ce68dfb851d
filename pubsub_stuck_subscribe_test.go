package netlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWatchStopDoesNotWaitForIO: stopping a watch (as an unlock does) does
// not wait for another waiter's subscription that a server does not answer:
// that one holds the Hub's send lock for up to its node timeout, and a
// read lease's last RUnlock used to wait it out, its lease's deadline
// passing meanwhile.
func TestWatchStopDoesNotWaitForIO(t *testing.T) {
	l := newStuckListener("stuck")
	h := NewHub(HubConfig{Listen: func(context.Context, func(string, string)) (Listener, error) { return l, nil }})
	defer func() {
		h.mu.Lock()
		for _, ln := range h.links {
			h.failLocked(ln)
		}
		h.mu.Unlock()
	}()
	w, err := h.watch(context.Background(), "ok", make(chan string, 1))
	if err != nil {
		t.Fatal(err)
	}
	const stuckFor = 2 * time.Second
	stuckDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), stuckFor)
		defer cancel()
		_, err := h.watch(ctx, "stuck", make(chan string, 1))
		stuckDone <- err
	}()
	// Wait until the stuck SUBSCRIBE holds the Hub's send lock.
	eventually(t, time.Second, "the stuck SUBSCRIBE holding the Hub's send lock", func() bool {
		if h.mu.TryLock() {
			h.mu.Unlock()
			return false
		}
		return true
	})
	start := time.Now()
	w.stop()
	if took := time.Since(start); took > stuckFor/4 {
		t.Fatalf("stop took %v: it waited for another waiter's SUBSCRIBE", took)
	}
	if err := <-stuckDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the stuck watch returned %v, want its context's deadline", err)
	}
}
