package netlock

import (
	"context"
	"slices"
)

// The in-process side of a NetMutex: goroutines sharing one NetMutex queue
// in order of arrival, and only the one that owns m talks to Redis.
//
// A waiter may be shared (a NetRWMutex's reader under the process's write
// lock): the shared waiters next to each other at the head of the queue get
// the hold together, as sync.RWMutex lets in together the readers waiting
// when a writer leaves, and the last of them to unlock passes it on. The
// owner is then the group: m.shared counts its goroutines.

// A Semaphore's goroutines queue here too, weighted: a waiter weighs the
// permits it asks for. The owner is then its first waiter, which talks to
// Redis for the process's waiters (its calls ask for those behind it too),
// and keeps its place in line while it waits (m.first): a release hands
// permits on to the waiters at the head of the line, the owner first, as
// far as they go (handLocked, by its kind's rule: see semLease.admitLocked).
//
// Each kind's local admission rule (a localRule, m.opt.rule) says whom of the
// line a hold the process has serves as well, without a round trip: a
// NetMutex's, one owner (exclusiveRule); a NetRWMutex's readers
// under the write lock, sync.RWMutex's (rwRule); a Semaphore's, weights
// within the permits given back (semLease.admitLocked). Each is bounded by
// mayHandOffLocked, so that other processes get their turn.

// A localWaiter is a goroutine queued for m. It is sent either a hold (a
// hand-off: it now holds m) or nil (it now owns m and must acquire in Redis).
type localWaiter struct {
	turn   chan *hold // capacity 1: the sender never blocks
	shared bool       // it shares the hold with the shared waiters next to it
	// n is its weight: the permits a Semaphore's waiter asks for (see
	// semLease.admitLocked); 1 for the others.
	n int64
	// arrival (µs, the client's clock) is a Semaphore's waiter's place among
	// every process's waiters.
	arrival int64
	// handed: a hold was handed to it (handOffLocked, admitSharedLocked,
	// handLocked): it holds without a call of its own, and is out of line.
	// Under m.mu.
	handed bool
	// wake is the wake channel of its waiter in Redis (see waiter.wake)
	// while it owns m: a wake-up that is no grant makes it look again, at
	// handed and at the waiters behind it.
	wake chan string
}

// A localRule is a kind's local admission rule: whom of m's
// line a hold of the process serves without a round trip, and what a
// waiter that gives its place up leaves to do. The engine keeps the line
// (this file); a kind's rule, in the kind's file, says who gets in:
// exclusiveRule (mutex.go), rwRule (rwmutex.go), semLease (semaphore.go).
type localRule interface {
	// admitLocked hands h on to the waiters at the head of m's line that
	// the rule lets in, within the hand-off budget (mayHandOffLocked),
	// out of n given back (a Semaphore's permits; 1 for a lock's hold). It
	// returns what is left of n, and how many waiters it handed h to. The
	// caller holds m.mu and owns m (a Semaphore's: see
	// semLease.admitLocked).
	admitLocked(m *engine, h *hold, n int64) (rest int64, handed int)
	// leftLocked is told that w gave its place up: unqueueLocked took it
	// out of line, from index i of the queue (-1: it owned m). It returns
	// what is left to do once m.mu is released, or nil. The caller holds
	// m.mu.
	leftLocked(m *engine, w *localWaiter, i int) func(context.Context)
	// unwanted gives back what was handed to w (w.handed) when its
	// caller's ctx had ended.
	unwanted(ctx context.Context, m *engine, w *localWaiter)
}

// own makes the calling goroutine the owner of m, waiting in line behind
// the goroutines of this process that came first. It returns the hold handed
// over with ownership, or nil if the owner must acquire in Redis itself, and
// whether it had to wait. If ctx ends first it returns ctx's cause, and m is
// as if own was not called.
func (m *engine) own(ctx context.Context) (h *hold, waited bool, err error) {
	m.mu.Lock()
	if !m.owned {
		m.owned, m.shared, m.first = true, 0, nil
		m.mu.Unlock()
		return nil, false, nil
	}
	w := &localWaiter{turn: make(chan *hold, 1), n: 1}
	m.waiters = append(m.waiters, w)
	m.mu.Unlock()
	h, err = m.awaitTurn(ctx, w)
	return h, true, err
}

// awaitTurn waits for queued w's turn: it returns the hold handed over, or
// nil with ownership of m (a Semaphore's waiter: nil, unless its permits
// were handed to it, see handLocked). If ctx ends first it returns ctx's
// cause, and m is as if w had not queued: w's kind's rule (m.opt.rule) gives
// back what reached it and does what its giving up leaves to do.
func (m *engine) awaitTurn(ctx context.Context, w *localWaiter) (*hold, error) {
	select {
	case h := <-w.turn:
		if ctx.Err() == nil {
			return h, nil
		}
		// The turn and ctx's end were both ready and select picked the
		// turn at random: a caller whose ctx has ended must not hold m.
	case <-ctx.Done():
	}
	m.giveUpTurn(ctx, w)
	return nil, context.Cause(ctx)
}

