package netlock

import (
	"context"
	"strings"
)

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
