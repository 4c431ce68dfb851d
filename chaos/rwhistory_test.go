package chaos

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
)

// rwResource is the resource a NetRWMutex protects: writers write to it
// with their fencing token, and it accepts a write only with a token at
// least the highest it has accepted (as fencedResource); readers read which
// write is the latest it accepted. It logs every write, accepted or not,
// with its time, for checkRWHistory.
type rwResource struct {
	mu      sync.Mutex
	highest uint64
	writes  []writeRecord
	at      []time.Time // when each write was made
	last    int         // the latest accepted write, -1 before any
}

func newRWResource() *rwResource { return &rwResource{last: -1} }

// write writes with token on behalf of hold and reports whether it was
// accepted.
func (r *rwResource) write(hold int, token uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := token >= r.highest
	if ok {
		r.highest = token
		r.last = len(r.writes)
	}
	r.writes = append(r.writes, writeRecord{hold: hold, token: token, accepted: ok})
	r.at = append(r.at, time.Now())
	return ok
}

// read returns the latest accepted write (-1 if none) and the time of the
// read.
func (r *rwResource) read() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, time.Now()
}

// readRecord is one read section of a NetRWMutex, as its reader saw it,
// from RLockCtx returning to RUnlockCtx. The reader reads the resource as
// the section begins and as it ends.
type readRecord struct {
	client int
	lease  int // index of the read lease the section was on
	// start is taken when RLockCtx has returned, end when the section is
	// over, before RUnlockCtx; validAtStart and validAtEnd say whether
	// RLost() was still open just after start and just after end.
	start, end               time.Time
	validAtStart, validAtEnd bool
	first, second            int // the latest accepted write, at each read (-1: none)
	firstAt, secondAt        time.Time
	paused                   bool // the client stalled in the section past the expiry
}

// leaseRecord is one read lease of a process, shared by its read sections.
type leaseRecord struct {
	client int
	// until is the lease's local deadline as the client's rwRecorder
	// computed it from its calls, once every reader of the lease is gone.
	until     time.Time
	explained bool
	lostAt    time.Time // when RLost() was seen closed (at the latest, by the last RUnlockCtx)
	// unlockStart is the latest start of an RUnlockCtx of one of its
	// readers: never after the release of the lease, which the last of
	// them makes.
	unlockStart time.Time
	unlockErr   error     // what the RUnlockCtx that released it returned
	unlockEnd   time.Time // when the latest RUnlockCtx of its readers returned
	// engineLost and engineReason: when and why the Observer's Lost said
	// the lease was lost (zero if it did not): logged with a violation.
	engineLost   time.Time
	engineReason netlock.LostReason
	sections     int
}

// signalled reports whether RLost() closed before the last RUnlockCtx.
func (l *leaseRecord) signalled() bool {
	return !l.lostAt.IsZero() && l.lostAt.Before(l.unlockStart)
}

// rwFigures are what checkRWHistory counts besides violations.
type rwFigures struct {
	historyFigures      // of the write holds, by checkHistory
	reads, leases   int // read sections, read leases
	readsLost       int // read sections not valid at their end
	leasesLost      int // leases whose RLost() closed before their release, or whose release found them lost
	overlaps        int // violations: a valid writer against a valid writer or reader
	tokenRegression int // violations: tokens not increasing, stale writes accepted or observed
	staleSeen       int // valid read sections that saw a write of a lost writer whose token was the latest granted
	staleReads      int // read sections that saw the resource change, not valid at their end
	writes          int // writes to the resource
	maxLeaseLate    time.Duration
}