// giveUpTurn takes w, whose caller's ctx ended, out of line; or, if a hold
// was handed to it meanwhile, gives it back ("acquired after we were
// cancelled: pretend we didn't", as x/sync/semaphore puts it), by m's
// local rule.
func (m *engine) giveUpTurn(ctx context.Context, w *localWaiter) {
	m.mu.Lock()
	if w.handed {
		m.mu.Unlock()
		m.opt.rule.unwanted(context.WithoutCancel(ctx), m, w)
		return
	}
	after := m.opt.rule.leftLocked(m, w, m.unqueueLocked(w))
	m.mu.Unlock()
	if after != nil {
		after(ctx)
	}
}

// tryOwn makes the calling goroutine the owner of m if no goroutine of this
// process owns it, and reports whether it did.
func (m *engine) tryOwn() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owned {
		return false
	}
	m.owned, m.shared, m.first = true, 0, nil
	return true
}

// queueLocked puts w in line for m, and reports whether it owns m at once:
// no goroutine of this process did (w is then m.first). The caller holds
// m.mu.
func (m *engine) queueLocked(w *localWaiter) (owner bool) {
	if !m.owned {
		m.owned, m.shared, m.first = true, 0, w
		return true
	}
	m.waiters = append(m.waiters, w)
	return false
}

// unqueueLocked takes w out of line: off the queue, or, if it owns m as
// m.first, ownership goes on to the next waiter. It returns w's index in
// the queue; -1 if it was the owner, or out of line already. The caller
// holds m.mu.
func (m *engine) unqueueLocked(w *localWaiter) int {
	if m.owned && m.first == w {
		m.passOwnershipLocked()
		return -1
	}
	i := slices.Index(m.waiters, w)
	if i >= 0 {
		m.waiters = slices.Delete(m.waiters, i, i+1)
		m.drainedLocked()
	}
	return i
}

// inLineLocked reports whether w is in line for m: queued, or the owner as
// m.first. The caller holds m.mu.
func (m *engine) inLineLocked(w *localWaiter) bool {
	return (m.owned && m.first == w) || slices.Contains(m.waiters, w)
}

// passOwnership hands ownership of m, without a hold, to the first local
// waiter, or leaves m not owned. The caller owns m and holds nothing.
func (m *engine) passOwnership() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.passOwnershipLocked()
}

// passOwnershipLocked is passOwnership for a caller holding m.mu. The
// waiter that owns m now is m.first.
func (m *engine) passOwnershipLocked() {
	m.shared = 0
	defer m.drainedLocked()
	if len(m.waiters) == 0 {
		m.owned, m.first = false, nil
		return
	}
	w := m.waiters[0]
	m.waiters = slices.Delete(m.waiters, 0, 1)
	m.first = w
	if w.shared {
		m.shared = 1 // the shared waiters behind it get in with its hold (setHold)
	}
	w.turn <- nil
}

// drainedLocked tells those waiting in enterShared for the shared holders
// and waiters to be gone, if they are. The caller holds m.mu.
func (m *engine) drainedLocked() {
	if m.drained != nil && m.shared == 0 && !slices.ContainsFunc(m.waiters, isShared) {
		close(m.drained)
		m.drained = nil
	}
}

// handOffLocked hands h, just taken out of m.hold, to w, the first local
// waiter (a kind's rule decides it may: see localRule): w holds m now, and
// owns it with the shared waiters its rule lets in along (a shared w's
// group). The caller holds m.mu and owns m.
func (m *engine) handOffLocked(w *localWaiter, h *hold) {
	m.waiters = slices.Delete(m.waiters, 0, 1)
	m.handoffs++
	m.hold = h
	m.shared = 0
	m.first = nil // the owner holds: nothing is handed on to it
	w.handed = true
	w.turn <- h
	if w.shared {
		m.shared = 1
	}
	m.drainedLocked()
}

// handLocked hands h to w, if it is in line for m (a Semaphore's waiter):
// it holds on h without a call of its own, and is out of line. Its turn
// tells it; if it owned m, it waits in Redis and its wake channel does,
// and ownership goes on to the next waiter. The caller holds m.mu, and sees
// that w has no call in flight.
func (m *engine) handLocked(w *localWaiter, h *hold) {
	if m.owned && m.first == w {
		w.handed = true
		m.passOwnershipLocked()
		select {
		case w.wake <- "": // it looks at handed under m.mu
		default:
		}
		return
	}
	if i := slices.Index(m.waiters, w); i >= 0 {
		w.handed = true
		m.waiters = slices.Delete(m.waiters, i, i+1)
		w.turn <- h
	}
}

