package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/netlock-go/netlock"
)

// A semRecorder watches, from outside the library, what one Semaphore (one
// process) asks of Redis: a Backend wrapper (wrap) sees every script call,
// which it logs with its start, end, arguments and reply. After the run,
// resolve tells from the log on which lease each hold of the process took
// its permits and where that lease's local deadline lay, as semaphore.go
// computes it, never earlier:
//
//   - a sem_acquire grant ({1, k, 0}) makes a lease (no "g" flag), or moves
//     the deadline of the one it grows if that was still held when the
//     reply came (hold.moveUntil), to the call's start plus expiry −
//     elapsed − (expiry·drift + 2ms); a "g" grant that comes back after
//     the recorded deadline makes a lease of its own (the library's was
//     lost: it retries, or, its lease retired meanwhile, makes a new one);
//   - a sem_extend success moves it likewise;
//   - an adoption (a release granted the waiting call of nonce N in its own
//     script, and the process took the permits in without a round trip,
//     semaphore.go adopt) is not seen at all: it can only follow the last
//     sem_acquire carrying N in field 11 (a waiter's call; any later call
//     of the process carries another nonce, or folds N), and it makes, if
//     that call had no lease ("g"), a lease whose deadline is the start of
//     the first call carrying N plus expiry − (expiry·drift + 2ms): the
//     library's s.joined is taken before that call, so this is never
//     earlier. With "g" it only adds permits to the lease.
//
// The wrapper's call starts after the library's clock reading and ends
// before its own, so each deadline it computes is never before the
// library's (later by microseconds): a hold is counted valid for at least
// as long as the library tells its holder it is.
//
// It decodes the scripts' arguments and replies as lua/sem_*.lua document
// them: what any Backend sees.
type semRecorder struct {
	client            int
	expiry, driftTerm time.Duration

	mu     sync.Mutex
	calls  []*semCall
	leases []*semLease // made by resolve
	// unread counts the calls whose argument record could not read (the
	// scripts' argument format changed), and firstUnread names the first:
	// resolveSem reports them, rather than let the holds they made look
	// unexplained.
	unread      int
	firstUnread string
}

// A semCall is one script call of the process, as its recorder saw it.
type semCall struct {
	script     string // sem_acquire, sem_release, sem_extend, sem_leave
	arg        string // ARGV[1], for the report of a violation
	start, end time.Time
	vals       []int64
	err        error
	value      string
	// sem_acquire: "g" in flags; the waiter id ("" for TryAcquire); the
	// nonce folded (also sem_release's) and the nonce of the waiting call;
	// the batch of waiters.
	grow        bool
	member      string
	fold, nonce string
	batch       []semEntry
}

// A semEntry is one waiter of a sem_acquire batch: n permits, arrival (µs,
// the process's clock; 0 for TryAcquire).
type semEntry struct{ n, arrival int64 }

func (c *semCall) granted() bool { return c.err == nil && len(c.vals) > 0 && c.vals[0] == 1 }

// A semLease is one lease of a process, as its recorder saw it.
type semLease struct {
	client  int
	value   string
	made    time.Time // the end of the call that made it (for an adoption, the earliest it can have been)
	until   time.Time // the local deadline, as its grants and extends set it
	adopted string    // the nonce of the adoption that made it, or ""
	grants  int
	extends int
}

func newSemRecorder(client int, expiry time.Duration, drift float64) *semRecorder {
	return &semRecorder{
		client:    client,
		expiry:    expiry,
		driftTerm: time.Duration(float64(expiry)*drift) + 2*time.Millisecond,
	}
}

func (r *semRecorder) wrap(b netlock.Backend) netlock.Backend { return &semSpy{Backend: b, r: r} }

