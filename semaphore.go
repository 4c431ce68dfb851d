package netlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

	// grants: a release may grant our waiters their permits in its own
	// script (see lua/sem_wake.lua): we can be told (a Hub), and no
	// WithSyncReplicas (a script cannot wait for replicas).
	grants   bool
	semCount // the lease and its count, guarded by m.mu
	semPlace // the first waiter's call and the process's place in Redis
	// The hand-ons in a row are m.handoffs, bounded by WithLocalHandoffs
	// (m.cfg.handoffs), counted since the process last got permits from
	// Redis.
}

// A semCount is the lease of a Semaphore's process in Redis and the count
// of its permits, guarded by the engine's mu (calls that change it are
// ordered by the Semaphore's op).
type semCount struct {
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
}

// A semPlace is what a Semaphore's process knows of its waiting call in
// Redis and of its place in the queue there.
type semPlace struct {
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
