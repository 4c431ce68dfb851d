package netlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// A Semaphore is a weighted semaphore shared across processes and machines
// through Redis: at most size permits are out at once among every client of
// the name. Its methods are golang.org/x/sync/semaphore.Weighted's
// (Acquire, TryAcquire, Release), with ReleaseCtx, which returns errors
// instead of panicking, and Lost.
//
// The rule is x/sync's, across processes: n permits are granted when they
// are free and no waiter came before, so a large request is not starved by
// a stream of small ones; waiters are served in order of arrival (the
// clients' clocks order the arrivals of different processes: skew makes the
// order less fair, never stuck). A waiter whose process died keeps its place
// for at most three expiries.
//
// The permits of one process are held on one lease in Redis, shared by its
// goroutines: a thousand goroutines holding permits cost one lease and one
// extend per interval. An uncontended Acquire and a Release are one round
// trip each (the permits change in Redis, where other processes count
// them); the goroutines of a process that wait get in together, with one
// call, as far as they fit and came before every other process's waiter;
// and a waiter is woken by a message that grants it its permits, set aside
// for it by the release's script, so that it holds without a round trip of
// its own. A Release while goroutines of the same process wait hands the
// permits on to them, in their order of arrival, without a round trip: up
// to WithLocalHandoffs times in a row, and while the lease has more than
// half its expiry left (with auto-extend on); then it gives them back in
// Redis, so that other processes get their turn. The lease expires when its
// process dies and is extended while it lives (WithAutoExtend); if it
// lapses, every permit of the process is gone at once, which Lost tells by
// the local clock.
//
// A Semaphore runs on one Backend: one Redis server (with its replicas,
// Sentinel) or a Redis Cluster. Not on a quorum of independent deployments:
// a majority vote keeps one holder, but not k. With size 2 and three nodes,
// leases granted on nodes {1,2}, {2,3} and {1,3} are each within the size on
// every node, yet three are out; bounding k holders takes every k+1
// quorums to meet on one node, which for k ≥ 2 needs nearly all nodes (all
// five of five for k = 4), so a node down would stop the semaphore.
// NewSemaphore refuses several backends for that reason.
//
// Permits carry no fencing token: up to size holders are in at once by
// design, so a resource cannot tell a stale holder from a current one by the
// highest token, as it does behind a NetMutex. A holder checks Lost, or
// bounds its work by the lease's deadline.
//
// A Semaphore must be created with NewSemaphore and must not be copied
// after first use.
type Semaphore struct {
	m       *engine   // the engine: the node, options, limiter, pub/sub, the local queue, and the lease's watchdog
	kind    *semLease // m.leaseKind: its extend, and the local admission rule
	size    int64
	keys    []string // see lua/sem_acquire.lua
	placeMS string   // how long a waiter's place lasts: placeExpiries

	// op orders this process's calls that change its lease in Redis: each
	// sends the lease's whole count (not a difference), so that a call whose
	// reply was lost can be repeated, and the last call sent says what
	// Redis holds. It also orders a hand-on (see handOnLocked) with the
	// first waiter's calls: while a release holds op, the first waiter has
	// no call in flight (a release that needs no call of its own looks at
	// calling instead: see handOnAllLocked). Lock order: op before m.mu,
	// the engine's, which guards the fields below and the process's local
	// queue (see local.go: a Semaphore's waiters queue on the engine,
	// weighted); m.mu is never held across a call to Redis.
	op sync.Mutex

	// value is the lease's value; "" when the process has none in Redis.
	value string
	// lease is value's watchdog; nil when the process holds no permits
	// (value may still be set: a call whose reply was lost left it
	// uncertain, see dirty).
	lease *hold
	held  int64 // permits this process's goroutines hold on the lease
	// stale counts the permits of goroutines whose lease was lost: Release
	// gives them back here, without a round trip.
	stale int64
	// dirty: a call's reply was lost, so Redis may hold for value a count
	// other than held; the next call, or the reaper (see resend), sends
	// it again.
	dirty  bool
	fixing bool // a resend is queued in the reaper
	// seq numbers the calls that set the lease's count, so that one that
	// reaches Redis after a later one changes nothing (see
	// lua/sem_acquire.lua). Under op.
	seq int64
	// grants: a release may grant our waiters their permits in its own
	// script (see lua/sem_wake.lua): we can be told (a Hub), and no
	// WithSyncReplicas (a script cannot wait for replicas).
	grants bool
	// nonce names the waiting call of the first local waiter, under which
	// a release may grant it, while it waits; joined is when its first
	// attempt began, before any grant under nonce. fold is the nonce of a
	// grant taken in (counted in held), until a call folds it into the
	// lease's count in Redis. Under op.
	nonce  string
	joined time.Time
	fold   string
	// left is the nonce of a first waiter's call that gave up while
	// another waiter of ours was queued; owed: a waiter gave up while
	// another was queued, so the process's place in Redis may be left
	// behind if the last of them ends without a call (see leave). Under mu.
	left string
	owed bool
	// entry is what our waiter's entry in Redis says, as its last refused
	// attempt left it ("" when unknown). Under op.
	entry string
	// The process's waiting Acquire calls are in line for m, in order of
	// arrival, each weighing its permits: the first (the owner, m.first)
	// talks to Redis (see local.go).
	//
	// calling is the waiter whose attempt is in a call to Redis, or nil
	// (set and cleared under s.op and m.mu): a release hands nothing to it
	// without s.op (see handOnAllLocked).
	calling *localWaiter
	// placed: the process may have a place in the queue in Redis (a
	// waiter's call was sent, and no reply or leave has taken it off since).
	// Set under op and m.mu.
	placed bool
	// The hand-ons in a row are m.handoffs, bounded by WithLocalHandoffs
	// (m.cfg.handoffs), counted since the process last got permits from
	// Redis.
}