// record logs a call; arg is its ARGV[1].
func (r *semRecorder) record(script, arg string, start, end time.Time, vals []int64, err error) {
	f := strings.Split(arg, ":")
	c := &semCall{script: script, arg: arg, start: start, end: end, vals: vals, err: err, value: f[0]}
	switch script {
	case "sem_acquire":
		// "<value>:<base>:<seq>:<size>:<expiry ms>:<member>:<flags>:<place ms>:<tomb ms>:<fold>:<nonce>:<batch>"
		if len(f) != 12 {
			r.unreadable(script, arg)
			return
		}
		c.member, c.grow, c.fold, c.nonce = f[5], strings.Contains(f[6], "g"), f[9], f[10]
		for _, e := range strings.Split(f[11], ",") {
			n, a, _ := strings.Cut(e, "@")
			ni, _ := strconv.ParseInt(n, 10, 64)
			ai, _ := strconv.ParseInt(a, 10, 64)
			c.batch = append(c.batch, semEntry{ni, ai})
		}
	case "sem_release":
		// "<value>:<total>:<seq>:<fold>:<nonce>:<expiry ms>:<tomb ms>"
		if len(f) != 7 {
			r.unreadable(script, arg)
			return
		}
		c.fold, c.nonce = f[3], f[4]
	case "sem_extend", "sem_leave":
	default:
		return
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

// unreadable counts a call of script whose argument arg record cannot read.
func (r *semRecorder) unreadable(script, arg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unread == 0 {
		r.firstUnread = script + " " + strconv.Quote(arg)
	}
	r.unread++
}

type semSpy struct {
	netlock.Backend
	r *semRecorder
}

func (b *semSpy) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	start := time.Now()
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	end := time.Now()
	if len(args) > 0 {
		b.r.record(s.Name(), args[0], start, end, vals, err)
	}
	return vals, err
}

func (b *semSpy) Hub() *netlock.Hub {
	if s, ok := b.Backend.(netlock.Subscriber); ok {
		return s.Hub()
	}
	return nil
}

func (b *semSpy) Final(err error) bool {
	f, ok := b.Backend.(netlock.ErrorClassifier)
	return ok && f.Final(err)
}

// A semGrant is one waiter that a sem_acquire reply granted, on lease.
type semGrant struct {
	entry semEntry
	try   bool      // a TryAcquire's call (member "", arrival 0)
	at    time.Time // the call's end
	lease *semLease
}

// A semAdoption is where the process may have taken in, without a round
// trip, a grant made under nonce to the waiter entry: after the last call
// carrying the nonce, on lease (one the adoption makes, or the one it
// grows).
type semAdoption struct {
	nonce  string
	entry  semEntry
	after  time.Time
	lease  *semLease
	folded bool // a later call folded the nonce into its count: taken in
}

// A semLog is what resolve makes of a process's calls.
type semLog struct {
	grants    []semGrant
	adoptions []*semAdoption
	leases    []*semLease // in the order made
}

// build replays the process's calls, in the order they ended, into its
// leases (see semRecorder), the grants of the replies and the possible
// adoptions.
func (r *semRecorder) build() *semLog {
	r.mu.Lock()
	calls := slices.Clone(r.calls)
	r.mu.Unlock()
	slices.SortStableFunc(calls, func(a, b *semCall) int { return a.end.Compare(b.end) })
	first := map[string]time.Time{} // each nonce's first call's start: not before s.joined
	last := map[string]*semCall{}   // each nonce's last waiter's call
	for _, c := range calls {
		if c.script != "sem_acquire" || c.nonce == "" {
			continue
		}
		if t, ok := first[c.nonce]; !ok || c.start.Before(t) {
			first[c.nonce] = c.start
		}
		if c.member != "" && len(c.batch) > 0 {
			last[c.nonce] = c
		}
	}
	lg := &semLog{}
	current := map[string]*semLease{} // each value's latest lease
	adoptions := map[string]*semAdoption{}
	newLease := func(value string, made, until time.Time) *semLease {
		l := &semLease{client: r.client, value: value, made: made, until: until}
		current[value] = l
		lg.leases = append(lg.leases, l)
		return l
	}
	fold := func(nonce string) {
		if a := adoptions[nonce]; a != nil {
			a.folded = true
		}
	}
	for _, c := range calls {
		until := c.start.Add(r.expiry - c.end.Sub(c.start) - r.driftTerm)
		switch c.script {
		case "sem_acquire":
			fold(c.fold)
			switch {
			case c.granted() && len(c.vals) >= 2:
				l := current[c.value]
				switch {
				case !c.grow || l == nil || !c.end.Before(l.until):
					// A new lease; or one grown after its deadline
					// passed: the library's was lost, and it retries or
					// (its lease retired meanwhile) makes a new one.
					l = newLease(c.value, c.end, until)
				case until.After(l.until):
					l.until = until
				}
				l.grants++
				k := min(int(c.vals[1]), len(c.batch))
				for _, e := range c.batch[:max(k, 0)] {
					lg.grants = append(lg.grants, semGrant{entry: e, try: c.member == "", at: c.end, lease: l})
				}
			case c.nonce != "" && last[c.nonce] == c:
				a := &semAdoption{nonce: c.nonce, entry: c.batch[0], after: c.end}
				if l := current[c.value]; c.grow && l != nil {
					a.lease = l // more permits on it: its deadline stays
				} else {
					a.lease = newLease(c.value, c.end, first[c.nonce].Add(r.expiry-r.driftTerm))
					a.lease.adopted = c.nonce
				}
				adoptions[c.nonce] = a
				lg.adoptions = append(lg.adoptions, a)
			}
		case "sem_release":
			fold(c.fold)
		case "sem_extend":
			if l := current[c.value]; c.err == nil && len(c.vals) > 0 && c.vals[0] == 1 && l != nil &&
				c.end.Before(l.until) && until.After(l.until) {
				l.until = until
				l.extends++
			}
		}
	}
	r.mu.Lock()
	r.leases = lg.leases
	r.mu.Unlock()
	return lg
}

// semAssoc counts how resolve explained the holds.
type semAssoc struct {
	byGrant, byAdoption, byHandOn, ambiguous, unexplained int
	adoptions, folded                                     int // possible adoptions; of them, folded by a later call
}

// resolveSem tells, for each hold, the lease it took its permits on (the
// hold's lease) and that lease's local deadline (until), from its client's
// recorder (recs[client]). A hold's waiter is known by its permits and its
// arrival, which lies between a0 (before Acquire) and start (after it
// returned); a TryAcquire by its permits and a call with no waiter id. Its
// candidates are the replies that granted such a waiter between a0 and
// start, and, for an Acquire, the possible adoptions of such a waiter
// before start (with any lease of that value made after the adoption's call
// and before start: the process may have grown that one instead). A reply
// may grant a waiter that then adopts a grant all the same (the reply came
// after its lease's deadline: the library retries), and another waiter of
// the process may match too: all are candidates. The hold's deadline is
// the latest of its candidates': exact when there is one, and never earlier
// than the library's. An Acquire's hold that no call explains may have
// been handed on (semaphore.go handOnLocked): its permits stay on the lease
// of a hold of the same client, of at least as many permits, whose release
// ran while the hold's Acquire did (see handOnCands). A hold that nothing
// explains gets the latest deadline of any lease of its client made before
// it, and a line in unexplained.
func resolveSem(recs []*semRecorder, holds, gaveUp []semHold) (unexplained []string, st semAssoc) {
	logs := make([]*semLog, len(recs))
	for i, r := range recs {
		r.mu.Lock()
		if r.unread > 0 {
			unexplained = append(unexplained, fmt.Sprintf("client %d: %d script calls whose argument the recorder cannot read (the first: %s): the history misses them", r.client, r.unread, r.firstUnread))
		}
		r.mu.Unlock()
		logs[i] = r.build()
		st.adoptions += len(logs[i].adoptions)
		for _, a := range logs[i].adoptions {
			if a.folded {
				st.folded++
			}
		}
	}
	for i := range holds {
		h := &holds[i]
		cands, byGrant := h.callCands(logs[h.client])
		h.lease, h.until = nil, time.Time{}
		switch {
		case len(cands) == 0:
			continue // a hand-on, or nothing: below
		case byGrant:
			st.byGrant++
		default:
			st.byAdoption++
		}
		st.ambiguous += h.pick(cands)
	}
	for i := range gaveUp {
		g := &gaveUp[i]
		cands, _ := g.callCands(logs[g.client])
		g.lease, g.until = nil, time.Time{}
		g.pick(cands)
	}
	// Hand-ons, again while one more is explained: a hold handed on by a
	// waiter that was itself handed on, and gave up.
	sources := [][]semHold{holds, gaveUp}
	for more := true; more; {
		more = false
		for k, hs := range sources {
			for i := range hs {
				h := &hs[i]
				if h.lease != nil {
					continue
				}
				if cands := handOnCands(sources, h); len(cands) > 0 {
					more = true
					if a := h.pick(cands); k == 0 {
						st.byHandOn++
						st.ambiguous += a
					}
				}
			}
		}
	}
	for i := range holds {
		h := &holds[i]
		if h.lease != nil {
			continue
		}
		st.unexplained++
		unexplained = append(unexplained, fmt.Sprintf("hold %d (client %d): no grant, adoption or hand-on of the client explains it", i, h.client))
		var cands []*semLease
		for _, l := range logs[h.client].leases {
			if !l.made.After(h.start) {
				cands = append(cands, l)
			}
		}
		st.ambiguous += h.pick(cands)
	}
	return unexplained, st
}

// callCands returns the leases that the calls of h's client (lg) may have
// given h its permits on (see resolveSem), and whether a reply granted
// them (byGrant) rather than an adoption.
func (h *semHold) callCands(lg *semLog) (cands []*semLease, byGrant bool) {
	lo, hi := h.a0.UnixMicro(), h.start.UnixMicro()
	for _, g := range lg.grants {
		if g.entry.n == h.n && g.try == h.try && !g.at.Before(h.a0) && !g.at.After(h.start) &&
			(h.try || (g.entry.arrival >= lo && g.entry.arrival <= hi)) {
			cands = append(cands, g.lease)
		}
	}
	byGrant = len(cands) > 0
	if h.try {
		return cands, byGrant
	}
	for _, a := range lg.adoptions {
		if a.entry.n != h.n || a.entry.arrival < lo || a.entry.arrival > hi || a.after.After(h.start) {
			continue
		}
		cands = append(cands, a.lease)
		for _, l := range lg.leases {
			if l.value == a.lease.value && !l.made.Before(a.after) && !l.made.After(h.start) {
				cands = append(cands, l)
			}
		}
	}
	return cands, byGrant
}

// handOnCands returns the leases that may have handed h on: those of the
// holds and given-up waiters (sources) of its client, of at least as many
// permits, whose release ran while h's Acquire did (and began before it
// returned); a waiter that gave up passes permits it was given on within
// its Acquire. A TryAcquire is never handed on.
func handOnCands(sources [][]semHold, h *semHold) (cands []*semLease) {
	if h.try {
		return nil
	}
	for _, hs := range sources {
		for j := range hs {
			o := &hs[j]
			if o == h || o.client != h.client || o.lease == nil || o.n < h.n ||
				o.releaseStart.IsZero() || o.releaseStart.After(h.start) || o.releaseEnd.Before(h.a0) {
				continue
			}
			cands = append(cands, o.lease)
		}
	}
	return cands
}

// pick makes the latest deadline of the candidate leases the hold's, and
// returns 1 if they are several (ambiguous), else 0.
func (h *semHold) pick(cands []*semLease) int {
	for _, l := range cands {
		if h.lease != nil && l != h.lease {
			h.ambiguous = true
		}
		if h.lease == nil || l.until.After(h.until) {
			h.lease, h.until = l, l.until
		}
	}
	if h.ambiguous {
		return 1
	}
	return 0
}

// semResource is the resource a semaphore guards: it logs every write, by
// hold, with its time, and the permits the writer holds.
type semResource struct {
	mu     sync.Mutex
	writes []semWrite
}

type semWrite struct {
	hold int
	at   time.Time
}

func (r *semResource) write(hold int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, semWrite{hold: hold, at: time.Now()})
}

