package chaos

import (
	"fmt"
	"slices"
	"strings"
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

// checkFreed checks, in a history of holds of one lock for which every
// client waits whenever it does not hold (each retries at once when a
// wait fails), that the lock never stays free longer than freedBound plus
// slack while no fault is on: a free lock is taken at once by a waiter
// unless a key is left that nobody holds (a release not delivered), or
// the waiters are not told. It looks from the first hold to to (when the
// clients were told to stop), outside the episodes (from their start to
// when they settled).
//
// A hold occupies the lock from its start (LockCtx returned) to its
// unlock's start; a hold whose Lost() closed first, to its local deadline
// plus freedLapse at the latest, when its key has lapsed. It returns one
// line per violation (times from start), and the longest time the lock
// stayed free outside the faults.
func checkFreed(holds []holdRecord, episodes []episode, start, to time.Time, slack func(from, to time.Time) time.Duration) (violations []string, longest time.Duration) {
	type span struct{ from, to time.Time }
	var occupied []span
	for i := range holds {
		h := &holds[i]
		if h.start.IsZero() {
			continue
		}
		end := h.unlockStart
		if h.signalled() && h.until.Add(freedLapse).Before(end) {
			end = h.until.Add(freedLapse)
		}
		occupied = append(occupied, span{h.start, end})
	}
	if len(occupied) == 0 {
		return nil, 0
	}
	slices.SortFunc(occupied, func(a, b span) int { return a.from.Compare(b.from) })
	var free []span
	cur := occupied[0].from
	for _, o := range occupied {
		if o.from.After(cur) {
			free = append(free, span{cur, o.from})
		}
		if o.to.After(cur) {
			cur = o.to
		}
	}
	if to.After(cur) {
		free = append(free, span{cur, to})
	}

	eps := slices.Clone(episodes)
	slices.SortFunc(eps, func(a, b episode) int { return a.from.Compare(b.from) })
	at := func(tm time.Time) string { return tm.Sub(start).Round(time.Millisecond).String() }
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
		violations = append(violations, fmt.Sprintf("the lock was free from %s to %s (%v) while clients waited, no fault on, after %s: a key nobody held was left, or the waiters were not told",
			at(from), at(to), d.Round(time.Millisecond), after))
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
			got, _ := checkFreed(tt.holds, tt.episodes, t0, at(tt.to), func(time.Time, time.Time) time.Duration { return 50 * time.Millisecond })
			switch {
			case tt.want == "" && len(got) != 0:
				t.Errorf("violations %q, want none", got)
			case tt.want != "" && (len(got) != 1 || !strings.Contains(got[0], tt.want)):
				t.Errorf("violations %q, want one containing %q", got, tt.want)
			}
		})
	}
}