// A Semaphore's waiter is a localWaiter of its engine (see local.go) that
// weighs its permits. handed: it holds its permits without a call of its
// own: the first waiter's call took them too (see granted), or a release
// handed them on (see handOnLocked), while it had no call in flight. The
// first waiter looks at handed under m.mu before each call, adopt and
// leave. Its wake channel tells it that the waiter after it changed: its
// entry in Redis must say so, or a release's grants could pass the second
// over (see lua/sem_wake.lua); or that a release handed it its permits: a
// wake-up that is no grant, and makes it attempt.
func newSemWaiter(n int64, arrival int64) *localWaiter {
	return &localWaiter{n: n, arrival: arrival, turn: make(chan *hold, 1), wake: make(chan string, 1)}
}

// ErrSizeMismatch means the processes using a Semaphore's name disagree on
// its size: the holders and waiters in Redis use another size than this
// Semaphore's. Nothing was taken. A semaphore's size can change once no
// process holds or waits for its permits.
var ErrSizeMismatch = errors.New("netlock: semaphore size mismatch")

// NewSemaphore returns a Semaphore of size permits for the name on one
// Backend, with the options of New (WithFencing does not apply;
// WithLocalHandoffs bounds the hand-ons of permits in a row). It validates
// its input as New does and does not contact Redis. A Semaphore, a NetMutex
// and a NetRWMutex of one name are different locks.
func NewSemaphore(name string, size int64, backends []Backend, opts ...Option) (*Semaphore, error) {
	if size < 1 {
		return nil, fmt.Errorf("netlock: semaphore %q: size %d, want at least 1", name, size)
	}
	cfg, err := newCheckedConfig(name, backends, opts)
	if err != nil {
		return nil, err
	}
	if cfg.minHold > 0 {
		return nil, fmt.Errorf("netlock: semaphore %q: WithMinHold applies to a NetMutex and a NetRWMutex's write lock, not to a Semaphore's permits", name)
	}
	if len(backends) != 1 {
		return nil, fmt.Errorf("netlock: semaphore %q: %d backends; a Semaphore runs on one (a server, with its replicas, or a Cluster): a quorum of independent deployments cannot bound k > 1 holders without nearly every node answering (see Semaphore)", name, len(backends))
	}
	k := keyspace.Sem(cfg.prefix, name)
	lease := &semLease{
		keys:     []string{k.Leases, k.Permits, k.Queue, k.Places, k.Wants},
		expiryMS: strconv.FormatInt(cfg.expiry.Milliseconds(), 10),
		placeMS:  strconv.FormatInt(placeExpiries*cfg.expiry.Milliseconds(), 10),
	}
	m, err := newEngine(name, backends, cfg, spec{
		keys:     newKeys(cfg.prefix, name, cfg.fencing),
		noGrants: true,
		// where our waiter is told to look again, or granted
		waitChan: func(id string, _ bool) string { return k.Leases + ":wake:" + id },
		lease:    lease,
		rule:     lease,
	})
	if err != nil {
		return nil, err
	}
	lease.s = &Semaphore{m: m, kind: lease, size: size, keys: lease.keys, placeMS: lease.placeMS,
		grants: m.hubs[0] != nil && m.cfg.replicas == 0}
	return lease.s, nil
}

// semLease is the kind of a Semaphore's lease, the hold of its process's
// permits: the engine extends it (lua/sem_extend.lua), and the engine's
// waiter acquires it, running a semAcquirer; the Semaphore counts the
// permits on it and releases them by calls of its own. It is the engine's
// local rule for the Semaphore's waiters too (a localRule).
type semLease struct {
	s                 *Semaphore
	keys              []string // see lua/sem_acquire.lua
	expiryMS, placeMS string
}

func (*semLease) observed() Kind { return KindSemaphore }

func (l *semLease) extendCall(value string) (*Script, []string, []string) {
	return semExtendScript, l.keys, []string{value + ":" + l.expiryMS + ":" + l.placeMS}
}

func (*semLease) extended(*hold, []nodeReply) {}

// admitLocked is a Semaphore's local admission rule (weights within the
// size): it hands h, the lease, on to the waiters at the head of
// m's local line, the owner (m.first, waiting in Redis) first, in their
// order, each while n (the permits a release gives back) covers its whole
// weight, so that a heavier waiter at the head keeps the lighter ones
// behind it waiting, and while h may serve one more (mayHandOffLocked: the
// hand-ons in a row, since the process last got permits from Redis, within
// WithLocalHandoffs, and h well within its validity). It returns what is
// left of n, and how many it handed. The caller holds m.mu, and sees that
// the owner has no call in flight (its reply could grant it as well).
func (*semLease) admitLocked(m *engine, h *hold, n int64) (rest int64, handed int) {
	for h != nil && m.owned && m.first != nil && m.first.n <= n && m.mayHandOffLocked(h) {
		w := m.first
		m.handLocked(w, h)
		m.handoffs++
		n -= w.n
		handed++
	}
	return n, handed
}

// leftLocked: a waiter of ours behind the first (index i of the queue, 0
// right behind it; -1: it was the first) gave up. If none of ours is left
// in line, the process's place in Redis may be kept for it (see
// lua/sem_wake.lua, holdPlace): it leaves. Otherwise the last of ours
// leaves (owed), and the first's entry, if it named the waiter that left
// as its next, must name another (or none), or a grant would keep our
// process's place for it, keeping every later waiter out.
func (l *semLease) leftLocked(m *engine, _ *localWaiter, i int) func(context.Context) {
	s := l.s
	if !m.owned {
		return func(ctx context.Context) { s.leave(ctx, false, nil) }
	}
	s.owed = true
	if i == 0 && s.grants {
		s.pokeFirstLocked()
	}
	return nil
}

// unwanted gives back the permits the first waiter's call took for w, or a
// release handed on to it.
func (l *semLease) unwanted(ctx context.Context, _ *engine, w *localWaiter) {
	l.s.ReleaseCtx(ctx, w.n)
}

// fitsLocked returns how many waiters at the head of m's local line, the
// owner first, n permits cover in their order (as admitLocked would hand
// them on), and their weight. The caller holds m.mu.
func (*semLease) fitsLocked(m *engine, n int64) (k int, sum int64) {
	if !m.owned || m.first == nil || m.first.n > n {
		return 0, 0
	}
	k, sum = 1, m.first.n
	for _, w := range m.waiters {
		if sum+w.n > n {
			break
		}
		sum += w.n
		k++
	}
	return k, sum
}

