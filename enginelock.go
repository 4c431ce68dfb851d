package netlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// lockCtx is NetMutex.LockCtx.
func (m *engine) lockCtx(ctx context.Context) (err error) {
	var contended, handedOver bool
	ctx, done := m.startAcquire(ctx, false)
	if done != nil {
		defer func() { done(err == nil, contended, handedOver, err) }()
	}
	if ctx.Err() != nil {
		return notObtained(context.Cause(ctx))
	}
	h, waited, err := m.own(ctx)
	contended, handedOver = waited, h != nil
	if err != nil {
		return notObtained(err)
	}
	if h == nil { // not handed over by the previous local holder
		_, busy, err := m.acquire(ctx, true)
		contended = contended || busy
		if err != nil {
			m.passOwnership()
			return err
		}
	}
	if ctx.Err() != nil {
		// ctx ended as the hold came: whichever came first, a caller
		// whose ctx has ended when LockCtx returns never holds m.
		m.abandon(ctx, h == nil, false)
		return notObtained(context.Cause(ctx))
	}
	m.heldSince()
	return nil
}

// tryLockCtx is NetMutex.TryLockCtx.
func (m *engine) tryLockCtx(ctx context.Context) (ok bool, err error) {
	contended := false
	ctx, done := m.startAcquire(ctx, true)
	if done != nil {
		defer func() { done(ok, contended, false, err) }()
	}
	if ctx.Err() != nil {
		return false, notObtained(context.Cause(ctx))
	}
	if !m.tryOwn() {
		contended = true
		return false, nil
	}
	ok, contended, err = m.acquire(ctx, false)
	if !ok {
		m.passOwnership()
		return false, err
	}
	m.heldSince()
	return true, nil
}

// unlockCtx is NetMutex.UnlockCtx.
func (m *engine) unlockCtx(ctx context.Context) error {
	return m.unlock(ctx, false)
}

// unlock is UnlockCtx for a holder that is shared or not (see
// localWaiter): a shared holder that is not the last of its group only
// leaves it.
func (m *engine) unlock(ctx context.Context, shared bool) error {
	m.mu.Lock()
	h := m.hold
	if h == nil || (m.shared > 0) != shared {
		m.mu.Unlock()
		return ErrNotHeld
	}
	if shared {
		m.shared--
		if m.shared > 0 {
			m.mu.Unlock()
			return nil
		}
	}
	m.hold = nil
	held := m.clk.Since(m.since)
	if _, handed := m.opt.rule.admitLocked(m, h, 1); handed > 0 {
		m.mu.Unlock()
		m.unlocked(ctx, h, held, true, nil)
		return nil
	}
	m.handoffs = 0
	m.mu.Unlock()

	wasLost := h.end()
	var err error
	if rest := m.clk.Until(h.keep); rest > 0 {
		err = m.keep(ctx, h, rest)
	} else {
		err = m.releaseHold(ctx, h)
	}
	m.passOwnership()
	switch {
	case wasLost:
		err = ErrLockLost
	case errors.Is(err, ErrLockLost):
		m.lostHold(h, LostRelease)
	}
	m.unlocked(ctx, h, held, false, err)
	return err
}

// abandon gives back the hold of a caller whose ctx ended as it came
// (shared: a shared holder's). One acquired in Redis (acquired) goes back
// to Redis: handed on, the goroutines of this process it went to would
// hold what no observer heard acquired. One handed over may be handed on.
func (m *engine) abandon(ctx context.Context, acquired, shared bool) {
	if acquired {
		m.noHandOff()
	}
	m.unlock(context.WithoutCancel(ctx), shared)
}