// checkRWHistory checks a history of a NetRWMutex (every client in one
// process, so their monotonic clocks compare): the write holds, as
// checkHistory checks a NetMutex's (holds, writes), and the read sections
// and their leases. A read section is valid if RLost() was open at its end
// and its end is before its lease's local deadline; a write hold, if Lost()
// was open at its end and UnlockCtx did not report it lost (checkHistory).
// Besides checkHistory's violations, it returns one line per:
//
//   - a valid read section and a valid write hold overlap in time;
//   - a valid read section saw the resource change (a write made between
//     its two reads) by a valid writer, or by a writer whose token was
//     below the highest granted when it wrote;
//   - a valid read section observed a write whose token is below that of
//     a write hold that had started before the read;
//   - RLost() closed later than its slack after the lease's local deadline,
//     or not at all before the lease's last RUnlockCtx although that slack
//     had passed;
//   - the release of a lease reported ErrLockLost while it was valid by its
//     local clock and RLost() never closed.
//
// A write of a writer that was lost, made between two reads of a valid
// read section with the highest token granted (nothing newer existed for
// the resource to fence it out with), is counted, not a violation.
func checkRWHistory(holds []holdRecord, reads []readRecord, leases []leaseRecord, writes []writeRecord, writeAt []time.Time, slack func(from, to time.Time) time.Duration) (violations []string, fig rwFigures) {
	violations, fig.historyFigures = checkHistory(holds, writes, slack)
	for _, v := range violations {
		switch {
		case strings.Contains(v, "overlap"):
			fig.overlaps++
		case strings.Contains(v, "token not above"), strings.Contains(v, "same token"), strings.Contains(v, "was accepted after token"):
			fig.tokenRegression++
		}
	}
	fig.reads, fig.leases, fig.writes = len(reads), len(leases), len(writes)
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	desc := func(i int) string {
		return fmt.Sprintf("hold %d (client %d, token %d)", i, holds[i].client, holds[i].token)
	}
	rdesc := func(i int) string {
		return fmt.Sprintf("read %d (client %d, lease %d)", i, reads[i].client, reads[i].lease)
	}
	validHold := func(i int) bool {
		return holds[i].validAtEnd && !errors.Is(holds[i].unlockErr, netlock.ErrLockLost)
	}
	validRead := func(i int) bool {
		r := &reads[i]
		l := &leases[r.lease]
		return r.validAtEnd && (!l.explained || r.end.Before(l.until))
	}

	// Valid readers against valid writers: for each writer, the reader
	// that ends last among those that started before the writer ended.
	var vr []int
	valid := make([]bool, len(reads))
	for i := range reads {
		if valid[i] = validRead(i); valid[i] {
			vr = append(vr, i)
		} else {
			fig.readsLost++
		}
	}
	slices.SortFunc(vr, func(a, b int) int { return reads[a].start.Compare(reads[b].start) })
	latest := make([]int, len(vr)) // latest[k]: of vr[:k+1], the one that ends last
	for k := range vr {
		latest[k] = vr[k]
		if k > 0 && reads[latest[k-1]].end.After(reads[vr[k]].end) {
			latest[k] = latest[k-1]
		}
	}
	for i := range holds {
		if !validHold(i) {
			continue
		}
		h := &holds[i]
		n := sort.Search(len(vr), func(k int) bool { return !reads[vr[k]].start.Before(h.end) })
		if n == 0 {
			continue
		}
		if r := &reads[latest[n-1]]; r.end.After(h.start) {
			fig.overlaps++
			bad("%s and %s overlap by %v, neither reported lost", desc(i), rdesc(latest[n-1]), overlap(r.start, r.end, h.start, h.end))
		}
	}

	// The highest token granted before each moment: of the write holds
	// valid when they started, by start.
	var granted []int
	for i := range holds {
		if holds[i].validAtStart {
			granted = append(granted, i)
		}
	}
	slices.SortFunc(granted, func(a, b int) int { return holds[a].start.Compare(holds[b].start) })
	highest := make([]uint64, len(granted))
	for k, i := range granted {
		highest[k] = holds[i].token
		if k > 0 {
			highest[k] = max(highest[k], highest[k-1])
		}
	}
	grantedBefore := func(at time.Time) (uint64, int) {
		n := sort.Search(len(granted), func(k int) bool { return !holds[granted[k]].start.Before(at) })
		if n == 0 {
			return 0, -1
		}
		k := n - 1
		for k > 0 && highest[k-1] == highest[n-1] {
			k--
		}
		return highest[n-1], granted[k]
	}
	tokenOf := func(w int) uint64 {
		if w < 0 {
			return 0
		}
		return writes[w].token
	}

	// What valid readers saw.
	for _, i := range vr {
		r := &reads[i]
		for _, obs := range []struct {
			w  int
			at time.Time
		}{{r.first, r.firstAt}, {r.second, r.secondAt}} {
			if g, by := grantedBefore(obs.at); tokenOf(obs.w) < g {
				fig.tokenRegression++
				bad("%s observed token %d (write %d), below token %d of %s that started before the read", rdesc(i), tokenOf(obs.w), obs.w, g, desc(by))
			}
		}
		if r.first == r.second {
			continue
		}
		for w := r.first + 1; w <= r.second; w++ {
			if !writes[w].accepted {
				continue
			}
			g, by := grantedBefore(writeAt[w])
			switch {
			case validHold(writes[w].hold):
				fig.overlaps++
				bad("%s saw write %d of %s, never reported lost, made between its reads: overlap", rdesc(i), w, desc(writes[w].hold))
			case writes[w].token < g:
				fig.tokenRegression++
				bad("%s saw write %d with token %d of %s, made after %s with token %d had started", rdesc(i), w, writes[w].token, desc(writes[w].hold), desc(by), g)
			default:
				fig.staleSeen++
			}
		}
	}
	for i := range reads {
		if r := &reads[i]; r.first != r.second && !valid[i] {
			fig.staleReads++
		}
	}

	// Leases.
	for i := range leases {
		l := &leases[i]
		ldesc := fmt.Sprintf("lease %d (client %d)", i, l.client)
		if !l.explained {
			bad("%s: no acquire reply of the client granted it", ldesc)
			continue
		}
		if l.signalled() {
			fig.leasesLost++
			late := l.lostAt.Sub(l.until)
			fig.maxLeaseLate = max(fig.maxLeaseLate, late)
			if late > slack(l.until, l.lostAt) {
				bad("%s: RLost() closed %v after its local deadline", ldesc, late)
			}
			continue
		}
		if late := l.unlockStart.Sub(l.until); late > slack(l.until, l.unlockStart) {
			bad("%s: RLost() still open %v after its local deadline", ldesc, late)
		}
		if errors.Is(l.unlockErr, netlock.ErrLockLost) {
			fig.leasesLost++
			if l.unlockStart.Before(l.until) {
				bad("%s: RUnlockCtx reported the lease lost %v before its local deadline, and RLost() never closed", ldesc, l.until.Sub(l.unlockStart))
			}
		}
	}
	return violations, fig
}