// errZeroSemaphore is returned by a Semaphore not made by NewSemaphore.
var errZeroSemaphore = errors.New("netlock: Semaphore not created by NewSemaphore (the zero value is not usable)")

// Name returns the semaphore's name, as given to NewSemaphore.
func (s *Semaphore) Name() string {
	if s == nil || s.m == nil {
		return ""
	}
	return s.m.name
}

// Size returns the semaphore's size, as given to NewSemaphore.
func (s *Semaphore) Size() int64 {
	if s == nil {
		return 0
	}
	return s.size
}

func (s *Semaphore) check(n int64, what string) error {
	if s == nil || s.m == nil {
		return errZeroSemaphore
	}
	if n < 0 {
		return fmt.Errorf("netlock: semaphore %q: %s of %d permits, want 0 or more", s.m.name, what, n)
	}
	if n > s.size && what != "Release" {
		return fmt.Errorf("netlock: semaphore %q: %s of %d permits, more than its size %d: it could never be granted", s.m.name, what, n, s.size)
	}
	return nil
}

// Acquire acquires n permits, waiting until they are free and every waiter
// that came before has been served, or until ctx ends. On success it
// returns nil. If ctx ends first, it returns an error matching ctx's error
// and ErrNotObtained (or ErrQuorum if Redis did not answer the last
// attempt), leaving nothing held or queued. Unlike
// x/sync's, an Acquire of more than size permits fails at once, since no
// wait could grant it. Other errors: ErrSizeMismatch; an error matching
// ErrQuorum once Redis has not answered for the outage window
// (WithOutageWindow), or at once for an answer that retrying cannot change
// (a key of another type, a missing permission). Acquire(ctx, 0) returns
// nil at once.
func (s *Semaphore) Acquire(ctx context.Context, n int64) (err error) {
	if err := s.check(n, "Acquire"); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained(context.Cause(ctx))
	}
	if n == 0 {
		return nil
	}
	ctx, done := s.m.startAcquire(ctx, false)
	contended := false
	if done != nil {
		defer func() { done(err == nil, contended, false, err) }()
	}
	w := newSemWaiter(n, s.m.clk.Now().UnixMicro())
	if !s.enqueue(w) {
		contended = true
		// Our turn: first in line, to wait in Redis; or our permits, taken
		// by the first waiter's call or handed on by a release.
		h, err := s.m.awaitTurn(ctx, w)
		if err != nil {
			return notObtained(err)
		}
		if h != nil || s.handedOn(w) {
			return nil
		}
	}
	c, err := s.wait(ctx, w)
	contended = contended || c
	s.m.mu.Lock()
	s.m.unqueueLocked(w)
	owed := s.owed && !s.m.owned
	s.m.mu.Unlock()
	if owed {
		// A waiter of ours gave up while we were queued, without a
		// leave: our place may be kept for it.
		s.leave(ctx, true, nil)
	}
	return err
}

// enqueue puts w in the local line, and reports whether it is first.
func (s *Semaphore) enqueue(w *localWaiter) (first bool) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.queueLocked(w) {
		return true
	}
	if len(m.waiters) == 1 && s.grants {
		s.pokeFirstLocked()
	}
	return false
}

// pokeFirstLocked tells the first waiter that the waiter after it changed:
// its entry in Redis must say so. The caller holds m.mu.
func (s *Semaphore) pokeFirstLocked() {
	if w := s.m.first; w != nil {
		select {
		case w.wake <- "":
		default:
		}
	}
}

// TryAcquire acquires n permits without waiting and reports whether it
// did: false when they are not free or a waiter (of any process) came
// first, as x/sync's. It panics with the error if Redis could not be asked
// or n is out of range; TryAcquireCtx returns it.
func (s *Semaphore) TryAcquire(n int64) bool {
	ok, err := s.TryAcquireCtx(context.Background(), n)
	if err != nil {
		panic(err)
	}
	return ok
}

// TryAcquireCtx acquires n permits without waiting. It returns (false, nil)
// when they are not free or a waiter came first, and (false, err) when
// Redis could not be asked (or ErrSizeMismatch, or n is out of range).
func (s *Semaphore) TryAcquireCtx(ctx context.Context, n int64) (ok bool, err error) {
	if err := s.check(n, "TryAcquire"); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained(context.Cause(ctx))
	}
	if n == 0 {
		return true, nil
	}
	ctx, done := s.m.startAcquire(ctx, true)
	if done != nil {
		defer func() { done(ok, !ok && err == nil, false, err) }()
	}
	s.m.mu.Lock()
	waiting := s.m.owned
	s.m.mu.Unlock()
	if waiting {
		return false, nil
	}
	for {
		r := s.attempt(ctx, &localWaiter{n: n}, true)
		switch r.kind {
		case semGranted:
			return true, nil
		case semRefused:
			return false, nil
		case semRetry:
			continue // our lease was found lost: with a new one
		}
		return false, r.err
	}
}

// wait is Acquire for w, the first of the local queue: the engine's waiter
// runs a semAcquirer for it, which attempts, and while refused keeps w's
// place in Redis; the waiter waits to be told to look again (or for the
// first lease to end, or, without pub/sub, a retry delay), and rides out
// outages. It reports whether it was refused at least once.
func (s *Semaphore) wait(ctx context.Context, w *localWaiter) (contended bool, err error) {
	m := s.m
	ew := waiter{m: m, a: &semAcquirer{s: s, w: w}, wait: true, wake: w.wake,
		delay: backoff{min: m.cfg.minRetryDelay, max: m.cfg.maxRetryDelay}}
	ok, err := ew.run(ctx)
	if ew.done(ctx, ok) {
		ok = true // a release handed w its permits as it gave up
	}
	if ok {
		err = s.holding(ctx, w)
	}
	return ew.busy, err
}

// handedOn reports whether a release handed w its permits (see
// handOnLocked).
func (s *Semaphore) handedOn(w *localWaiter) bool {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return w.handed
}

// holding ends a wait whose permits were granted: a caller whose ctx has
// ended never holds.
func (s *Semaphore) holding(ctx context.Context, w *localWaiter) error {
	if ctx.Err() != nil {
		s.ReleaseCtx(context.WithoutCancel(ctx), w.n)
		return notObtained(context.Cause(ctx))
	}
	return nil
}

