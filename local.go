package netlock

import (
	"context"
	"slices"
)

// The in-process side of a NetMutex: goroutines sharing one NetMutex queue
// in order of arrival, and only the one that owns m talks to Redis.

// A localWaiter is a goroutine queued for m. It is sent either a hold (a
// hand-off: it now holds m) or nil (it now owns m and must acquire in Redis).
type localWaiter struct {
	turn chan *hold // capacity 1: the sender never blocks
}

// own makes the calling goroutine the owner of m, waiting in line behind
// the goroutines of this process that came first. It returns the hold handed
// over with ownership, or nil if the owner must acquire in Redis itself, and
// whether it had to wait. If ctx ends first it returns ctx's cause, and m is
// as if own was not called.
func (m *NetMutex) own(ctx context.Context) (h *hold, waited bool, err error) {
	m.mu.Lock()
	if !m.owned {
		m.owned = true
		m.mu.Unlock()
		return nil, false, nil
	}
	w := &localWaiter{turn: make(chan *hold, 1)}
	m.waiters = append(m.waiters, w)
	m.mu.Unlock()

	select {
	case h := <-w.turn:
		if ctx.Err() == nil {
			return h, true, nil
		}
		// The turn and ctx's end were both ready and select picked the
		// turn at random: a caller whose ctx has ended must not hold m.
		m.passTurn(h)
		return nil, true, context.Cause(ctx)
	case <-ctx.Done():
	}
	m.mu.Lock()
	if i := slices.Index(m.waiters, w); i >= 0 {
		m.waiters = slices.Delete(m.waiters, i, i+1)
		m.mu.Unlock()
		return nil, true, context.Cause(ctx)
	}
	m.mu.Unlock()
	// Our turn came as ctx ended: pass it on, so a cancelled caller never
	// holds m.
	m.passTurn(<-w.turn)
	return nil, true, context.Cause(ctx)
}

// passTurn gives up a turn that reached a caller who no longer wants it
// ("acquired after we were cancelled: pretend we didn't", as
// x/sync/semaphore puts it): a hold handed over (h, which is m.hold) goes to
// the next local waiter or is released; ownership alone passes on.
func (m *NetMutex) passTurn(h *hold) {
	if h != nil {
		m.UnlockCtx(context.Background())
	} else {
		m.passOwnership()
	}
}

// tryOwn makes the calling goroutine the owner of m if no goroutine of this
// process owns it, and reports whether it did.
func (m *NetMutex) tryOwn() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owned {
		return false
	}
	m.owned = true
	return true
}

// passOwnership hands ownership of m, without a hold, to the first local
// waiter, or leaves m not owned. The caller owns m and holds nothing.
func (m *NetMutex) passOwnership() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.waiters) == 0 {
		m.owned = false
		return
	}
	w := m.waiters[0]
	m.waiters = slices.Delete(m.waiters, 0, 1)
	w.turn <- nil
}

// handOff passes h to the first local waiter, without a round trip, if
// there is one, h is still well within its validity, and the hand-offs in a
// row have not reached their bound. It reports whether it did. The caller
// holds m.mu, owns m and has just taken h out of m.hold.
func (m *NetMutex) handOffLocked(h *hold) bool {
	if len(m.waiters) == 0 || !m.mayHandOffLocked(h) {
		return false
	}
	w := m.waiters[0]
	m.waiters = slices.Delete(m.waiters, 0, 1)
	m.handoffs++
	m.hold = h
	w.turn <- h
	return true
}

// mayHandOffLocked reports whether h may be handed to another goroutine of
// this process: auto-extend is on, the hand-offs in a row have not reached
// their bound, and h is well within its validity. The caller holds m.mu.
func (m *NetMutex) mayHandOffLocked(h *hold) bool {
	return m.handoffs < m.cfg.handoffs && m.wellWithin(h)
}

// wellWithin reports whether h may serve another goroutine of this process
// without a round trip: auto-extend is on and h is well within its
// validity (a NetMutex's hand-off, a Semaphore's hand-on).
func (m *NetMutex) wellWithin(h *hold) bool {
	if !m.cfg.autoExtend {
		return false
	}
	// With auto-extend the watchdog keeps at least two thirds of the expiry
	// ahead; less than half means extends are failing: release instead of
	// handing over a hold about to be lost.
	until, held := h.deadline()
	return held && m.clk.Until(until) >= m.cfg.expiry/2
}

// setHold makes h m's hold, acquired in Redis by the owner of m.
func (m *NetMutex) setHold(h *hold) {
	m.mu.Lock()
	m.hold = h
	m.handoffs = 0
	m.mu.Unlock()
}