// overlap returns how long [a0, a1] and [b0, b1] overlap.
func overlap(a0, a1, b0, b1 time.Time) time.Duration {
	from, to := a0, a1
	if b0.After(from) {
		from = b0
	}
	if b1.Before(to) {
		to = b1
	}
	return to.Sub(from)
}

// TestCheckRWHistory feeds checkRWHistory a good history and, for each of
// its own rules, a history that breaks it, so that the RW chaos test's
// checker is known to bite.
func TestCheckRWHistory(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(client int, token uint64, start, end int) holdRecord {
		return holdRecord{client: client, token: token, start: at(start), end: at(end),
			validAtStart: true, validAtEnd: true, until: at(end + 500), lostAt: at(end), unlockStart: at(end)}
	}
	lostHold := func(client int, token uint64, start, lost, end int) holdRecord {
		h := hold(client, token, start, end)
		h.validAtEnd, h.until, h.lostAt, h.unlockErr = false, at(lost), at(lost), netlock.ErrLockLost
		return h
	}
	// read is a read section of lease from start to end, reading writes
	// first and second.
	read := func(lease, start, end, first, second int) readRecord {
		return readRecord{lease: lease, start: at(start), end: at(end), validAtStart: true, validAtEnd: true,
			first: first, second: second, firstAt: at(start), secondAt: at(end)}
	}
	lease := func(until, unlock int) leaseRecord {
		return leaseRecord{until: at(until), explained: true, lostAt: at(unlock), unlockStart: at(unlock)}
	}
	lostLease := func(until, unlock int) leaseRecord {
		l := lease(until, unlock)
		l.lostAt, l.unlockErr = at(until), netlock.ErrLockLost
		return l
	}
	// Writer 0 (token 1) writes at 1 and 9; two readers on lease 0 from 20
	// to 45; writer 1 (token 2) from 50 to 60 writes at 51 and 59; lease 1
	// is lost at 100, its reader reads until 150; writer 2 (token 3) writes
	// at 161, is lost at 200 and writes again at 310, while a reader on
	// lease 2 (300-400) reads: the resource accepts it (nothing newer), and
	// the reader's change is counted, not a violation.
	holds := []holdRecord{hold(0, 1, 0, 10), hold(1, 2, 50, 60), lostHold(2, 3, 160, 200, 320)}
	writes := []writeRecord{{0, 1, true}, {0, 1, true}, {1, 2, true}, {1, 2, true}, {2, 3, true}, {2, 3, true}}
	writeAt := []time.Time{at(1), at(9), at(51), at(59), at(161), at(310)}
	reads := []readRecord{read(0, 20, 40, 1, 1), read(0, 25, 45, 1, 1),
		func() readRecord { r := read(1, 70, 150, 3, 3); r.validAtEnd = false; return r }(),
		read(2, 300, 400, 4, 5)}
	leases := []leaseRecord{lease(500, 45), lostLease(100, 150), lease(900, 400)}

	tests := []struct {
		name   string
		holds  []holdRecord
		reads  []readRecord
		leases []leaseRecord
		want   string // in a violation; "" for none
	}{
		{"good", holds, reads, leases, ""},
		{"reader overlaps writer", holds, []readRecord{read(0, 5, 8, 0, 0)}, leases[:1], "overlap by 3ms"},
		{"reader past its lease's deadline is not valid", []holdRecord{holds[0], holds[1], hold(2, 3, 120, 130)},
			[]readRecord{read(1, 70, 150, 3, 3)}, leases[:2], ""},
		{"reader spans a writer", holds, []readRecord{read(0, 40, 70, 1, 3)}, leases[:1], "never reported lost, made between its reads"},
		{"reader sees an old token", holds, []readRecord{read(0, 70, 80, 1, 1)}, leases[:1], "observed token 1 (write 1), below token 2"},
		{"RLost late", holds, reads[:1], []leaseRecord{func() leaseRecord { l := lostLease(30, 300); l.lostAt = at(200); return l }()}, "RLost() closed 170ms after"},
		{"RLost never closed", holds, reads[:1], []leaseRecord{lease(30, 300)}, "RLost() still open 270ms after"},
		{"lease lost while valid", holds, reads[:1], []leaseRecord{func() leaseRecord { l := lease(500, 45); l.unlockErr = netlock.ErrLockLost; return l }()}, "before its local deadline, and RLost() never closed"},
		{"lease unexplained", holds, reads[:1], []leaseRecord{{}}, "no acquire reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkRWHistory(tt.holds, tt.reads, tt.leases, writes, writeAt, fixedSlack)
			switch {
			case tt.want == "" && len(got) != 0:
				t.Errorf("violations %q, want none", got)
			case tt.want != "" && !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, tt.want) }):
				t.Errorf("violations %q, want one containing %q", got, tt.want)
			}
		})
	}
	_, fig := checkRWHistory(holds, reads, leases, writes, writeAt, fixedSlack)
	if fig.reads != 4 || fig.readsLost != 1 || fig.leasesLost != 1 || fig.staleSeen != 1 || fig.overlaps != 0 || fig.tokenRegression != 0 {
		t.Errorf("figures of the good history: %+v, want 4 reads, 1 lost, 1 lease lost, 1 stale write seen, no overlap or regression", fig)
	}
}
