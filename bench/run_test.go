package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

func TestCommandStatsSince(t *testing.T) {
	parse := func(info string) commandStats {
		t.Helper()
		s, err := parseCommandStats(info)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := parse("# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:100\r\n\r\n# Commandstats\r\n" +
		"cmdstat_info:calls=4,usec=1,usec_per_call=0.25,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=10,usec=1,usec_per_call=0.10,rejected_calls=0,failed_calls=0\r\n")
	after := parse("# Stats\r\ntotal_commands_processed:161\r\n# Commandstats\r\n" +
		"cmdstat_info:calls=5,usec=1,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=30,usec=7,usec_per_call=0.23,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=20,usec=90,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|tracking:calls=5,usec=1,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_ping:calls=15,usec=1,usec_per_call=0.07,rejected_calls=0,failed_calls=0\r\n")
	n, top := after.since(before)
	// 61 counted, one of them the measuring connection's INFO.
	if n != 60 {
		t.Errorf("commands = %d, want 60", n)
	}
	want := []cmdCount{{"evalsha", 20}, {"get", 20}, {"ping", 15}}
	if !slices.Equal(top, want) {
		t.Errorf("top = %v, want %v", top, want)
	}
	w := waitResult{waiters: 40, window: 2 * time.Second, commands: n}
	if got := w.perWaiterSecond(); got != 0.75 {
		t.Errorf("per waiter-second = %v, want 0.75", got)
	}
	// 6 µs of GET, 90 of EVALSHA, 1 of CLIENT|TRACKING, 1 of PING; INFO's
	// time left out.
	if us := after.usecSince(before); us != 98 {
		t.Errorf("server µs = %d, want 98", us)
	}
	if _, err := parseCommandStats("# Commandstats\r\n"); err == nil {
		t.Error("INFO without total_commands_processed: got no error")
	}
}

func TestWaitTurnSeesTheHolder(t *testing.T) {
	var g guard
	g.enter(false) // a holder that has not released
	if tr := waitTurn(context.Background(), noLock{}, &g); !tr.served || tr.res.overlaps != 1 {
		t.Fatalf("lock granted under a holder: served %v, %d overlaps, want served with 1 overlap", tr.served, tr.res.overlaps)
	}
	g.leave(false)
	if tr := waitTurn(context.Background(), noLock{}, &g); tr.res.overlaps != 0 {
		t.Fatalf("lock granted after the release: %d overlaps, want 0", tr.res.overlaps)
	}
}

// localRW is a sync.RWMutex as an rwLocker; exclusive makes reads take the
// write lock too.
type localRW struct {
	mu        *sync.RWMutex
	exclusive bool
}

func (l localRW) lock(context.Context) (func(context.Context) error, error) {
	l.mu.Lock()
	return func(context.Context) error { l.mu.Unlock(); return nil }, nil
}

func (l localRW) rlock(ctx context.Context) (func(context.Context) error, error) {
	if l.exclusive {
		return l.lock(ctx)
	}
	l.mu.RLock()
	return func(context.Context) error { l.mu.RUnlock(); return nil }, nil
}

// noRW excludes nothing.
type noRW struct{}

func (noRW) lock(ctx context.Context) (func(context.Context) error, error) { return noLock{}.lock(ctx) }
func (noRW) rlock(ctx context.Context) (func(context.Context) error, error) {
	return noLock{}.lock(ctx)
}

func TestRWReadGuardsSeeOverlaps(t *testing.T) {
	workers := make([]rwLocker, 8)
	for i := range workers {
		workers[i] = noRW{}
	}
	r := runRWRead(context.Background(), 200*time.Millisecond, workers, 1)
	if r.overlaps == 0 {
		t.Fatalf("no lock at all: got 0 overlaps over %d reads and %d writes, want some", r.rw.reads, r.rw.writes)
	}
}

func TestRWReadRWMutex(t *testing.T) {
	for _, exclusive := range []bool{false, true} {
		mu := &sync.RWMutex{}
		workers := make([]rwLocker, 8)
		for i := range workers {
			workers[i] = localRW{mu, exclusive}
		}
		r := runRWRead(context.Background(), 200*time.Millisecond, workers, 1)
		if r.overlaps != 0 || r.lost != 0 || r.errs != 0 {
			t.Fatalf("sync.RWMutex (exclusive %v): got %d overlaps, %d lost, %d errors, want 0", exclusive, r.overlaps, r.lost, r.errs)
		}
		if r.rw.reads == 0 || r.rw.writes == 0 || r.rw.reads+r.rw.writes != r.ops || int64(len(r.lat)) != r.rw.reads {
			t.Fatalf("sync.RWMutex (exclusive %v): %d reads, %d writes, %d sections, %d read latencies", exclusive, r.rw.reads, r.rw.writes, r.ops, len(r.lat))
		}
		if share := float64(r.rw.reads) / float64(r.ops); share < 0.8 || share > 0.97 {
			t.Errorf("sync.RWMutex (exclusive %v): %.2f of the sections read, want about %.2f", exclusive, share, rwReadShare)
		}
	}
}

func TestGuard(t *testing.T) {
	var g guard
	if !g.enter(true) || !g.enter(true) {
		t.Fatal("two readers: refused")
	}
	if g.enter(false) {
		t.Fatal("a writer with readers: let in")
	}
	if g.still(true) {
		t.Fatal("a reader with a writer: still fine")
	}
	g.leave(false)
	g.leave(true)
	g.leave(true)
	if !g.enter(false) || g.enter(false) {
		t.Fatal("one writer, then a second: want the first in, the second refused")
	}
	if g.enter(true) {
		t.Fatal("a reader with a writer: let in")
	}
}

func TestWaitTurnReaders(t *testing.T) {
	var g guard
	g.enter(true) // a reading holder
	if tr := waitTurn(context.Background(), readNoLock{}, &g); tr.res.overlaps != 0 {
		t.Fatalf("a reader with a reading holder: %d overlaps, want 0", tr.res.overlaps)
	}
	if tr := waitTurn(context.Background(), noLock{}, &g); tr.res.overlaps != 1 {
		t.Fatalf("a writer with a reading holder: %d overlaps, want 1", tr.res.overlaps)
	}
}

type readNoLock struct{ noLock }

func (readNoLock) reads() bool { return true }

func TestCheckStrict(t *testing.T) {
	before := strictViolations.Load()
	r := &row{name: "x"}
	checkStrict(&scenario{id: "loose"}, r, &result{overlaps: 2}, 0)
	if got := strictViolations.Load() - before; got != 0 {
		t.Fatalf("overlaps of a scenario that is not strict: counted %d, want 0", got)
	}
	checkStrict(&scenario{id: "strict", strict: true}, r, &result{overlaps: 2, lost: 1}, -1)
	if got := strictViolations.Load() - before; got != 3 {
		t.Fatalf("2 overlaps and 1 lost update of a strict scenario: counted %d, want 3", got)
	}
	strictViolations.Add(-3)
}

// TestElectTable: the Election row's hand-overs/s is set against the
// NetMutex row of the same client, and a row with two leaders at once is
// marked FAILED.
func TestElectTable(t *testing.T) {
	c := &contender{name: "netlock/redigo", role: roleNetlock}
	measured := func(name string, changes, overlaps int64) *row {
		return &row{name: name, c: c, res: result{ran: true, ops: changes + 1, changes: changes, elapsed: time.Second, overlaps: overlaps, sem: &semStats{commands: 10 * (changes + 1)}}}
	}
	sc := &scenario{rows: []*row{measured("Election/redigo", 300, 0), measured("NetMutex/redigo", 600, 0)}}
	var b strings.Builder
	writeElectTable(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }, sc)
	if want := "| **Election/redigo** | 300 | 0.50× |"; !strings.Contains(b.String(), want) {
		t.Errorf("table:\n%s\nwant a row starting %q", b.String(), want)
	}
	sc.rows[0].res.overlaps = 1
	b.Reset()
	writeElectTable(func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }, sc)
	if want := "**FAILED: two leaders at once** (300)"; !strings.Contains(b.String(), want) {
		t.Errorf("table:\n%s\nwant %q", b.String(), want)
	}
}
