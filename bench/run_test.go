package main

import (
	"context"
	"sync"
	"testing"
	"time"
)

// noLock excludes nothing: the guards must see it.
type noLock struct{}

func (noLock) lock(context.Context) (func(context.Context) error, error) {
	return func(context.Context) error { return nil }, nil
}

// localLock is a sync.Mutex as a locker.
type localLock struct{ mu *sync.Mutex }

func (l localLock) lock(context.Context) (func(context.Context) error, error) {
	l.mu.Lock()
	return func(context.Context) error { l.mu.Unlock(); return nil }, nil
}

func TestContendedGuardsSeeOverlaps(t *testing.T) {
	lockers := make([]locker, 8)
	for i := range lockers {
		lockers[i] = noLock{}
	}
	r := runContended(context.Background(), 200*time.Millisecond, lockers)
	if r.overlaps == 0 && r.lost == 0 {
		t.Fatalf("no lock at all: got 0 overlaps and 0 lost updates over %d critical sections, want some", r.ops)
	}
}

func TestContendedMutex(t *testing.T) {
	mu := &sync.Mutex{}
	lockers := make([]locker, 8)
	for i := range lockers {
		lockers[i] = localLock{mu}
	}
	r := runContended(context.Background(), 200*time.Millisecond, lockers)
	if r.overlaps != 0 || r.lost != 0 || r.errs != 0 {
		t.Fatalf("sync.Mutex: got %d overlaps, %d lost, %d errors, want 0", r.overlaps, r.lost, r.errs)
	}
	// Every acquisition but the first follows one: by the same worker or not.
	if r.ops == 0 || r.selfs+r.changes != r.ops-1 {
		t.Fatalf("got %d critical sections, %d self-reacquisitions + %d changes, want critical sections − 1", r.ops, r.selfs, r.changes)
	}
	var sum int64
	for _, n := range r.perWorker {
		sum += n
	}
	if sum != r.ops {
		t.Fatalf("acquisitions per worker sum to %d, want %d", sum, r.ops)
	}
}

func TestPct(t *testing.T) {
	r := result{lat: []int64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}} {
		if got, _ := r.pct(c.q); got != c.want {
			t.Errorf("pct(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if _, ok := (&result{}).pct(0.5); ok {
		t.Error("pct of no samples: got ok, want not ok")
	}
}