// admitSharedLocked hands h to the shared waiters at the head of the local
// queue, which join the shared holders of m, and returns how many it
// handed. The caller holds m.mu, and m's owner is shared.
func (m *engine) admitSharedLocked(h *hold) (handed int) {
	for len(m.waiters) > 0 && m.waiters[0].shared {
		w := m.waiters[0]
		m.waiters = slices.Delete(m.waiters, 0, 1)
		m.shared++
		w.handed = true
		w.turn <- h
		handed++
	}
	return handed
}

// noHandOff keeps m's next UnlockCtx from handing the hold to a local
// waiter.
func (m *engine) noHandOff() {
	m.mu.Lock()
	m.handoffs = m.cfg.handoffs
	m.mu.Unlock()
}

// mayHandOffLocked reports whether h may be handed to another goroutine of
// this process: auto-extend is on, the hand-offs in a row have not reached
// their bound, and h is well within its validity. The caller holds m.mu.
func (m *engine) mayHandOffLocked(h *hold) bool {
	return m.handoffs < m.cfg.handoffs && m.wellWithin(h)
}

// wellWithin reports whether h may serve another goroutine of this process
// without a round trip: auto-extend is on and h is well within its
// validity (a NetMutex's hand-off, a Semaphore's hand-on).
func (m *engine) wellWithin(h *hold) bool {
	if !m.cfg.autoExtend {
		return false
	}
	// With auto-extend the watchdog keeps at least two thirds of the expiry
	// ahead; less than half means extends are failing: release instead of
	// handing over a hold about to be lost.
	until, held := h.deadline()
	return held && m.clk.Until(until) >= m.cfg.expiry/2
}

// setHold makes h m's hold, acquired in Redis by the owner of m (a
// shared owner lets the shared waiters behind it in afterwards: see
// awaitShared).
func (m *engine) setHold(h *hold) {
	m.mu.Lock()
	m.hold = h
	m.handoffs = 0
	m.mu.Unlock()
}

// enterShared begins a shared lock of m (see localWaiter) if a goroutine
// of this process owns m and either share is true or shared holders or
// waiters are there already; it reports whether it did. It returns the
// hold if the caller shares it at once: shared holders hold it, no waiter
// is queued, and a hand-off would be allowed (joining counts as one);
// otherwise, if queue, the waiter it queued, for awaitShared. If share is
// false and shared holders or waiters are there, it returns instead a
// channel closed once they are gone: the caller's other way in (a
// NetRWMutex's read lease) is never taken while they are there.
func (m *engine) enterShared(queue, share bool) (h *hold, w *localWaiter, in bool, drained <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.owned {
		return nil, nil, false, nil
	}
	group := m.shared > 0 || slices.ContainsFunc(m.waiters, isShared)
	if !share {
		if !group {
			return nil, nil, false, nil
		}
		if m.drained == nil {
			m.drained = make(chan struct{})
		}
		return nil, nil, false, m.drained
	}
	if m.shared > 0 && m.hold != nil && len(m.waiters) == 0 && m.mayHandOffLocked(m.hold) {
		m.shared++
		m.handoffs++
		return m.hold, nil, true, nil
	}
	if !queue {
		return nil, nil, true, nil
	}
	w = &localWaiter{turn: make(chan *hold, 1), shared: true, n: 1}
	m.waiters = append(m.waiters, w)
	return nil, w, true, nil
}

func isShared(w *localWaiter) bool { return w.shared }

// awaitShared waits for the turn of w, queued by enterShared: a hold handed
// to it, or ownership, with which it acquires in Redis (as LockCtx does)
// for itself and the shared waiters behind it. Its errors are LockCtx's.
func (m *engine) awaitShared(ctx context.Context, w *localWaiter) error {
	h, err := m.awaitTurn(ctx, w)
	if err != nil {
		return notObtained(err)
	}
	if h != nil {
		return nil
	}
	ctx, done := m.startAcquire(ctx, false)
	if done == nil {
		done = func(bool, bool, bool, error) {}
	}
	_, contended, err := m.acquire(ctx, true)
	if err != nil {
		m.passOwnership()
		done(false, contended, false, err)
		return err
	}
	if ctx.Err() != nil {
		m.abandon(ctx, true, true)
		err = notObtained(context.Cause(ctx))
		done(false, contended, false, err)
		return err
	}
	m.heldSince()
	// The observer hears of the hold before the shared waiters behind us
	// get it: what they do under it comes after its acquire.
	done(true, contended, false, nil)
	m.mu.Lock()
	m.admitSharedLocked(m.hold)
	m.mu.Unlock()
	return nil
}

// sharedHeld reports whether goroutines hold m shared.
func (m *engine) sharedHeld() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shared > 0 && m.hold != nil
}

// exclusiveHold returns m's hold if it is not shared; nil otherwise.
func (m *engine) exclusiveHold() *hold {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.shared > 0 {
		return nil
	}
	return m.hold
}
