package chaos

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
)

// fencedResource is the resource a lock protects, fenced as fencing asks
// of it: it accepts a write only with a token at least the highest it has
// accepted. It logs every write, accepted or not, for checkHistory, and
// every call with its times, for checkLinearizable.
type fencedResource struct {
	mu      sync.Mutex
	highest uint64
	last    fencedValue // the last write accepted
	writes  []writeRecord
	ops     []fencedOp
}

// writeRecord is one write to a fencedResource.
type writeRecord struct {
	hold     int // index of the hold in the history
	token    uint64
	accepted bool
}

// write writes with token on behalf of hold and reports whether it was
// accepted.
func (r *fencedResource) write(hold int, token uint64) bool {
	// A call begins before it waits for the resource's mutex, and returns
	// after its answer was made: the times bound the moment it took
	// effect, as a client's would.
	call := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := token >= r.highest
	if ok {
		r.highest = token
		r.last = fencedValue{hold: hold, token: token}
	}
	r.writes = append(r.writes, writeRecord{hold: hold, token: token, accepted: ok})
	r.ops = append(r.ops, fencedOp{hold: hold, write: true, token: token, call: call, ret: time.Now(), accepted: ok})
	return ok
}

// read returns the last write accepted, on behalf of hold.
func (r *fencedResource) read(hold int) fencedValue {
	call := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, fencedOp{hold: hold, call: call, ret: time.Now(), value: r.last})
	return r.last
}

// holdRecord is one hold of a lock, as its client saw it, from LockCtx
// returning to UnlockCtx.
type holdRecord struct {
	client int
	token  uint64
	// start is taken when LockCtx has returned, end when the critical
	// section is over, before UnlockCtx; validAtStart and validAtEnd say
	// whether Lost() was still open just after start and just after end.
	start, end               time.Time
	validAtStart, validAtEnd bool
	// until is the hold's local deadline as a recorder computed it from
	// the client's calls, after UnlockCtx.
	until       time.Time
	lostAt      time.Time // when Lost() was seen closed (at the latest, by UnlockCtx)
	unlockStart time.Time
	unlockErr   error
	paused      bool // the client stalled in its critical section past the expiry
}

// signalled reports whether Lost() closed before UnlockCtx was called.
func (h *holdRecord) signalled() bool {
	return !h.lostAt.IsZero() && h.lostAt.Before(h.unlockStart)
}

// historyFigures are what checkHistory counts besides violations.
type historyFigures struct {
	holds, lost, staleRejected int
	maxLate                    time.Duration // latest Lost() after until
}

// checkHistory checks a history of holds of one lock (every client in one
// process, so their monotonic clocks compare) and the writes they made to a
// fenced resource. slack(from, to) is how late after a hold's local deadline
// (from) Lost() may be seen closed (to): the watchdog's timer and the
// goroutine that watches Lost() have to be scheduled, later if the process
// was starved of CPU meanwhile. It returns one line per violation:
//
//   - two holds that were never reported lost overlap in time;
//   - a token is granted twice, or tokens do not strictly increase in
//     acquisition order (holds valid when they started, ordered by start);
//   - a write was accepted with a token below one accepted before, or
//     rejected with one at least as high (the resource is not fenced);
//   - a write of a hold that was never reported lost was rejected: a later
//     holder wrote while it still held;
//   - Lost() closed later than its slack after until, or not at all before
//     UnlockCtx although that slack had passed;
//   - UnlockCtx reported ErrLockLost for a hold still valid by its local
//     clock whose Lost() never closed: the keys went while the client was
//     told it held.
func checkHistory(holds []holdRecord, writes []writeRecord, slack func(from, to time.Time) time.Duration) (violations []string, fig historyFigures) {
	fig.holds = len(holds)
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	desc := func(i int) string {
		h := &holds[i]
		return fmt.Sprintf("hold %d (client %d, token %d)", i, h.client, h.token)
	}

	// Exclusion.
	var valid []int
	for i := range holds {
		if holds[i].validAtEnd && !errors.Is(holds[i].unlockErr, netlock.ErrLockLost) {
			valid = append(valid, i)
		}
	}
	slices.SortFunc(valid, func(a, b int) int { return holds[a].start.Compare(holds[b].start) })
	// Each hold against the one that ends last among those that started
	// before it.
	for k, latest := 1, 0; k < len(valid); k++ {
		if holds[valid[k-1]].end.After(holds[valid[latest]].end) {
			latest = k - 1
		}
		if a, b := &holds[valid[latest]], &holds[valid[k]]; b.start.Before(a.end) {
			bad("%s and %s overlap by %v, neither reported lost", desc(valid[latest]), desc(valid[k]), a.end.Sub(b.start))
		}
	}

	// Tokens. A hold handed to another goroutine of its process keeps its
	// token (netlock's local hand-off): the same token twice in one client
	// is one hold, passed on.
	byToken := map[uint64]int{}
	var ordered []int
	for i := range holds {
		if j, dup := byToken[holds[i].token]; dup && holds[j].client != holds[i].client {
			bad("%s and %s have the same token", desc(j), desc(i))
		}
		byToken[holds[i].token] = i
		if holds[i].validAtStart {
			ordered = append(ordered, i)
		}
	}
	slices.SortFunc(ordered, func(a, b int) int { return holds[a].start.Compare(holds[b].start) })
	for k := 1; k < len(ordered); k++ {
		if a, b := &holds[ordered[k-1]], &holds[ordered[k]]; b.token < a.token || b.token == a.token && b.client != a.client {
			bad("%s started after %s with a token not above it", desc(ordered[k]), desc(ordered[k-1]))
		}
	}

	// Writes, replayed in the resource's order.
	var highest uint64
	for _, w := range writes {
		stale := w.token < highest
		switch {
		case stale && w.accepted:
			bad("a write with token %d was accepted after token %d", w.token, highest)
		case !stale && !w.accepted:
			bad("a write with token %d was rejected, the highest being %d", w.token, highest)
		case stale:
			fig.staleRejected++
		}
		if w.accepted {
			highest = w.token
		}
		if h := &holds[w.hold]; !w.accepted && h.validAtEnd && !errors.Is(h.unlockErr, netlock.ErrLockLost) {
			bad("a write of %s, never reported lost, was rejected: token %d had been written", desc(w.hold), highest)
		}
	}

	// Loss signals.
	for i := range holds {
		h := &holds[i]
		if h.signalled() {
			fig.lost++
			late := h.lostAt.Sub(h.until)
			fig.maxLate = max(fig.maxLate, late)
			if late > slack(h.until, h.lostAt) {
				bad("%s: Lost() closed %v after its local deadline", desc(i), late)
			}
			continue
		}
		if late := h.unlockStart.Sub(h.until); late > slack(h.until, h.unlockStart) {
			bad("%s: Lost() still open %v after its local deadline", desc(i), late)
		}
		if errors.Is(h.unlockErr, netlock.ErrLockLost) {
			fig.lost++
			if h.unlockStart.Before(h.until) {
				bad("%s: UnlockCtx reported the hold lost %v before its local deadline, and Lost() never closed", desc(i), h.until.Sub(h.unlockStart))
			}
		}
	}
	return violations, fig
}