// semHold is one hold of permits by one goroutine, from Acquire returning to
// Release.
type semHold struct {
	client int
	n      int64
	try    bool      // a TryAcquire
	a0     time.Time // before Acquire (or TryAcquire) was called
	lease  *semLease // from the client's recorder (resolveSem); nil if nothing explains it
	// ambiguous: several leases could explain it; until is the latest of
	// their deadlines.
	ambiguous bool
	// start: Acquire has returned; end: the critical section is over
	// (before Release), having stopped early if Lost() closed (stopped).
	start, end               time.Time
	validAtStart, validAtEnd bool
	stopped                  bool
	until                    time.Time // the lease's local deadline, read once every client has stopped
	lostAt                   time.Time // when Lost() was seen closed; zero if not before Release returned
	releaseStart             time.Time
	releaseEnd               time.Time // ReleaseCtx returned
	releaseErr               error
	paused                   bool
}

// validEnd returns when the hold stops counting: the end of its section,
// its lease's local deadline, or Lost() closing, whichever came first; its
// start if Lost() was closed already when Acquire returned.
func (h *semHold) validEnd() time.Time {
	if !h.validAtStart {
		return h.start
	}
	e := h.end
	if h.until.Before(e) {
		e = h.until
	}
	if !h.lostAt.IsZero() && h.lostAt.Before(e) {
		e = h.lostAt
	}
	if e.Before(h.start) {
		return h.start
	}
	return e
}