// semAcquirer is the acquirer of a Semaphore's first local waiter w (see
// waiter): its rounds are attempts (see attempt), which count the permits
// granted on the lease themselves; a grant by message is adopted; its
// leave is the process's (see leave).
type semAcquirer struct {
	s *Semaphore
	w *localWaiter
}

// flags: a waiting call always asks for a place (lua/sem_acquire.lua's
// flags are the call's own: see prepare).
func (*semAcquirer) flags(bool, bool, bool) string { return "j" }

func (*semAcquirer) ordered() bool { return false }

// round attempts until an attempt grants w's permits, refuses them, or
// fails; a lease found lost, or a late call, is attempted again at once.
// A release that handed w its permits meanwhile is a grant too.
func (a *semAcquirer) round(ctx context.Context, _ ask) outcome {
	for {
		if a.s.handedOn(a.w) {
			// Known without waiting for s.op, which another waiter's
			// call may hold.
			return outcome{kind: acquired}
		}
		r := a.s.attempt(ctx, a.w, false)
		switch r.kind {
		case semGranted:
			return outcome{kind: acquired}
		case semRetry:
			continue
		case semRefused:
			return outcome{kind: busy, ttl: r.look, start: r.start, took: r.took}
		}
		if cause := ctxEnded(ctx); cause != nil {
			return outcome{kind: ended, err: cause, down: r.err}
		}
		if r.permanent {
			return outcome{kind: failed, err: r.err}
		}
		return outcome{kind: down, err: r.err}
	}
}

// messageGrant reads a grant "g:<nonce>:<value>" (see lua/sem_wake.lua).
func (a *semAcquirer) messageGrant(_ context.Context, _ *waiter, payload string) (grant, bool) {
	rest, ok := strings.CutPrefix(payload, "g:")
	if !ok {
		return grant{}, false
	}
	nonce, value, _ := strings.Cut(rest, ":")
	if nonce == "" || value == "" {
		return grant{}, false
	}
	return grant{value: value, nonce: nonce, start: a.s.m.clk.Now()}, true
}

// take: a round's grant is counted on the lease already (see granted); a
// grant by message is adopted, if the client can keep it.
func (a *semAcquirer) take(ctx context.Context, w *waiter, g grant, _ []bool) (bool, error) {
	if g.nonce == "" {
		return true, nil
	}
	if err := w.keeps(ctx, g); err != nil {
		return false, err
	}
	return a.s.adopt(a.w, g.nonce, g.value), nil
}

func (a *semAcquirer) leave(ctx context.Context, _ string, _ []bool) bool {
	return a.s.leave(ctx, false, a.w)
}

// leaveCall leaves the process's place, with the grant made under the
// nonce of its waiting call, if any.
func (a *semAcquirer) leaveCall(string) (*Script, []string, []string) {
	s := a.s
	s.m.mu.Lock()
	value, nonce := s.value, s.nonce
	s.m.mu.Unlock()
	return s.leaveCall(value, nonce)
}

// passOnCall leaves the process's place with g, which a release granted
// it under g's nonce: the next waiters that fit are granted instead.
func (a *semAcquirer) passOnCall(g grant) (*Script, []string, []string) {
	return a.s.leaveCall(g.value, g.nonce)
}

// leave takes our waiter off the queue in Redis, and takes back a grant
// made to its call that it did not take in, under a context detached from
// ctx's cancellation. Best effort: a place left behind expires, and a grant
// left behind is dropped by the process's next call (see
// lua/sem_acquire.lua).
//
// owed: only the leave owed after waiters gave up while another was queued
// (see Semaphore.owed), if no waiter of ours is queued now (one that is
// takes the place over). w: the first waiter, whose wait ends; it is taken
// off the local queue here, unless a release handed it its permits
// meanwhile (see handOnLocked): then nothing is left (the release saw to
// the place), and leave reports handed: w holds.
func (s *Semaphore) leave(ctx context.Context, owed bool, w *localWaiter) (handed bool) {
	m := s.m
	s.op.Lock()
	defer s.op.Unlock()
	m.mu.Lock()
	if w != nil {
		if w.handed {
			m.mu.Unlock()
			return true
		}
		// Out of line under the m.mu of the look at handed: no release
		// hands w anything from here on (a waiter that gave up never
		// holds, and no permits are handed to nobody).
		m.unqueueLocked(w)
	}
	if owed && (!s.owed || m.owned) {
		m.mu.Unlock()
		return false
	}
	if m.owned {
		// Another waiter of ours is first now: it keeps the place (its
		// attempt drops the grant, if any). If it gives up too, the last
		// of ours leaves, with our nonce.
		if s.nonce != "" {
			s.left = s.nonce
		}
		s.nonce, s.owed = "", true
		m.mu.Unlock()
		return false
	}
	m.mu.Unlock()
	s.leaveLocked(ctx)
	return false
}

// leaveLocked takes the process's place in Redis off the queue, with the
// grant made under the nonce of its last waiting call, if any (see leave).
// The caller holds s.op, not m.mu.
func (s *Semaphore) leaveLocked(ctx context.Context) {
	m := s.m
	s.m.mu.Lock()
	value, nonce := s.value, s.nonce
	if nonce == "" {
		nonce = s.left
	}
	s.nonce, s.entry, s.left, s.owed, s.placed = "", "", "", false, false
	s.m.mu.Unlock()
	if nonce == "" {
		value = ""
	}
	sc, keys, args := s.leaveCall(value, nonce)
	m.fanout(context.WithoutCancel(ctx), sc, keys, args, nil)
}

// keysOf returns the keys of a call for the lease value: the semaphore's,
// and value's tombstone (see lua/sem_acquire.lua); the semaphore's alone
// for none ("").
func (s *Semaphore) keysOf(value string) []string {
	if value == "" {
		return s.keys
	}
	return append(s.keys[:len(s.keys):len(s.keys)], keyspace.Tomb(s.keys[0], value))
}