// releaseHold releases h's key and returns what settle makes of the
// replies. If the release woke waiters of other clients, this client's next
// acquire yields to them for a moment.
func (m *engine) releaseHold(ctx context.Context, h *hold) error {
	start := m.clk.Now()
	replies := m.release(detached(ctx), h.value, h.tomb, nil, true)
	m.noteRTT(m.clk.Since(start))
	err := m.settle(replies)
	if err == nil && woke(replies) {
		// Other clients were subscribed when we released: an acquire of
		// ours that starts at once would win the race to the key nearly
		// every time. Give them about twice the release's round trip.
		grace := min(max(2*m.clk.Since(start), minYield), maxYield)
		m.yieldUntil.Store(int64(m.clk.Since(m.epoch) + grace))
	}
	return err
}

// noteRTT takes a release's round trip d into m.rtt: the least one seen,
// drifting slowly up towards later ones, as TCP's minimum RTT does, so
// that the time a call queues behind others (in the client, or in a busy
// server) does not count.
func (m *engine) noteRTT(d time.Duration) {
	sample := max(int64(d), 1)
	if old := m.rtt.Load(); old > 0 && sample > old {
		sample = old + (sample-old)/64
	}
	m.rtt.Store(sample)
}

// keep ends h, unlocked before WithMinHold's time is over, by setting its
// key to expire in rest (rounded up to Redis's millisecond) instead of
// deleting it: others get in then. It returns what settle makes of the
// replies.
func (m *engine) keep(ctx context.Context, h *hold, rest time.Duration) error {
	ms := int64((rest + time.Millisecond - 1) / time.Millisecond)
	s, keys, args := m.kind.keepCall(h.value, ms)
	return m.settle(m.fanout(detached(ctx), s, keys, args, nil))
}

// heldSince records that the calling goroutine's hold of m begins now, for
// UnlockDone.Held.
func (m *engine) heldSince() {
	m.mu.Lock()
	m.since = m.clk.Now()
	m.mu.Unlock()
}

// woke reports whether a release woke a waiter on some node to attempt
// (not granted it the lock: then there is no race to yield in).
func woke(replies []nodeReply) bool {
	for _, r := range replies {
		if r.err == nil && r.vals[0] == releaseDone && len(r.vals) > 2 && r.vals[1] > 0 && r.vals[2] == 0 {
			return true
		}
	}
	return false
}

// extendCtx is NetMutex.ExtendCtx.
func (m *engine) extendCtx(ctx context.Context) error {
	h := m.current()
	if h == nil {
		return ErrNotHeld
	}
	err := m.extendRound(ctx, h)
	if errors.Is(err, ErrLockLost) {
		h.lose()
		return ErrLockLost
	}
	if _, held := h.deadline(); !held || h.expire(m.clk.Now()) {
		return ErrLockLost
	}
	return err
}

// runLocked runs fn for Do and TryDo, m locked, and unlocks m.
func runLocked[T any](ctx context.Context, m *engine, fn func(ctx context.Context) (T, error)) (result T, err error) {
	fctx, stop := m.whileHeld(ctx, m.current())
	defer func() {
		// Runs on return and on panic; a panic goes on after the unlock.
		stop()
		if uerr := m.unlockCtx(context.WithoutCancel(ctx)); uerr != nil {
			err = join(err, uerr)
		}
	}()
	return fn(fctx)
}

// whileHeld returns a context derived from ctx that is cancelled when h is
// lost (its cause: lostCause), for a function run under h; stop cancels it
// and returns once nothing of it runs any more.
func (m *engine) whileHeld(ctx context.Context, h *hold) (_ context.Context, stop func()) {
	lost := m.lostChan()
	if h != nil {
		lost = h.lostChan()
	}
	fctx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lost:
			cancel(m.lostCause(h))
		case <-fctx.Done():
		}
	}()
	return fctx, func() {
		cancel(nil)
		<-watched
	}
}

// lostCause returns the cause of the end of the context Do gives fn when h
// is lost: ErrLockLost, saying so when it lasted WithMaxHold's bound.
func (m *engine) lostCause(h *hold) error {
	if h != nil && h.lostReason() == LostMaxHold {
		return &wrapError{msg: fmt.Sprintf("netlock: lock lost: held for WithMaxHold's %v", m.cfg.maxHold), err: ErrLockLost}
	}
	return ErrLockLost
}
