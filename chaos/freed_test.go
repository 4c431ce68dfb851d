package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// freedBound is how long a lock that nobody holds may stay untaken while
// clients wait for it, once a fault has cleared. netlock promises that no
// released hold's key outlive one second, and that no waiter wait longer
// than that for a lock nobody holds. The second is meant for expiries of
// many seconds; the chaos tests' keys lapse within chaosExpiry (one
// second) of the round that last set them, so that a key nobody deletes
// goes by itself within about the second, and a bound of a second could
// not tell a delivered release from one given up. The bound is half the
// expiry: a release a fault kept back is sent again by its reaper, whose
// passes are at most 250ms apart, each bounded by the node timeout.
const freedBound = min(time.Second, chaosExpiry/2)

// freedLapse is how long after a lost hold's local deadline its key may
// still be there: the key lapses the expiry after the round that last set
// it began, the deadline is that start plus the expiry less the round's
// time (at most the node timeout, 100ms) and the drift term.
const freedLapse = 100*time.Millisecond + time.Duration(float64(chaosExpiry)*chaosDrift) + 2*time.Millisecond

// A heldSpan is a time during which a hold kept n permits of a lock out:
// one for a NetMutex's hold, an Election's term, a NetRWMutex's write hold
// or read section; its permits for a Semaphore's hold.
type heldSpan struct {
	from, to time.Time
	n        int64
}

// heldTo returns when a hold let go at unlock stopped keeping the lock: at
// unlock, or, if its Lost() closed before (at lostAt), at its local
// deadline (until) plus freedLapse at the latest, when its key has lapsed.
// A hold whose deadline is unknown (until zero) keeps it until unlock.
func heldTo(unlock, until, lostAt time.Time) time.Time {
	lapsed := until.Add(freedLapse)
	if !lostAt.IsZero() && lostAt.Before(unlock) && !until.IsZero() && lapsed.Before(unlock) {
		return lapsed
	}
	return unlock
}

// holdSpans returns the spans of holds of a lock of one permit (a
// NetMutex's holds, an Election's terms): from each hold's start (its lock
// call returned) to its unlock's start, or to heldTo's bound if it was
// lost.
func holdSpans(holds []holdRecord) []heldSpan {
	var spans []heldSpan
	for i := range holds {
		h := &holds[i]
		if h.start.IsZero() {
			continue
		}
		spans = append(spans, heldSpan{h.start, heldTo(h.unlockStart, h.until, h.lostAt), 1})
	}
	return spans
}

// rwSpans returns the spans of a NetRWMutex's write holds (as holdSpans)
// and read sections, one permit each, so that the lock is free while
// nobody writes or reads: a read section from RLockCtx returning to its
// end (RUnlockCtx follows at once), or to heldTo's bound if its lease was
// lost. leases must hold their deadlines.
func rwSpans(holds []holdRecord, reads []readRecord, leases []leaseRecord) []heldSpan {
	spans := holdSpans(holds)
	for i := range reads {
		r := &reads[i]
		l := &leases[r.lease]
		spans = append(spans, heldSpan{r.start, heldTo(r.end, l.until, l.lostAt), 1})
	}
	return spans
}

// semSpans returns the spans of a Semaphore's holds, each of its permits:
// from Acquire returning to the release's start, or to heldTo's bound if
// its lease was lost.
func semSpans(holds []semHold) []heldSpan {
	var spans []heldSpan
	for i := range holds {
		h := &holds[i]
		if h.start.IsZero() {
			continue
		}
		spans = append(spans, heldSpan{h.start, heldTo(h.releaseStart, h.until, h.lostAt), h.n})
	}
	return spans
}

// stallEpisodes are the client stalls of a workload whose clients wait
// with several goroutines, as episodes for checkFreed. A stall pauses the
// whole client: its goroutines that wait are stalled with it, and may be
// first in the queue, where the others wait behind them by the rule of
// order, and a grant made to them is out, untaken, until it expires. So a
// stall is a fault for checkFreed there, as a fault on the client's links
// is. (A NetMutex's client waits with one goroutine, which its stall
// finds holding.) It is safe for concurrent use.
type stallEpisodes struct {
	mu  sync.Mutex
	eps []episode
}

// add records that client stalled from from to to.
func (s *stallEpisodes) add(client int, from, to time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eps = append(s.eps, episode{kind: fmt.Sprintf("client %d's stall", client), from: from, cleared: to, settled: to})
}

// with returns episodes and the stalls.
func (s *stallEpisodes) with(episodes []episode) []episode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(slices.Clone(episodes), s.eps...)
}

// knownDefects returns episodes with those of the fault kinds given
// settled a lapse later: one expiry and a node timeout after they cleared,
// how long a place or a lease left behind by a known defect of the library
// keeps the lock from waiters (docs/evidence.md, "Known defects"). A free
// lock after one of them is checked from then on, and counted in the
// longest free time only from then.
func knownDefects(episodes []episode, kinds ...string) []episode {
	const lapse = chaosExpiry + 100*time.Millisecond
	out := slices.Clone(episodes)
	for i, e := range out {
		if slices.Contains(kinds, e.kind) {
			out[i].settled = e.cleared.Add(lapse)
		}
	}
	return out
}