// leaveCall returns lua/sem_leave.lua's call for the process's place, with
// the grant made to its lease value under nonce ("" and "": none).
func (s *Semaphore) leaveCall(value, nonce string) (*Script, []string, []string) {
	return semLeaveScript, s.keysOf(value), []string{s.m.waiterID + ":" + value + ":" + nonce + ":" + s.m.expiryMS + ":" + s.m.tombMS}
}

// adopt takes in the permits a release granted w, by its message, under
// nonce on the lease value, and reports whether it did. The grant was made after
// w's first attempt under the nonce began (s.joined), so a new lease is
// valid from then. It is not taken in (the next attempt finds it in Redis,
// under the nonce, and takes it with a deadline of its own) when the
// process's lease is no longer the one the grant went to, when Redis may
// hold a count we do not know (dirty), or when a new lease would leave
// less than an extend interval.
func (s *Semaphore) adopt(w *localWaiter, nonce, value string) bool {
	m := s.m
	s.op.Lock()
	defer s.op.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if w.handed {
		return true // handed its permits by a release (see handOnLocked): the grant is nobody's
	}
	s.entry = "" // a grant changed our entry (see lua/sem_wake.lua, holdPlace)
	s.retireLostLocked()
	if nonce == "" || nonce != s.nonce || value != s.value || s.dirty || s.fold != "" {
		return false
	}
	if s.lease == nil {
		until := s.joined.Add(m.cfg.expiry - m.driftTerm)
		if m.clk.Until(until) < m.cfg.expiry/extendsPerExpiry {
			return false
		}
		s.lease = newHold(m, grant{value: value, start: s.joined, until: until})
	}
	s.held += w.n
	s.fold, s.nonce = nonce, ""
	m.handoffs = 0 // permits from Redis: the hand-ons start again
	m.unqueueLocked(w)
	return true
}

// What one attempt came to.
type semResult struct {
	kind      semVerdict
	look      time.Duration // semRefused: when to look again at the latest
	start     time.Time     // semRefused: when the attempt began
	took      time.Duration // semRefused: how long it took; look counts from its end
	err       error         // semFailed
	permanent bool          // semFailed: retrying cannot change the answer
}

type semVerdict int

const (
	semGranted semVerdict = iota
	semRefused
	semRetry  // our lease was found lost; attempt again, for a new lease
	semFailed // no answer, or an error
)

// maxBatch bounds the waiters of a process one call asks for (see
// lua/sem_acquire.lua).
const maxBatch = 8

// attempt asks Redis once for w's permits on the process's lease (a new
// lease if it holds none), and for those of the waiters after w in the
// local queue, which get in with it when they fit and came before every
// other process's waiter. w is the first of the local queue, or, for
// TryAcquire (try), a waiter of its own, not queued and without a place.
func (s *Semaphore) attempt(ctx context.Context, w *localWaiter, try bool) semResult {
	s.op.Lock()
	defer s.op.Unlock()
	c, ok := s.prepare(w, try)
	if !ok {
		return semResult{kind: semRefused}
	}
	if c.handed {
		return semResult{kind: semGranted} // by a release, while w was not in a call
	}
	callCtx := ctx
	if !try {
		// A waiter's call is not cut short by its ctx (the node timeout
		// bounds it): one cut short may still reach Redis after the leave
		// that follows it and queue a place nobody keeps. wait looks at
		// ctx once it returns.
		callCtx = context.WithoutCancel(ctx)
	}
	measured := s.m.clk.Measure()
	start := s.m.clk.Now()
	r := s.m.fanout(callCtx, semAcquireScript, s.keysOf(c.value), []string{c.arg(s)}, nil)[0]
	took := s.m.clk.Since(start)
	measured()
	if r.err != nil {
		return s.callFailed(ctx, c.value, r)
	}
	s.m.mu.Lock()
	s.calling = nil
	s.dirty = false // the count Redis holds is one we sent
	if r.vals[0] != semAcquireSize && s.fold == c.fold {
		s.fold = "" // folded (or gone with the lease)
	}
	switch r.vals[0] {
	case semAcquireGranted:
		return s.granted(ctx, c, r.vals[1], start, start.Add(s.m.cfg.expiry-took-s.m.driftTerm))
	case semAcquireGone:
		// Our lease expired in Redis: its permits are gone.
		lease := s.lease
		s.m.mu.Unlock()
		if lease != nil {
			lease.lose()
			s.m.mu.Lock()
			s.retireLostLocked()
			s.m.mu.Unlock()
		}
		return semResult{kind: semRetry}
	case semAcquireSize:
		s.m.mu.Unlock()
		return semResult{kind: semFailed, permanent: true, err: &wrapError{
			msg: fmt.Sprintf("netlock: semaphore %q: size %d here, but its holders and waiters in Redis use %d", s.m.name, s.size, r.vals[1]),
			err: ErrSizeMismatch}}
	case semAcquireLate: // a later call was applied: not this one's reply
		s.m.mu.Unlock()
		return semResult{kind: semRetry}
	}
	s.entry = c.entry // written, or unchanged
	s.m.mu.Unlock()
	look := time.Duration(r.vals[2]) * time.Millisecond
	if look <= 0 || look > s.m.cfg.expiry {
		look = s.m.cfg.expiry
	}
	return semResult{kind: semRefused, look: look, start: start, took: took}
}

// A semCall is one call of lua/sem_acquire.lua, as attempt makes it.
type semCall struct {
	value string // the lease's
	grow  bool   // the lease is held: the call adds to it
	base  int64  // the permits the lease holds before the call
	seq   int64
	// fold, nonce: see Semaphore.
	fold, nonce string
	try         bool           // TryAcquire: no member, no place
	batch       []*localWaiter // w, then the local waiters after it that the call asks for
	entry       string         // what the waiter's entry says after the call (see Semaphore.entry)
	flags       string
	handed      bool // no call: a release handed w its permits (see handOnLocked)
}

