package chaos

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/netlock-go/netlock"
)

// An rwRecorder is a recorder (see recorder) for one NetRWMutex: a Backend
// wrapper on each of its nodes (wrap) sees every rw_acquire call, and an
// Observer (observer) sees how each acquire ended and every extend round,
// of the write lock (token above 0) and of the process's read lease (token
// 0). From them it computes the local deadline of each write
// hold and of each read lease: the start of the round that made or
// extended it plus its validity, expiry − elapsed − (expiry·drift + 2ms).
//
// It decodes the scripts' arguments and replies as lua/rw_acquire.lua
// documents them: ARGV[1] "<mode>:<value>:<expiry>:<proposal>:<member>:...",
// reply {1, token, ...} when the node granted (or a release had, and the
// round adopted it). Over one backend a release may grant a waiter its hold
// and tell it by message, without a round (lua/rw_wake.lua): the waiter's
// member then carries a nonce, "<id>+<expiry ms>+<nonce>+<holder>", and the hold
// counts from the start of the first call that carried it, as for a
// NetMutex (see recorder).
type rwRecorder struct {
	expiry, driftTerm time.Duration

	mu        sync.Mutex
	rounds    map[string]*round // acquire rounds, by their value (fresh every round)
	byToken   map[uint64]*round // the round in which a node granted each writer's token
	readRound *round            // the latest reader round in which a node granted
	writers   map[uint64]*leaseTiming
	lease     *leaseTiming // the read lease the process holds or held last
	// last is the hold the process acquired last, a read lease or a write
	// lock: the one its readers share (readers read under their process's
	// write lock when its read sections are short, see
	// netlock.NetRWMutex).
	last *leaseTiming
	// joins: the start of the first call under each nonce; nonces: the
	// nonce of the latest waiting call of the writer ('w') and of the
	// reader ('r'), each running one acquire at a time.
	joins  map[string]time.Time
	nonces map[byte]string

	// trace, if set, records every script call of client.
	trace  *evalTrace
	client int
}

// leaseTiming is what an rwRecorder knows of one write hold or read lease.
type leaseTiming struct {
	mu          sync.Mutex
	until, ext  time.Time // the deadline the acquire gave it; the latest an extend gave it
	explained   bool      // a granting round the recorder saw explains it
	handedOvers int       // times the lease went to another local acquire without a round trip
	// lostAt and reason: when and why the Observer's Lost said the hold
	// was lost (the engine's own account, logged beside a violation).
	lostAt time.Time
	reason netlock.LostReason
}

// lost returns when and why the Observer said the hold was lost; a zero
// time if it did not.
func (l *leaseTiming) lost() (time.Time, netlock.LostReason) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostAt, l.reason
}

// deadline returns the hold's local deadline, as its acquire and its
// successful extends so far set it.
func (l *leaseTiming) deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ext.After(l.until) {
		return l.ext
	}
	return l.until
}

func newRWRecorder(expiry time.Duration, drift float64) *rwRecorder {
	return &rwRecorder{
		expiry:    expiry,
		driftTerm: time.Duration(float64(expiry)*drift) + 2*time.Millisecond,
		rounds:    map[string]*round{},
		byToken:   map[uint64]*round{},
		joins:     map[string]time.Time{},
		nonces:    map[byte]string{},
		writers:   map[uint64]*leaseTiming{},
	}
}

// wrap returns b, watched by r.
func (r *rwRecorder) wrap(b netlock.Backend) netlock.Backend { return &rwSpyBackend{Backend: b, r: r} }

// observer returns the Observer to give the NetRWMutex with WithObserver.
func (r *rwRecorder) observer() netlock.Observer {
	return netlock.Observer{Acquire: r.acquire, Extend: r.extended, Lost: r.lost}
}

// lost is the Observer's Lost: it notes when and why the engine declared
// the write hold of the token (or, token 0, the current read lease) lost.
func (r *rwRecorder) lost(x netlock.LostHold) {
	at := time.Now()
	r.mu.Lock()
	l := r.lease
	if x.Token > 0 {
		l = r.writers[x.Token]
	}
	r.mu.Unlock()
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.lostAt.IsZero() {
		l.lostAt, l.reason = at, x.Reason
	}
	l.mu.Unlock()
}

// validity returns the local deadline a hold made in rd gets.
func (r *rwRecorder) validity(rd *round) time.Time {
	return rd.first.Add(r.expiry - rd.last.Sub(rd.first) - r.driftTerm)
}