// checkFreed checks a history of one lock of size permits, given by the
// spans its holds kept permits out (held), in which some client waits
// for want permits or fewer whenever want of them are free (each retries
// at once when a wait fails; a mutex: size 1, want 1): that want permits
// never stay free longer than freedBound plus slack while no fault is on.
// A waiter that fits is let in at once, unless a key is left that nobody
// holds (a release not delivered), or the waiters are not told. It looks
// from the first hold to to (when the clients were told to stop), outside
// the episodes (from their start to when they settled).
//
// It returns one line per violation (times from start), and the longest
// time want permits stayed free outside the faults.
func checkFreed(held []heldSpan, size, want int64, episodes []episode, start, to time.Time, slack func(from, to time.Time) time.Duration) (violations []string, longest time.Duration) {
	type span struct{ from, to time.Time }
	type event struct {
		at time.Time
		n  int64 // permits taken (> 0) or given back (< 0)
	}
	var events []event
	for _, h := range held {
		if h.to.After(h.from) {
			events = append(events, event{h.from, h.n}, event{h.to, -h.n})
		}
	}
	if len(events) == 0 {
		return nil, 0
	}
	// Permits given back before those taken at the same instant: a span
	// is [from, to), and holds back to back leave nothing free between.
	slices.SortFunc(events, func(a, b event) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.n, b.n)) })
	var free []span
	var out int64
	var since time.Time // when want permits became free; zero while they are not
	for _, e := range events {
		if !e.at.Before(to) {
			break
		}
		out += e.n
		switch fits := out+want <= size; {
		case fits && since.IsZero():
			since = e.at
		case !fits && !since.IsZero():
			if e.at.After(since) {
				free = append(free, span{since, e.at})
			}
			since = time.Time{}
		}
	}
	if !since.IsZero() && to.After(since) {
		free = append(free, span{since, to})
	}

	eps := slices.Clone(episodes)
	slices.SortFunc(eps, func(a, b episode) int { return a.from.Compare(b.from) })
	at := func(tm time.Time) string { return tm.Sub(start).Round(time.Millisecond).String() }
	what := "the lock was free"
	if size > 1 {
		what = fmt.Sprintf("%d of %d permits were free", want, size)
	}
	check := func(from, to time.Time) {
		d := to.Sub(from)
		longest = max(longest, d)
		if d <= freedBound+slack(from, to) {
			return
		}
		after := "the start"
		for _, e := range eps {
			if !e.settled.After(from) {
				after = fmt.Sprintf("%s at %s-%s", e.kind, at(e.from), at(e.cleared))
			}
		}
		violations = append(violations, fmt.Sprintf("%s from %s to %s (%v) while clients waited, no fault on, after %s: a key nobody held was left, or the waiters were not told",
			what, at(from), at(to), d.Round(time.Millisecond), after))
	}
	for _, f := range free {
		x := f.from
		for _, e := range eps {
			if !e.from.Before(f.to) {
				break
			}
			if !e.settled.After(x) {
				continue
			}
			if e.from.After(x) {
				check(x, e.from)
			}
			x = e.settled
		}
		if f.to.After(x) {
			check(x, f.to)
		}
	}
	return violations, longest
}

// TestCheckFreed feeds checkFreed histories with the lock free too long
// after a fault, and free within the rules, so that the check is known to
// bite.
func TestCheckFreed(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(start, end int) holdRecord {
		return holdRecord{start: at(start), end: at(end), until: at(end + 500), lostAt: at(end), unlockStart: at(end)}
	}
	// lostHold is a hold whose Lost() closed at its deadline, lost, and
	// that unlocked long after.
	lostHold := func(start, lost, end int) holdRecord {
		h := hold(start, end)
		h.until, h.lostAt = at(lost), at(lost)
		return h
	}
	fault := func(kind string, from, cleared, settled int) episode {
		return episode{kind: kind, from: at(from), cleared: at(cleared), settled: at(settled)}
	}
	pause := fault("pause", 1000, 2000, 2000)
	tests := []struct {
		name     string
		holds    []holdRecord
		episodes []episode
		to       int
		want     string // in the only violation; "" for none
	}{
		{"back to back", []holdRecord{hold(0, 100), hold(101, 200), hold(210, 300)}, nil, 300, ""},
		{"free during a fault", []holdRecord{hold(0, 900), hold(2100, 2200)}, []episode{pause}, 2200, ""},
		{"free too long after a fault", []holdRecord{hold(0, 900), hold(2800, 2900)}, []episode{pause}, 2900, "from 2s to 2.8s (800ms)"},
		{"free too long before a fault", []holdRecord{hold(0, 100), hold(2100, 2200)}, []episode{pause}, 2200, "from 100ms to 1s (900ms)"},
		{"free too long with no fault", []holdRecord{hold(0, 100), hold(700, 800)}, nil, 800, "from 100ms to 700ms"},
		{"free at the end", []holdRecord{hold(0, 100)}, nil, 1000, "from 100ms to 1s"},
		{"free until an acl fault settled", []holdRecord{hold(0, 900), hold(3000, 3100)},
			[]episode{fault("acl", 1000, 2000, 3000)}, 3100, ""},
		{"a lost hold's key lapses", []holdRecord{lostHold(0, 100, 2000), hold(100+200, 2100)}, nil, 2100, ""},
		{"a lost hold's key outlives its lapse", []holdRecord{lostHold(0, 100, 2000), hold(1000, 2100)}, nil, 2100, "free from"},
		{"overlapping holds", []holdRecord{hold(0, 1000), hold(500, 600), hold(1000, 1100)}, nil, 1100, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkFreed(holdSpans(tt.holds), 1, 1, tt.episodes, t0, at(tt.to), freedTestSlack)
			wantFreed(t, got, tt.want)
		})
	}
}