// signalled reports whether Lost() closed before Release was called.
func (h *semHold) signalled() bool {
	return !h.lostAt.IsZero() && h.lostAt.Before(h.releaseStart)
}

type semFigures struct {
	holds, lost, stopped, invalidAtStart int
	maxPermits                           int64         // the most permits valid at once
	maxLate                              time.Duration // latest Lost() after the lease's deadline
	writesLate                           int           // writes after the hold's valid end (a late Lost())
}

// checkSemHistory checks a history of holds of one semaphore of size (every
// client in one process, so their monotonic clocks compare). A hold counts
// its permits from start to validEnd. It returns one line per violation:
//
//   - at some instant, valid holds have more than size permits out;
//   - a write of a hold came after its lease's local deadline by more than
//     its slack (the holder checks Lost() before each write);
//   - Lost() closed later than its slack after the lease's deadline, or
//     not at all before Release although that slack had passed.
//
// slack(from, to) is as checkHistory's.
func checkSemHistory(holds []semHold, writes []semWrite, size int64, slack func(from, to time.Time) time.Duration) (violations []string, fig semFigures) {
	fig.holds = len(holds)
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	desc := func(i int) string {
		h := &holds[i]
		return fmt.Sprintf("hold %d (client %d, %d permits)", i, h.client, h.n)
	}

	type event struct {
		at   time.Time
		hold int
		in   bool
	}
	var events []event
	for i := range holds {
		h := &holds[i]
		if !h.validAtStart {
			fig.invalidAtStart++
		}
		if h.stopped {
			fig.stopped++
		}
		if e := h.validEnd(); e.After(h.start) {
			events = append(events, event{h.start, i, true}, event{e, i, false})
		}
	}
	// Exits before entries at the same instant: [start, end).
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		switch {
		case a.in == b.in:
			return 0
		case a.in:
			return 1
		}
		return -1
	})
	var out int64
	active := map[int]bool{}
	over := false // reported the current excess already
	for _, e := range events {
		h := &holds[e.hold]
		if !e.in {
			out -= h.n
			delete(active, e.hold)
			if out <= size {
				over = false
			}
			continue
		}
		out += h.n
		active[e.hold] = true
		fig.maxPermits = max(fig.maxPermits, out)
		if out > size && !over {
			over = true
			var who []string
			for _, k := range slices.Sorted(mapsKeys(active)) {
				who = append(who, desc(k))
			}
			bad("%d permits of valid holds out at once, size %d: %s", out, size, strings.Join(who, ", "))
		}
	}

	for _, w := range writes {
		h := &holds[w.hold]
		if !w.at.After(h.validEnd()) {
			continue
		}
		fig.writesLate++
		if late := w.at.Sub(h.until); w.at.After(h.until) && late > slack(h.until, w.at) {
			bad("a write of %s came %v after its lease's local deadline", desc(w.hold), late)
		}
	}

	for i := range holds {
		h := &holds[i]
		lostEarly := h.signalled() && h.lostAt.Before(h.end)
		if lostEarly || !h.validAtStart || !h.validAtEnd {
			fig.lost++
		}
		if h.signalled() {
			if !h.lostAt.After(h.until) {
				continue
			}
			late := h.lostAt.Sub(h.until)
			fig.maxLate = max(fig.maxLate, late)
			if late > slack(h.until, h.lostAt) {
				bad("%s: Lost() closed %v after its lease's local deadline", desc(i), late)
			}
			continue
		}
		if late := h.releaseStart.Sub(h.until); late > slack(h.until, h.releaseStart) {
			bad("%s: Lost() still open %v after its lease's local deadline", desc(i), late)
		}
	}
	return violations, fig
}