func fixedSlack(from, to time.Time) time.Duration { return 50 * time.Millisecond }

// TestCheckHistory feeds checkHistory a good history and, for each rule, a
// history that breaks it, so that the chaos test's checker is known to bite.
func TestCheckHistory(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// hold is a hold from start to end (ms), with a local deadline well
	// after, unlocked at end.
	hold := func(client int, token uint64, start, end int) holdRecord {
		return holdRecord{client: client, token: token, start: at(start), end: at(end),
			validAtStart: true, validAtEnd: true, until: at(end + 500), lostAt: at(end), unlockStart: at(end)}
	}
	// lostHold is a hold whose Lost() closed at its deadline, lost, before
	// it ended at end.
	lostHold := func(client int, token uint64, start, lost, end int) holdRecord {
		h := hold(client, token, start, end)
		h.validAtEnd, h.until, h.lostAt, h.unlockErr = false, at(lost), at(lost), netlock.ErrLockLost
		return h
	}
	good := []holdRecord{hold(0, 1, 0, 10), hold(1, 2, 20, 30), lostHold(2, 3, 40, 100, 300), hold(0, 4, 150, 160)}
	goodWrites := []writeRecord{{0, 1, true}, {1, 2, true}, {2, 3, true}, {3, 4, true}, {2, 3, false}}

	tests := []struct {
		name   string
		holds  []holdRecord
		writes []writeRecord
		want   string // in the only violation; "" for none
	}{
		{"good", good, goodWrites, ""},
		{"overlap", []holdRecord{hold(0, 1, 0, 10), hold(1, 2, 5, 30)}, nil, "overlap by 5ms"},
		{"overlap with a long hold", []holdRecord{hold(0, 1, 0, 100), hold(1, 2, 10, 20), hold(2, 3, 50, 60)}, nil, "overlap"},
		{"overlap of a lost hold is allowed", []holdRecord{lostHold(0, 1, 0, 5, 100), hold(1, 2, 50, 60)}, nil, ""},
		{"token twice", []holdRecord{hold(0, 1, 0, 10), hold(1, 1, 20, 30)}, nil, "the same token"},
		{"token down", []holdRecord{hold(0, 2, 0, 10), hold(1, 1, 20, 30)}, nil, "not above"},
		{"stale write accepted", good[:2], []writeRecord{{1, 2, true}, {0, 1, true}}, "accepted after token 2"},
		{"fresh write rejected", good[:2], []writeRecord{{0, 1, true}, {1, 2, false}}, "was rejected, the highest being 1"},
		{"write of a valid hold rejected", []holdRecord{hold(0, 1, 0, 10), lostHold(1, 2, 0, 1, 5)},
			[]writeRecord{{1, 2, true}, {0, 1, false}}, "never reported lost, was rejected"},
		{"Lost() late", []holdRecord{func() holdRecord { h := lostHold(0, 1, 0, 100, 300); h.lostAt = at(200); return h }()},
			nil, "Lost() closed 100ms after"},
		{"Lost() never closed", []holdRecord{func() holdRecord { h := hold(0, 1, 0, 300); h.until = at(100); return h }()},
			nil, "Lost() still open 200ms after"},
		{"lost while valid", []holdRecord{func() holdRecord { h := hold(0, 1, 0, 10); h.unlockErr = netlock.ErrLockLost; return h }()},
			nil, "before its local deadline, and Lost() never closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkHistory(tt.holds, tt.writes, fixedSlack)
			switch {
			case tt.want == "" && len(got) != 0:
				t.Errorf("violations %q, want none", got)
			case tt.want != "" && !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, tt.want) }):
				t.Errorf("violations %q, want one containing %q", got, tt.want)
			}
		})
	}
	if _, fig := checkHistory(good, goodWrites, fixedSlack); fig.holds != 4 || fig.lost != 1 || fig.staleRejected != 1 {
		t.Errorf("figures of the good history: %+v, want 4 holds, 1 lost, 1 stale write rejected", fig)
	}
}