// prepare makes the call attempt sends for w, and marks w as in a call
// (see Semaphore.calling), unless a release handed w its permits (handed).
// It reports false when a TryAcquire (try) must not be made: a waiter of ours came meanwhile
// (TryAcquire fails while one waits), whose nonce the call would carry, so
// that it could take the permits a release set aside for it. The caller
// holds s.op.
func (s *Semaphore) prepare(w *localWaiter, try bool) (semCall, bool) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if w.handed {
		return semCall{handed: true}, true
	}
	if try && s.nonce != "" {
		return semCall{}, false
	}
	s.calling = w
	s.retireLostLocked()
	if s.value == "" {
		// 128 random bits, and the holder (the lease is a member of a
		// sorted set, with nothing beside it).
		s.value = rand.Text() + keyspace.LeaseSuffix(s.m.holder)
	}
	s.seq++
	if !try && s.grants && s.nonce == "" {
		s.nonce, s.joined = rand.Text(), s.m.clk.Now()
	}
	s.placed = s.placed || !try
	c := semCall{value: s.value, grow: s.lease != nil, base: s.held, seq: s.seq, fold: s.fold, nonce: s.nonce, try: try}
	c.batch = []*localWaiter{w}
	if !try {
		// w is the first, m.first: the waiters after it are m's queue.
		for _, q := range s.m.waiters {
			if len(c.batch) == maxBatch {
				break
			}
			if q != w {
				c.batch = append(c.batch, q)
			}
		}
	}
	if c.grow {
		c.flags = "g"
	}
	if !try {
		// The waiter's entry in Redis is written when it changed (see
		// lua/sem_acquire.lua); entry is what it says.
		next := int64(0)
		if len(c.batch) > 1 {
			next = c.batch[1].arrival
		}
		c.entry = fmt.Sprint(w.n, c.value, c.nonce, c.grow, next, w.arrival)
		if c.entry != s.entry {
			c.flags += "w"
		}
	}
	return c, true
}

// arg returns the call's argument to lua/sem_acquire.lua.
func (c *semCall) arg(s *Semaphore) string {
	m := s.m
	member := m.waiterID
	if c.try {
		member = ""
	}
	var b strings.Builder
	b.WriteString(c.value + ":" + strconv.FormatInt(c.base, 10) + ":" + strconv.FormatInt(c.seq, 10) + ":" + strconv.FormatInt(s.size, 10) + ":" +
		m.expiryMS + ":" + member + ":" + c.flags + ":" + s.placeMS + ":" + m.tombMS + ":" + c.fold + ":" + c.nonce + ":")
	for i, q := range c.batch {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(q.n, 10) + "@" + strconv.FormatInt(q.arrival, 10))
	}
	return b.String()
}

// callFailed is what a call of the lease value that got no answer (r)
// comes to. The caller holds s.op.
func (s *Semaphore) callFailed(ctx context.Context, value string, r nodeReply) semResult {
	s.m.mu.Lock()
	s.calling = nil
	s.entry = ""
	s.m.mu.Unlock()
	switch {
	case errors.Is(r.err, ErrNotReplicated):
		// Granted on the node, not on enough of its replicas: undone
		// at once (a new lease ended, a grown one back to its count).
		s.m.mu.Lock()
		lease, total := s.lease, s.held
		s.m.mu.Unlock()
		s.send(ctx, value, total, lease)
	case !r.unsent && !r.over():
		s.m.mu.Lock()
		s.dirty = true // it may have been granted
		s.fixLaterLocked()
		s.m.mu.Unlock()
	}
	return semResult{kind: semFailed, err: &quorumError{nodes: 1, need: 1, errs: []error{r.err}}, permanent: r.permanent}
}

// granted takes in a call's grant of the permits of the first k waiters of
// its batch, on the lease, whose local deadline is now until (the call
// began at start). The caller holds s.op and m.mu; granted returns without
// m.mu.
func (s *Semaphore) granted(ctx context.Context, c semCall, k int64, start, until time.Time) semResult {
	batch := c.batch[:min(int(k), len(c.batch))]
	var sum int64
	for _, q := range batch {
		sum += q.n
	}
	lease := s.lease
	switch {
	case lease == nil:
		lease = newHold(s.m, grant{value: c.value, start: start, until: until})
		s.lease = lease
	case !lease.moveUntil(until):
		// Lost here as the grant came back: the lease's permits, the new
		// ones too, are given up (the lease is no longer extended).
		s.retireLostLocked()
		s.m.mu.Unlock()
		return semResult{kind: semRetry}
	}
	// The waiters after the first that the call took in: theirs, unless
	// they gave up meanwhile; what they asked for is then given back.
	var surplus int64
	for _, q := range batch[1:] {
		if s.m.inLineLocked(q) {
			s.m.handLocked(q, lease)
		} else {
			surplus += q.n
		}
	}
	s.held += sum - surplus
	s.m.handoffs = 0 // permits from Redis: the hand-ons start again
	if !c.try {
		s.nonce, s.entry = "", "" // the first waiter's call is over
		s.m.unqueueLocked(c.batch[0])
		if len(batch) == len(c.batch) {
			// Our place is off the queue, and a grant under a nonce left
			// behind was dropped (see lua/sem_acquire.lua, holdPlace).
			s.placed, s.owed, s.left = false, false, ""
		}
	}
	total := s.held
	s.m.mu.Unlock()
	if surplus > 0 {
		s.send(ctx, c.value, total, lease)
	}
	return semResult{kind: semGranted}
}

// Reply statuses of lua/sem_acquire.lua, read by attempt.
const (
	semAcquireGranted = 1  // granted to the first k of the batch
	semAcquireRefused = -1 // not now
	semAcquireLate    = -2 // a later call of the process was applied
	semAcquireGone    = -3 // our lease is gone: it was lost
	semAcquireSize    = -4 // the holders and waiters use another size
)

// Reply statuses of lua/sem_release.lua, read by send.
const (
	semReleaseDone = 1  // released
	semReleaseGone = 0  // the lease is gone: it expired
	semReleaseLate = -2 // a later call of the process was applied
)

// retireLostLocked retires the lease if it was lost: its permits become
// stale (given back by Release without a round trip), and the next acquire
// takes a new lease. The caller holds m.mu.
func (s *Semaphore) retireLostLocked() {
	if s.lease == nil {
		return
	}
	if _, held := s.lease.deadline(); held {
		return
	}
	// A lost hold's watchdog is stopped already (see hold.expire, lose).
	s.stale += s.held
	s.held, s.lease, s.value, s.dirty, s.fold = 0, nil, "", false, ""
}