func mapsKeys(m map[int]bool) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestCheckSemHistory feeds checkSemHistory a good history and, for each
// rule, one that breaks it, so that the chaos test's checker is known to
// bite.
func TestCheckSemHistory(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	hold := func(client int, n int64, start, end int) semHold {
		return semHold{client: client, n: n, start: at(start), end: at(end), validAtStart: true, validAtEnd: true,
			until: at(end + 500), releaseStart: at(end)}
	}
	// lost: its lease's deadline at lost, Lost() closed then, the section
	// stopped at end.
	lost := func(client int, n int64, start, lostMS, end int) semHold {
		h := hold(client, n, start, end)
		h.validAtEnd, h.until, h.lostAt, h.stopped = false, at(lostMS), at(lostMS), true
		return h
	}
	good := []semHold{hold(0, 2, 0, 10), hold(1, 1, 5, 20), hold(2, 2, 10, 30), lost(3, 1, 0, 5, 40), hold(4, 1, 31, 35)}
	goodWrites := []semWrite{{0, at(1)}, {3, at(4)}, {2, at(29)}}
	tests := []struct {
		name   string
		holds  []semHold
		writes []semWrite
		want   string
	}{
		{"good", good, goodWrites, ""},
		{"over", []semHold{hold(0, 2, 0, 10), hold(1, 2, 5, 20)}, nil, "4 permits of valid holds out at once, size 3"},
		{"over after a deadline not signalled", []semHold{func() semHold { h := hold(0, 2, 0, 100); h.until = at(40); return h }(), hold(1, 2, 60, 70)},
			nil, "Lost() still open 60ms after"},
		{"valid until the deadline", []semHold{func() semHold { h := hold(0, 2, 0, 100); h.until = at(50); return h }(), hold(1, 2, 40, 70)},
			nil, "out at once"},
		{"Lost() late", []semHold{func() semHold { h := lost(0, 1, 0, 10, 300); h.lostAt = at(200); return h }()}, nil, "Lost() closed 190ms after"},
		{"late write", []semHold{lost(0, 1, 0, 10, 300)}, []semWrite{{0, at(200)}}, "came 190ms after"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := checkSemHistory(tt.holds, tt.writes, 3, fixedSlack)
			switch {
			case tt.want == "" && len(got) != 0:
				t.Errorf("violations %q, want none", got)
			case tt.want != "" && !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, tt.want) }):
				t.Errorf("violations %q, want one containing %q", got, tt.want)
			}
		})
	}
	if _, fig := checkSemHistory(good, goodWrites, 3, fixedSlack); fig.maxPermits != 3 || fig.lost != 1 {
		t.Errorf("figures of the good history: %+v, want at most 3 permits, 1 lost", fig)
	}
}

