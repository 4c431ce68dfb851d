package netlock

import (
	"context"
	"errors"
	"time"
)

// LockCtx locks m, waiting while the lock is held elsewhere, until ctx ends.
// It waits first for goroutines of this process that share m, in order of
// arrival, then for other clients.
//
// It returns nil when m is held. If ctx ends first, it returns an error
// matching both ErrNotObtained and ctx's error, and nothing is left held on
// any node: an acquisition that was under way is released under a context
// that ctx's cancellation does not reach. If Redis cannot be asked (down,
// slower than the node timeout, a key of another type) it returns at once
// with an error matching ErrQuorum that names the node.
func (m *NetMutex) LockCtx(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained(context.Cause(ctx))
	}
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return notObtained(context.Cause(ctx))
	}
	if err := m.acquire(ctx, true); err != nil {
		<-m.sem
		return err
	}
	return nil
}

// TryLockCtx tries to lock m once, without waiting for another holder. It
// returns (true, nil) when m is held; (false, nil) when another goroutine of
// this process or another client holds it; and (false, err) when the attempt
// could not be made (ctx ended, or Redis could not be asked), leaving nothing
// held on any node. ctx bounds the one attempt.
func (m *NetMutex) TryLockCtx(ctx context.Context) (bool, error) {
	if err := m.check(); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained(context.Cause(ctx))
	}
	select {
	case m.sem <- struct{}{}:
	default:
		return false, nil
	}
	err := m.acquire(ctx, false)
	if err == nil {
		return true, nil
	}
	<-m.sem
	if err == ErrNotObtained {
		return false, nil
	}
	return false, err
}

// UnlockCtx releases m on every node. It returns ErrNotHeld if m is not
// locked, and ErrLockLost if the hold had been lost (its key expired, was
// deleted or taken) before the release. Whatever it returns, m is unlocked
// in this process afterwards: the next local waiter may proceed.
//
// The release runs under a context detached from ctx's cancellation (a
// caller giving up must not strand the key), bounded by the node timeout;
// ctx only carries values.
func (m *NetMutex) UnlockCtx(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	m.mu.Lock()
	h := m.hold
	m.hold = nil
	m.mu.Unlock()
	if h == nil {
		return ErrNotHeld
	}
	wasLost := h.end()
	err := m.settle(m.release(context.WithoutCancel(ctx), h.value, nil))
	<-m.sem
	if wasLost {
		return ErrLockLost
	}
	return err
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
	if _, held := h.deadline(); !held || h.expire(time.Now()) {
		return ErrLockLost
	}
	return err
}

// maxBallots bounds the immediate retries after refused ballots: each
// learns every answering node's counter, so one usually suffices; more are
// needed only while other clients keep winning.
const maxBallots = 3

// acquire runs acquire rounds until one succeeds; with wait false it makes
// just one. Between rounds it waits for the retry delay, never longer than
// the holder's remaining TTL. The caller owns m.sem.
func (m *NetMutex) acquire(ctx context.Context, wait bool) error {
	b := backoff{min: m.cfg.minRetryDelay, max: m.cfg.maxRetryDelay}
	var t *time.Timer
	for ballots := 0; ; {
		g, busy, err := m.acquireRound(ctx)
		if err == nil {
			h := newHold(m, g)
			m.mu.Lock()
			m.hold = h
			m.mu.Unlock()
			return nil
		}
		if err == errBallot && ballots < maxBallots {
			// The lock is free; the retry proposes above the counters just
			// learned. Part of one attempt, even for TryLock.
			ballots++
			continue
		}
		if err == errBallot {
			err = ErrNotObtained
		}
		if err != ErrNotObtained || !wait {
			return err
		}
		ballots = 0
		d := b.next(busy)
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return notObtained(context.Cause(ctx))
		case <-t.C:
		}
	}
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
	lost := m.Lost()
	fctx, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lost:
			cancel(ErrLockLost)
		case <-fctx.Done():
		}
	}()
	defer func() {
		// Runs on return and on panic; a panic goes on after the unlock.
		cancel(nil)
		<-watched
		if uerr := m.UnlockCtx(context.WithoutCancel(ctx)); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(fctx)
}