// TestCheckFreedPermits feeds checkFreed histories of a semaphore of three
// permits whose waiters want up to two: free while at most one is out.
func TestCheckFreedPermits(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(from, to int, n int64) heldSpan { return heldSpan{at(from), at(to), n} }
	tests := []struct {
		name string
		held []heldSpan
		to   int
		want string // in the only violation; "" for none
	}{
		{"two permits out", []heldSpan{hold(0, 1000, 2)}, 1000, ""},
		{"two holds of one", []heldSpan{hold(0, 1000, 1), hold(0, 1000, 1)}, 1000, ""},
		{"one permit out too long", []heldSpan{hold(0, 1000, 1), hold(700, 1000, 2)}, 1000, "2 of 3 permits were free from 0s to 700ms"},
		{"one of two holds ends", []heldSpan{hold(0, 1500, 1), hold(0, 300, 1), hold(900, 1500, 2)}, 1500, "from 300ms to 900ms (600ms)"},
		{"taken again in time", []heldSpan{hold(0, 1500, 1), hold(0, 300, 1), hold(700, 1500, 2)}, 1500, ""},
		{"back to back holds of two", []heldSpan{hold(0, 1000, 2), hold(1000, 2000, 2)}, 2000, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkFreed(tt.held, 3, 2, nil, t0, at(tt.to), freedTestSlack)
			wantFreed(t, got, tt.want)
		})
	}
}

// TestFreedSpans checks the spans a NetRWMutex's and a Semaphore's
// histories give checkFreed: a read section keeps the lock like a write
// hold, and a lost lease's section or hold only until its key lapsed.
func TestFreedSpans(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	write := func(start, end int) holdRecord {
		return holdRecord{start: at(start), end: at(end), until: at(end + 500), unlockStart: at(end)}
	}
	read := func(lease, start, end int) readRecord {
		return readRecord{lease: lease, start: at(start), end: at(end)}
	}
	leases := []leaseRecord{
		{until: at(5000), unlockStart: at(900)},                 // held to the end
		{until: at(100), lostAt: at(100), unlockStart: at(900)}, // lost at 100: its key lapsed by 302
	}
	sem := func(start, end, n int) semHold {
		return semHold{n: int64(n), start: at(start), end: at(end), until: at(end + 500), releaseStart: at(end)}
	}
	lostSem := sem(0, 900, 2)
	lostSem.until, lostSem.lostAt = at(100), at(100)
	tests := []struct {
		name  string
		held  []heldSpan
		size  int64
		want  int64
		fault string // in the only violation; "" for none
	}{
		{"readers between writers", rwSpans([]holdRecord{write(0, 100), write(900, 1000)}, []readRecord{read(0, 100, 500), read(0, 400, 900)}, leases), 1, 1, ""},
		{"a lost lease's reader", rwSpans([]holdRecord{write(0, 100), write(900, 1000)}, []readRecord{read(1, 100, 900)}, leases), 1, 1, "from 302ms to 900ms"},
		{"a semaphore's holds", semSpans([]semHold{sem(0, 500, 2), sem(400, 1000, 2)}), 3, 2, ""},
		{"a semaphore's lost hold", semSpans([]semHold{lostSem, sem(900, 1000, 2)}), 3, 2, "from 302ms to 900ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkFreed(tt.held, tt.size, tt.want, nil, t0, at(1000), freedTestSlack)
			wantFreed(t, got, tt.fault)
		})
	}
}

// freedTestSlack is the slack of checkFreed's tests.
func freedTestSlack(time.Time, time.Time) time.Duration { return 50 * time.Millisecond }

// wantFreed fails t unless got is one violation containing want, or none
// if want is "".
func wantFreed(t *testing.T, got []string, want string) {
	t.Helper()
	switch {
	case want == "" && len(got) != 0:
		t.Errorf("violations %q, want none", got)
	case want != "" && (len(got) != 1 || !strings.Contains(got[0], want)):
		t.Errorf("violations %q, want one containing %q", got, want)
	}
}