// TestCheckSemHistoryResolve feeds resolveSem the calls of a few processes, as their
// recorders would log them, and checks the lease and deadline it gives each
// hold: by a reply's grant (the first waiter, one taken in with it, a
// TryAcquire), by an adoption (a lease made by it, from the first call
// under its nonce, then extended; more permits on a lease held), by either
// (the latest deadline), and none.
// It then checks that checkSemHistory counts an adopted hold until its
// lease's deadline, and no further.
func TestCheckSemHistoryResolve(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	us := func(ms int) string { return strconv.FormatInt(at(ms).UnixMicro(), 10) }
	const expiry = time.Second
	recs := []*semRecorder{newSemRecorder(0, expiry, 0.01), newSemRecorder(1, expiry, 0.01), newSemRecorder(2, expiry, 0.01), newSemRecorder(3, expiry, 0.01)}
	// driftTerm: 10ms + 2ms.
	call := func(r *semRecorder, script, arg string, start, end int, vals ...int64) {
		r.record(script, arg, at(start), at(end), vals, nil)
	}
	// Client 0: a grant at 0–2 on V1 (until 0 + 1000 − 2 − 12 = 986); a
	// refused call of a waiter with nonce N2 growing it ("g") at 20–21,
	// adopted: on V1.
	call(recs[0], "sem_acquire", "V1:0:1:3:1000:w0::3000:10000:::1@"+us(-1), 0, 2, 1, 1, 0)
	call(recs[0], "sem_acquire", "V1:1:2:3:1000:w0:gw:3000:10000::N2:1@"+us(19), 20, 21, -1, 0, 500)
	// Client 1: a waiter's refused calls under N1 at 10–11 and 600–601,
	// on V2 without a lease; adopted (a release folds N1 later); V2
	// extended at 800–801: until 800 + 1000 − 1 − 12 = 1787; without the
	// extend, 10 + 1000 − 12 = 998.
	call(recs[1], "sem_acquire", "V2:0:1:3:1000:w1:w:3000:10000::N1:2@"+us(9), 10, 11, -1, 0, 500)
	call(recs[1], "sem_acquire", "V2:0:2:3:1000:w1::3000:10000::N1:2@"+us(9), 600, 601, -1, 0, 500)
	call(recs[1], "sem_extend", "V2:1000:3000", 800, 801, 1)
	call(recs[1], "sem_release", "V2:0:3:N1::1000:10000", 900, 901, 1, 0)
	// Client 2: one call grants two waiters at 100–103 (until 1085); a
	// TryAcquire at 200–202 after that lease was released (until 1186).
	call(recs[2], "sem_acquire", "V3:0:1:3:1000:w2::3000:10000:::1@"+us(98)+",2@"+us(99), 100, 103, 1, 2, 0)
	call(recs[2], "sem_release", "V3:0:2:::1000:10000", 150, 151, 1, 0)
	call(recs[2], "sem_acquire", "V4:0:3:3:1000:::3000:10000:::2@0", 200, 202, 1, 1, 0)
	// Client 3: a lease V5 granted at 0–1 (until 987); a waiter's call
	// under N5 growing it is granted at 2000–2001, after that deadline (a
	// lease of its own, until 2987: the library's was lost, and it
	// retries); its next call, on a new value V6, is refused, and it
	// adopts: V6 until 2000 + 1000 − 12 = 2988, the later of the two.
	call(recs[3], "sem_acquire", "V5:0:1:3:1000:w3::3000:10000:::1@"+us(-1), 0, 1, 1, 1, 0)
	call(recs[3], "sem_acquire", "V5:1:2:3:1000:w3:gw:3000:10000::N5:2@"+us(299), 2000, 2001, 1, 1, 0)
	call(recs[3], "sem_acquire", "V6:0:3:3:1000:w3:w:3000:10000::N5:2@"+us(299), 2100, 2101, -1, 0, 500)

	hold := func(client int, n int64, a0, start int) semHold {
		return semHold{client: client, n: n, a0: at(a0), start: at(start)}
	}
	holds := []semHold{
		hold(0, 1, -1, 3),   // 0: the grant at 0–2
		hold(1, 2, 9, 700),  // 1: adopted, a lease of its own, extended
		hold(0, 1, 19, 50),  // 2: adopted onto V1
		hold(0, 2, 25, 30),  // 3: nothing explains it
		hold(2, 1, 97, 104), // 4: first of the batch
		hold(2, 2, 98, 105), // 5: taken in with it
		func() semHold { h := hold(2, 2, 199, 203); h.try = true; return h }(), // 6: TryAcquire
		hold(3, 2, 299, 2200), // 7: a reply and an adoption
		hold(2, 1, 140, 146),  // 8: handed on by hold 4's release at 145–147
	}
	holds[4].releaseStart, holds[4].releaseEnd = at(145), at(147)
	unexpl, st := resolveSem(recs, holds, nil)
	want := []struct {
		value string
		until int
	}{{"V1", 986}, {"V2", 1787}, {"V1", 986}, {"V1", 986}, {"V3", 1085}, {"V3", 1085}, {"V4", 1186}, {"V6", 2988}, {"V3", 1085}}
	for i, w := range want {
		h := holds[i]
		if h.lease == nil || h.lease.value != w.value || !h.until.Equal(at(w.until)) {
			got := "none"
			if h.lease != nil {
				got = fmt.Sprintf("%s until %v", h.lease.value, h.until.Sub(t0))
			}
			t.Errorf("hold %d: lease %s, want %s until %dms", i, got, w.value, w.until)
		}
	}
	if len(unexpl) != 1 || !strings.Contains(unexpl[0], "hold 3 ") {
		t.Errorf("unexplained %q, want hold 3 alone", unexpl)
	}
	if st.byGrant != 5 || st.byAdoption != 2 || st.byHandOn != 1 || st.unexplained != 1 || st.adoptions != 3 || st.folded != 1 || st.ambiguous != 1 {
		t.Errorf("association %+v, want 5 by grant, 2 by adoption, 1 by hand-on, 1 unexplained, 3 adoptions (1 folded), 1 ambiguous", st)
	}
	if !holds[7].ambiguous {
		t.Errorf("hold 7 not ambiguous")
	}

	// Without the extend, the adopted lease ends at 10 + 1000 − 12 = 998:
	// a hold on it to 1500 without Lost() closing is caught, and counts
	// until then, no further.
	r := newSemRecorder(0, expiry, 0.01)
	call(r, "sem_acquire", "V2:0:1:3:1000:w1:w:3000:10000::N1:2@"+us(9), 10, 11, -1, 0, 500)
	adopted := func() []semHold {
		h := hold(0, 2, 9, 700)
		h.end, h.releaseStart, h.validAtStart, h.validAtEnd = at(1500), at(1500), true, true
		return []semHold{h}
	}
	other := func(start, end int) semHold {
		return semHold{client: 1, n: 2, start: at(start), end: at(end), validAtStart: true, validAtEnd: true, until: at(end + 500), releaseStart: at(end)}
	}
	for _, tt := range []struct {
		name  string
		other semHold
		want  []string
	}{
		{"overlap before the adopted deadline", other(900, 1100), []string{"4 permits of valid holds out at once", "Lost() still open"}},
		{"after the adopted deadline", other(1000, 1100), []string{"Lost() still open"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			holds := append(adopted(), tt.other)
			if unexpl, _ := resolveSem([]*semRecorder{r, newSemRecorder(1, expiry, 0.01)}, holds[:1], nil); len(unexpl) != 0 {
				t.Fatalf("unexplained %q", unexpl)
			}
			if !holds[0].until.Equal(at(998)) {
				t.Fatalf("adopted hold until %v, want 998ms", holds[0].until.Sub(t0))
			}
			got, _ := checkSemHistory(holds, nil, 3, fixedSlack)
			if len(got) != len(tt.want) {
				t.Errorf("violations %q, want %d", got, len(tt.want))
			}
			for _, w := range tt.want {
				if !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, w) }) {
					t.Errorf("violations %q, want one containing %q", got, w)
				}
			}
		})
	}
}

// TestSemRecorderUnreadable: a call whose argument the recorder cannot read
// (the scripts' format changed, and the recorder did not) is reported by
// resolveSem by name, not left to make holds look unexplained.
func TestSemRecorderUnreadable(t *testing.T) {
	r := newSemRecorder(4, time.Second, 0.01)
	at := time.Now()
	r.record("sem_acquire", "V1:0:1:3:1000:w0::3000:::1@1", at, at, []int64{1, 1, 0}, nil) // 11 fields
	r.record("sem_release", "V1:0:2:::1000", at, at, []int64{1, 0}, nil)                   // 6 fields
	r.record("sem_extend", "V1:1000:3000", at, at, []int64{1}, nil)
	unexpl, _ := resolveSem([]*semRecorder{r}, nil, nil)
	if len(unexpl) != 1 || !strings.Contains(unexpl[0], "client 4: 2 script calls") || !strings.Contains(unexpl[0], `sem_acquire "V1:0:1:3:1000:w0::3000:::1@1"`) {
		t.Errorf("unexplained %q, want client 4's 2 unreadable calls, the first named", unexpl)
	}
}