// acquire is the Observer's Acquire: as an acquire that succeeded returns,
// it records the hold's deadline: a writer's from the round that granted
// its token; a new read lease's from the latest reader round that granted
// (the process runs one reader acquire at a time, and its lease must end
// before the next begins); a lease handed over, from the one it was.
func (r *rwRecorder) acquire(ctx context.Context, _ netlock.AcquireStart) (context.Context, func(netlock.AcquireDone)) {
	return ctx, func(d netlock.AcquireDone) {
		if !d.Acquired {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if d.Token > 0 {
			if l := r.writers[d.Token]; d.HandedOver && l != nil {
				// Handed to another writer of the process: the same
				// hold.
				l.mu.Lock()
				l.handedOvers++
				l.mu.Unlock()
				r.last = l
				return
			}
			l := &leaseTiming{}
			if rd := r.byToken[d.Token]; rd != nil {
				l.until, l.explained = r.validity(rd), true
			} else {
				l.until, l.explained = r.byMessage('w')
			}
			delete(r.joins, r.nonces['w'])
			delete(r.nonces, 'w')
			r.writers[d.Token] = l
			r.last = l
			r.prune()
			return
		}
		if d.HandedOver && r.lease != nil {
			r.lease.mu.Lock()
			r.lease.handedOvers++
			r.lease.mu.Unlock()
			r.last = r.lease
			return
		}
		l := &leaseTiming{}
		if rd := r.readRound; rd != nil {
			l.until, l.explained = r.validity(rd), true
		} else {
			l.until, l.explained = r.byMessage('r')
		}
		delete(r.joins, r.nonces['r'])
		delete(r.nonces, 'r')
		r.readRound = nil
		r.lease = l
		r.last = l
		r.prune()
	}
}

// byMessage returns the local deadline of a hold of mode ('w' or 'r') that
// no round granted: a release's grant, told by message to the current
// waiting call, whose first call began the join. The caller holds r.mu.
func (r *rwRecorder) byMessage(mode byte) (time.Time, bool) {
	joined, ok := r.joins[r.nonces[mode]]
	if !ok {
		return time.Time{}, false
	}
	return joined.Add(r.expiry - r.driftTerm), true
}

// prune forgets the rounds that ended long ago. The caller holds r.mu.
func (r *rwRecorder) prune() {
	old := time.Now().Add(-10 * r.expiry)
	for n, j := range r.joins {
		if j.Before(old) {
			delete(r.joins, n)
		}
	}
	for v, rd := range r.rounds {
		if rd.last.Before(old) {
			delete(r.rounds, v)
		}
	}
	for t, rd := range r.byToken {
		if rd.last.Before(old) {
			delete(r.byToken, t)
		}
	}
}

// writer returns the timing of the write hold with token; nil if no
// acquire of it returned.
func (r *rwRecorder) writer(token uint64) *leaseTiming {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writers[token]
}

// currentLease returns the timing of the hold the process's readers share:
// the read lease it holds, or the write lock they read under (the hold
// acquired last).
func (r *rwRecorder) currentLease() *leaseTiming {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// extended is the Observer's Extend: a successful round moves the hold's
// deadline to the round's start plus its validity.
func (r *rwRecorder) extended(_ context.Context, d netlock.ExtendDone) {
	if d.Err != nil {
		return
	}
	start := time.Now().Add(-d.Took)
	until := start.Add(r.expiry - d.Took - r.driftTerm)
	r.mu.Lock()
	l := r.lease
	if d.Token > 0 {
		l = r.writers[d.Token]
	}
	r.mu.Unlock()
	if l == nil {
		return
	}
	l.mu.Lock()
	if until.After(l.ext) {
		l.ext = until
	}
	l.mu.Unlock()
}

// rwSpyBackend is one client's Backend on one node as its rwRecorder sees
// it; it forwards everything, as spyBackend does.
type rwSpyBackend struct {
	netlock.Backend
	r *rwRecorder
}

func (b *rwSpyBackend) Eval(ctx context.Context, s *netlock.Script, keys, args []string) ([]int64, error) {
	start := time.Now()
	vals, err := b.Backend.Eval(ctx, s, keys, args)
	end := time.Now()
	if t := b.r.trace; t != nil {
		t.add(b.r.client, s.Name(), args, vals, err, start, end)
	}
	if s.Name() != "rw_acquire" || len(args) != 1 {
		return vals, err
	}
	f := strings.Split(args[0], ":")
	if len(f) < 2 {
		return vals, err
	}
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(f) > 4 && f[0] != "" {
		if m := strings.Split(f[4], "+"); len(m) == 4 { // "<id>+<expiry>+<nonce>+<holder>"
			nonce := m[2]
			if _, ok := r.joins[nonce]; !ok {
				r.joins[nonce] = start
			}
			r.nonces[f[0][0]] = nonce
		}
	}
	rd := r.rounds[f[1]]
	if rd == nil {
		rd = &round{first: start}
		r.rounds[f[1]] = rd
	}
	if start.Before(rd.first) {
		rd.first = start
	}
	if end.After(rd.last) {
		rd.last = end
	}
	if err == nil && len(vals) >= 2 && vals[0] == 1 {
		if f[0] == "w" {
			r.byToken[uint64(vals[1])] = rd
		} else {
			r.readRound = rd
		}
	}
	return vals, err
}

// Hub and Final forward the optional interfaces of the wrapped Backend.
func (b *rwSpyBackend) Hub() *netlock.Hub {
	if s, ok := b.Backend.(netlock.Subscriber); ok {
		return s.Hub()
	}
	return nil
}

func (b *rwSpyBackend) Final(err error) bool {
	f, ok := b.Backend.(netlock.ErrorClassifier)
	return ok && f.Final(err)
}