// Release releases n permits, as x/sync's: it panics if n is more than this
// process holds. Whatever Redis does, it returns with the permits given
// back in this process; a count Redis could not be told is sent again in
// the background (see ReleaseCtx).
func (s *Semaphore) Release(n int64) {
	err := s.ReleaseCtx(context.Background(), n)
	switch {
	case errors.Is(err, ErrNotHeld), errors.Is(err, errZeroSemaphore):
		panic(err)
	case err != nil && !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrQuorum):
		panic(err) // n < 0
	}
}

// ReleaseCtx releases n permits of this process. Permits are not tied to
// the goroutine that acquired them (x/sync's rule): any n of the process's
// are given back. It returns an error matching ErrNotHeld if the process
// holds fewer than n; ErrLockLost if permits given back were on a lease that
// was lost (given back here, without a round trip); an error matching
// ErrQuorum if Redis could not be told: the count is then sent again in the
// background until Redis answers or the lease ends (an extend of the lease
// sends nothing but its deadline, so permits not given back stay out until
// then). The permits are given back in this process whatever it returns.
// Permits that goroutines of this process wait for are handed on to them
// without a round trip, as the Semaphore's documentation says.
func (s *Semaphore) ReleaseCtx(ctx context.Context, n int64) error {
	if err := s.check(n, "Release"); err != nil {
		return err
	}
	s.m.mu.Lock()
	handed := n > 0 && s.handOnAllLocked(n)
	s.m.mu.Unlock()
	if handed {
		return nil
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.m.mu.Lock()
	s.retireLostLocked()
	if n > s.held+s.stale {
		held := s.held + s.stale
		s.m.mu.Unlock()
		return &wrapError{msg: fmt.Sprintf("netlock: semaphore %q: released %d permits, more than the %d held", s.m.name, n, held), err: ErrNotHeld}
	}
	if n == 0 {
		s.m.mu.Unlock()
		return nil
	}
	fromStale := min(n, s.stale)
	s.stale -= fromStale
	n -= fromStale
	if n == 0 {
		s.m.mu.Unlock()
		return ErrLockLost
	}
	n, leave := s.handOnLocked(n)
	var err error
	if n > 0 {
		err = s.giveBackLocked(ctx, n) // unlocks m.mu
	} else {
		s.m.mu.Unlock()
	}
	if leave {
		s.leaveLocked(ctx)
	}
	if fromStale > 0 && err == nil {
		err = ErrLockLost
	}
	return err
}

// giveBackLocked gives n permits of the lease back in Redis (the last ends
// it). The caller holds s.op and m.mu; giveBackLocked returns without m.mu.
func (s *Semaphore) giveBackLocked(ctx context.Context, n int64) error {
	s.held -= n
	value, total, lease := s.value, s.held, s.lease
	if total == 0 {
		s.lease = nil
	}
	s.m.mu.Unlock()
	if total == 0 && lease.end() {
		// Lost just now: its permits came back in Redis as it expired.
		s.m.mu.Lock()
		if s.value == value {
			s.value, s.dirty = "", false
		}
		s.m.mu.Unlock()
		return ErrLockLost
	}
	return s.send(ctx, value, total, lease)
}

// handOnLocked hands n permits a release gives back on to this process's
// first waiters, by its kind's local rule (semLease.admitLocked): in
// their order, each while they cover its whole request (a later, smaller
// waiter never passes an earlier one) and the lease may serve it (the
// hand-ons in a row within WithLocalHandoffs, the lease well within its
// validity): they stay on the lease, counted in held, without a round trip. It returns the permits left to give back in Redis,
// and whether the process's place in Redis must be left: the last of its
// waiters got in by hand-on, so nobody of ours takes the place over. The
// caller holds m.mu, and s.op (so that the first waiter has no call in
// flight), or has seen that the first waiter has none (handOnAllLocked).
func (s *Semaphore) handOnLocked(n int64) (rest int64, leave bool) {
	n, handed := s.kind.admitLocked(s.m, s.lease, n)
	if handed > 0 {
		// The first waiter's call is over, as when it gives up (see
		// leave): a grant made under its nonce is nobody's (adopt refuses
		// it, and the next call or leave drops it in Redis); the next
		// waiter of ours, if any, takes the place over with its call.
		if s.nonce != "" {
			s.left = s.nonce
		}
		s.nonce, s.entry = "", ""
	}
	if handed == 0 || s.m.owned {
		// The next waiter, first now, takes the place over: it makes a
		// call before it waits, or is handed on to, or leaves as it gives
		// up (see semLease.leftLocked).
		return n, false
	}
	return n, s.placed || s.owed || s.left != ""
}

// handOnAllLocked hands all n permits on, as handOnLocked does, when that
// takes no call to Redis: they cover the requests of the first waiters
// exactly, none of which is in a call (only the first can be: see
// Semaphore.calling), and the process's place needs no leave. It reports
// whether it did. Without s.op: the permits stay on the lease, so the count
// that calls under s.op send does not change, and a waiter looks at
// handed under m.mu before each call, adopt and leave. The caller holds
// m.mu.
func (s *Semaphore) handOnAllLocked(n int64) bool {
	m := s.m
	s.retireLostLocked()
	if s.stale > 0 || n > s.held || !m.owned || m.first == s.calling || s.lease == nil {
		return false
	}
	k, sum := s.kind.fitsLocked(m, n)
	if sum != n || k == 0 || m.handoffs+k > m.cfg.handoffs || !m.mayHandOffLocked(s.lease) ||
		(k == 1+len(m.waiters) && (s.placed || s.owed || s.left != "")) {
		return false
	}
	s.handOnLocked(n)
	return true
}

// send tells Redis that the lease value holds total permits now (0 ends
// it). The caller holds s.op. lease is value's hold (ended when total is 0).
func (s *Semaphore) send(ctx context.Context, value string, total int64, lease *hold) error {
	m := s.m
	s.m.mu.Lock()
	s.seq++
	seq, fold, nonce := s.seq, s.fold, s.nonce
	s.m.mu.Unlock()
	arg := value + ":" + strconv.FormatInt(total, 10) + ":" + strconv.FormatInt(seq, 10) + ":" + fold + ":" + nonce + ":" + m.expiryMS + ":" + m.tombMS
	r := m.fanout(context.WithoutCancel(ctx), semReleaseScript, s.keysOf(value), []string{arg}, nil)[0]
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if r.err != nil {
		// Sent again in the background, unless nothing could take it: a
		// closed client, a server gone, an error reply that sending again
		// cannot change (a count the lease keeps expires with it).
		if s.value == value && !r.unsent {
			if r.over() {
				s.dirty = false // nothing will take it: resend stops
			} else {
				s.dirty = true
				s.fixLaterLocked()
			}
		}
		return &quorumError{nodes: 1, need: 1, errs: []error{r.err}}
	}
	if s.value == value {
		s.dirty = false
		if s.fold == fold {
			s.fold = "" // folded (or gone with the lease)
		}
		if total == 0 {
			s.value = ""
		}
	}
	if r.vals[0] == semReleaseGone {
		// Gone: the lease expired in Redis. (semReleaseLate: a later call
		// was applied, this one's reply is not news.)
		if total > 0 {
			s.m.mu.Unlock()
			lease.lose()
			s.m.mu.Lock()
			s.retireLostLocked()
		}
		return ErrLockLost
	}
	return nil
}

// fixLaterLocked queues a resend of the lease's count in the reaper,
// unless one is queued. The caller holds m.mu.
func (s *Semaphore) fixLaterLocked() {
	if !s.fixing {
		s.fixing = true
		s.m.reapAgain(&semResend{s: s, giveUp: s.m.clk.Now().Add(tombstoneExpiries * s.m.cfg.expiry)})
	}
}

// A semResend is the reaper's redelivery of a Semaphore lease's count
// while a call's reply was lost (see resend).
type semResend struct {
	s      *Semaphore
	giveUp time.Time
}

func (r *semResend) deliver(*engine) bool { return r.s.resend(r.giveUp) }

// resend sends the lease's count again if a call's reply was lost
// (dirty), and reports whether it is over: Redis answered (and no reply
// was lost since), the lease ended, an error said it never will (a closed
// client), or giveUp, ten expiries after the loss, has passed (a lease
// held all that time whose count Redis could not be told keeps a few
// permits too many out until it ends).
func (s *Semaphore) resend(giveUp time.Time) bool {
	s.op.Lock()
	defer s.op.Unlock()
	s.m.mu.Lock()
	s.retireLostLocked()
	if !s.dirty || s.value == "" || s.m.clk.Now().After(giveUp) {
		s.dirty, s.fixing = false, false
		s.m.mu.Unlock()
		return true
	}
	value, total, lease := s.value, s.held, s.lease
	s.m.mu.Unlock()
	if lease == nil {
		total = 0
	}
	s.send(context.Background(), value, total, lease)
	return false
}

// Lost returns a channel closed when this process's lease ends without its
// say: its local deadline passed without a successful extend, or Redis no
// longer had it. Every permit of the process is then gone at once: the
// goroutines holding them should stop. Call it after Acquire; it is also
// closed when the process gives back its last permit, and a closed channel
// when the process holds none.
func (s *Semaphore) Lost() <-chan struct{} {
	if s == nil || s.m == nil {
		return closedChan
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.lease == nil {
		return closedChan
	}
	return s.lease.lostChan()
}

// Held returns the permits this process holds, on its lease (those of a lost
// lease not counted).
func (s *Semaphore) Held() int64 {
	if s == nil || s.m == nil {
		return 0
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.retireLostLocked()
	return s.held
}

// SemaphoreInfo is what Semaphore.Inspect found in Redis.
type SemaphoreInfo struct {
	// Size is the size the semaphore's holders and waiters use, 0 when
	// nothing is held and nobody waits (the next to come sets it).
	Size int64
	// Out is the permits out, across every process: those the live leases
	// hold, and those a release set aside for waiters that are taking
	// them in.
	Out int64
	// Leases is the number of processes holding permits (live leases).
	Leases int
	// Waiters is the number of processes with a waiter in the queue.
	Waiters int
	// Holders are the live leases' holders (WithHolderInfo of each
	// process holding permits), in the order of their deadlines; "" for a
	// lease taken without one.
	Holders []string
}

// Inspect reads the semaphore's state in Redis, across every process using
// its name, in one read-only script bounded by the node timeout and ctx: it
// writes nothing and takes no place in the queue. Leases whose deadlines
// passed and waiters whose places were not renewed are not counted. Its
// errors match ErrQuorum and name the node, as Acquire's do.
func (s *Semaphore) Inspect(ctx context.Context) (SemaphoreInfo, error) {
	if s == nil || s.m == nil {
		return SemaphoreInfo{}, errZeroSemaphore
	}
	r := s.m.fanout(ctx, semInspectScript, s.keys, nil, nil)[0]
	var info SemaphoreInfo
	if r.err == nil {
		var ok bool
		if info, ok = readSemInspect(r.vals); !ok {
			r.err = nodeError(0, fmt.Errorf("sem_inspect script: unexpected reply %v", r.vals))
		}
	}
	if r.err != nil {
		return SemaphoreInfo{}, &quorumError{nodes: 1, need: 1, errs: []error{r.err}}
	}
	return info, nil
}

// readSemInspect reads lua/sem_inspect.lua's reply: four counts, then each
// live lease's holder, packed.
func readSemInspect(vals []int64) (SemaphoreInfo, bool) {
	if len(vals) < 4 {
		return SemaphoreInfo{}, false
	}
	info := SemaphoreInfo{Size: vals[0], Out: vals[1], Leases: int(vals[2]), Waiters: int(vals[3])}
	rest := vals[4:]
	for range info.Leases {
		if len(rest) == 0 {
			return SemaphoreInfo{}, false
		}
		n := rest[0]
		words := (n + 5) / 6
		if n < 0 || int64(len(rest)-1) < words {
			return SemaphoreInfo{}, false
		}
		h, ok := replyString(n, rest[1:1+words])
		if !ok {
			return SemaphoreInfo{}, false
		}
		info.Holders = append(info.Holders, keyspace.HolderDecode(h))
		rest = rest[1+words:]
	}
	return info, len(rest) == 0
}
