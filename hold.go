package netlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A hold is one acquisition of a NetMutex, from acquire to Unlock.
type hold struct {
	m     *NetMutex
	value string // our random lock value, fresh for this acquisition
	token uint64

	ended  chan struct{}      // closed when the hold is lost or released (Lost)
	stop   context.CancelFunc // ends the watchdog and any extend it runs
	exited chan struct{}      // closed when the watchdog has returned

	mu    sync.Mutex
	until time.Time // local deadline, monotonic: the hold is lost when it passes
	state holdState
}

type holdState int

const (
	held holdState = iota
	lost
	released
)

// newHold starts the hold's watchdog, which extends the key while auto-extend
// is on and declares the hold lost when until passes.
func newHold(m *NetMutex, g grant) *hold {
	ctx, stop := context.WithCancel(context.Background())
	h := &hold{
		m:      m,
		value:  g.value,
		token:  g.token,
		ended:  make(chan struct{}),
		stop:   stop,
		exited: make(chan struct{}),
		until:  g.until,
	}
	go h.watch(ctx, g.start)
	return h
}

// watch runs for the life of the hold. It wakes at the next extend (every
// third of the expiry, with auto-extend) or at until, whichever is first.
// Losing the hold depends on the local clock only: if until passes without a
// successful extend, the hold is lost then, whatever the network is doing.
func (h *hold) watch(ctx context.Context, start time.Time) {
	defer close(h.exited)
	cfg := &h.m.cfg
	interval := cfg.expiry / 3
	next := start.Add(interval) // next extend, when auto-extend is on
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		until, ok := h.deadline()
		if !ok {
			return
		}
		wake := until
		if cfg.autoExtend && next.Before(until) {
			wake = next
		}
		t.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}

		now := time.Now()
		if h.expire(now) {
			return
		}
		if !cfg.autoExtend || now.Before(next) {
			continue // woken early, or until moved by ExtendCtx
		}
		switch err := h.m.extendRound(ctx, h); {
		case err == nil:
			next = now.Add(interval)
		case errors.Is(err, ErrLockLost):
			h.lose()
			return
		default:
			// The nodes could not be asked (down, slow, partitioned): try
			// again soon, while until allows.
			next = now.Add(max(interval/8, time.Millisecond))
		}
	}
}

// deadline returns the local deadline, and false if the hold has ended.
func (h *hold) deadline() (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until, h.state == held
}

// expire declares the hold lost if until has passed at now, and reports
// whether the hold is over.
func (h *hold) expire(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held && !now.Before(h.until) {
		h.state = lost
		close(h.ended)
	}
	return h.state != held
}

// lose declares the hold lost now (an extend or release found the key gone
// or taken).
func (h *hold) lose() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held {
		h.state = lost
		close(h.ended)
	}
}

// moveUntil moves the local deadline to until, if the hold is still held and
// until is later. It reports whether the hold is still held.
func (h *hold) moveUntil(until time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held && !time.Now().Before(h.until) {
		h.state = lost // the extend came back too late
		close(h.ended)
	}
	if h.state == held && until.After(h.until) {
		h.until = until
	}
	return h.state == held
}

// end stops the watchdog, waits for it, and marks the hold released. It
// reports whether the hold had been lost before.
func (h *hold) end() (wasLost bool) {
	h.stop()
	<-h.exited
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == held {
		if !time.Now().Before(h.until) {
			h.state = lost
		}
		close(h.ended)
	}
	wasLost = h.state == lost
	h.state = released
	return wasLost
}

// extendRound resets the key's TTL on every node, bounded by the hold's
// current local deadline (never by the deadline it would get: an extend that
// answers after until is too late). On success it moves until. It returns
// ErrLockLost when the key is gone or taken on so many nodes that a quorum
// can never hold it again.
func (m *NetMutex) extendRound(ctx context.Context, h *hold) error {
	until, ok := h.deadline()
	if !ok {
		return ErrLockLost
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	start := time.Now()
	err := m.settle(m.fanout(ctx, extendScript, m.lockKeys, []string{h.value, m.expiryMS}, nil))
	if err != nil {
		return err
	}
	if !h.moveUntil(start.Add(m.cfg.expiry - time.Since(start) - m.driftTerm)) {
		return ErrLockLost
	}
	return nil
}
