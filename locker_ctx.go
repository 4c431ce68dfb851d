package netlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LockCtx locks m, waiting while the lock is held elsewhere, until ctx ends.
// It waits first for goroutines of this process that share m, in order of
// arrival, then for other clients.
//
// It returns nil when m is held. If ctx ends first, it returns an error
// matching ctx's error, and nothing is left held on any node: an
// acquisition that was under way is released under a context that ctx's
// cancellation does not reach, and a hold that came as ctx ended is passed
// on. The error also matches ErrNotObtained if the lock was held by another
// then, or ErrQuorum (naming each node's error) if the nodes did not
// answer the last attempt: a short deadline does not report an outage as a
// busy lock.
//
// While it waits, LockCtx costs Redis about one command per expiry: its turn
// comes by a message from the release that makes it, not by polling (see
// Subscriber). While Redis cannot be asked (connections refused or reset, a
// server restarting, calls slower than the node timeout), it keeps trying
// for the outage window (WithOutageWindow, default the expiry); if the nodes
// still do not answer, it returns an error matching ErrQuorum that names
// each node's last error. An answer that retrying cannot change (a key of another type, a missing
// permission) is returned at once, the same way: so is, before it first
// waits on a Backend, a Redis user that may not publish and subscribe on
// the lock's channels (the error names the ACL rule to add).
func (m *NetMutex) LockCtx(ctx context.Context) (err error) {
	if err := m.check(); err != nil {
		return err
	}
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

// TryLockCtx tries to lock m once, without waiting for another holder. It
// returns (true, nil) when m is held; (false, nil) when another goroutine of
// this process or another client holds it; and (false, err) when the attempt
// could not be made (ctx ended, or Redis could not be asked), leaving nothing
// held on any node. ctx bounds the one attempt.
func (m *NetMutex) TryLockCtx(ctx context.Context) (ok bool, err error) {
	if err := m.check(); err != nil {
		return false, err
	}
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

// UnlockCtx unlocks m. It returns ErrNotHeld if m is not locked, and
// ErrLockLost if the hold had been lost (its key expired, was deleted or
// taken) before the release. Whatever it returns, m is unlocked in this
// process afterwards: the next local waiter may proceed.
//
// If a goroutine of this process is waiting for m, UnlockCtx may hand it the
// hold instead of releasing it (see WithLocalHandoffs): it then returns nil
// at once. Otherwise it releases the lock on every node, under a context
// detached from ctx's cancellation (a caller giving up must not strand the
// key), each call bounded by the node timeout once sent; ctx only carries
// values. (A call first waits, up to the expiry, if this process has as many
// calls in flight on the Backend as netlock allows: see "Holding a lock" in
// the package documentation.)
func (m *NetMutex) UnlockCtx(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	return m.unlock(ctx, false)
}

// unlock is UnlockCtx for a holder that is shared or not (see
// localWaiter): a shared holder that is not the last of its group only
// leaves it.
func (m *NetMutex) unlock(ctx context.Context, shared bool) error {
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
	if _, handed := m.rule.admitLocked(m, h, 1); handed > 0 {
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
func (m *NetMutex) abandon(ctx context.Context, acquired, shared bool) {
	if acquired {
		m.noHandOff()
	}
	m.unlock(context.WithoutCancel(ctx), shared)
}

// releaseHold releases h's key and returns what settle makes of the
// replies. If the release woke waiters of other clients, this client's next
// acquire yields to them for a moment.
func (m *NetMutex) releaseHold(ctx context.Context, h *hold) error {
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
func (m *NetMutex) noteRTT(d time.Duration) {
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
func (m *NetMutex) keep(ctx context.Context, h *hold, rest time.Duration) error {
	ms := int64((rest + time.Millisecond - 1) / time.Millisecond)
	s, keys, args := m.kind.keepCall(h.value, ms)
	return m.settle(m.fanout(detached(ctx), s, keys, args, nil))
}

// heldSince records that the calling goroutine's hold of m begins now, for
// UnlockDone.Held.
func (m *NetMutex) heldSince() {
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

// ExtendCtx resets the lock's TTL to the full expiry on every node and moves
// the hold's local deadline. With auto-extend on (the default) there is no
// need to call it. It returns ErrNotHeld if m is not locked, and ErrLockLost
// if the hold is lost (expired, deleted or taken by another client); it never
// re-acquires a lock that lapsed. Another error (ctx ended, nodes not
// answering) leaves the hold as it was, lost when its deadline passes unless
// an extend succeeds before. ctx and the hold's deadline bound the call.
func (m *NetMutex) ExtendCtx(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
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

// Do locks m, runs fn, and unlocks m. fn's context is cancelled when the hold
// is lost (its cause is then ErrLockLost) or ctx ends. Do returns fn's result
// and fn's error joined with the unlock's: ErrLockLost if the hold was lost
// while fn ran. If fn panics, m is unlocked and the panic goes on. If locking
// fails, fn is not run and Do returns the zero T and LockCtx's error.
func Do[T any](ctx context.Context, m *NetMutex, fn func(ctx context.Context) (T, error)) (result T, err error) {
	if err := m.LockCtx(ctx); err != nil {
		return result, err
	}
	return runLocked(ctx, m, fn)
}

// TryDo is Do without waiting: it tries once to lock m, as TryLockCtx does,
// and runs fn only if the lock was free; then it returns fn's result, true,
// and fn's error joined with the unlock's. It returns the zero T, false and
// nil when another goroutine of this process or another client holds the
// lock, and the zero T, false and the error when the attempt could not be
// made (ctx ended, Redis could not be asked). It means "skip if busy right
// now": others skip fn only while one runs it, not once it has returned.
func TryDo[T any](ctx context.Context, m *NetMutex, fn func(ctx context.Context) (T, error)) (result T, ran bool, err error) {
	ok, err := m.TryLockCtx(ctx)
	if !ok {
		return result, false, err
	}
	result, err = runLocked(ctx, m, fn)
	return result, true, err
}

// runLocked runs fn for Do and TryDo, m locked, and unlocks m.
func runLocked[T any](ctx context.Context, m *NetMutex, fn func(ctx context.Context) (T, error)) (result T, err error) {
	h := m.current()
	lost := m.Lost()
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
	defer func() {
		// Runs on return and on panic; a panic goes on after the unlock.
		cancel(nil)
		<-watched
		if uerr := m.UnlockCtx(context.WithoutCancel(ctx)); uerr != nil {
			err = join(err, uerr)
		}
	}()
	return fn(fctx)
}

// lostCause returns the cause of the end of the context Do gives fn when h
// is lost: ErrLockLost, saying so when it lasted WithMaxHold's bound.
func (m *NetMutex) lostCause(h *hold) error {
	if h != nil && h.lostReason() == LostMaxHold {
		return &wrapError{msg: fmt.Sprintf("netlock: lock lost: held for WithMaxHold's %v", m.cfg.maxHold), err: ErrLockLost}
	}
	return ErrLockLost
}
