package netlock

import (
	"context"
	"fmt"
	"time"
)

// Bounds of the script calls netlock has in flight on one Backend (see
// limiter).
const (
	// maxCalls bounds the calls in flight on one Backend, so that a pool
	// without a bound of its own (redigo's MaxActive 0), which dials a
	// connection per call in flight, keeps few connections to the server.
	// Without it, ten thousand holds extended at once dialed thousands of
	// connections, up to the server's maxclients (10,000), and calls failed
	// on dial timeouts.
	// Half of 256: a server counts a connection closed by its client until
	// it has read the close, so when calls time out (the client closes
	// their connections) and others dial anew, its count runs ahead of the
	// calls in flight. More would not be faster: Redis runs one command at
	// a time, and calls in flight beyond a few dozen only wait in its
	// queue, where under load they run into the node timeout.
	maxCalls = 128
	// extendCalls of them are kept for the watchdogs' extends: a crowd of
	// acquires (ten thousand LockCtx at start-up) must not keep a hold from
	// being extended before its deadline, and when the server is the
	// bottleneck, the extends get half of what it runs. Extends come at
	// holds/(expiry/3) a second, spread out (extendJitter), each a round
	// trip long: 64 in flight at a millisecond each is 64,000 a second.
	extendCalls = 64
)

// A limiter bounds the script calls in flight on one Backend: maxCalls in
// all, extendCalls of them for extends, the rest for every other script
// (acquire, release, leave, inspect). A call that finds its budget full
// waits for a slot, in order of arrival, within its context (see
// engine.call), and costs neither a connection nor the server anything
// while it waits.
//
// The limiter lives in the Backend's Hub, the one per-Backend place netlock
// has. A Backend without a Hub has none: its calls are bounded only by its
// client, since a limiter per NetMutex, which has a few calls in flight at
// most, would never bind.
type limiter struct {
	extends chan struct{} // a token per extend in flight
	others  chan struct{} // a token per other call in flight
}

func newLimiter() *limiter {
	return &limiter{
		extends: make(chan struct{}, extendCalls),
		others:  make(chan struct{}, maxCalls-extendCalls),
	}
}

// enter takes a slot of s's budget, waiting for one until ctx ends, or for
// at most bound if ctx has no deadline. It returns the budget, and whether
// it had to wait; the caller gives the slot back with exit when its call
// returns. If the wait ends first it returns an error wrapping ctx's cause
// (context.DeadlineExceeded after bound), and takes no slot. A nil limiter
// takes none and returns nil.
func (l *limiter) enter(ctx context.Context, s *Script, bound time.Duration) (slots chan struct{}, waited bool, err error) {
	if slots, ok := l.tryEnter(s); ok {
		return slots, false, nil
	}
	slots = l.budget(s)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	select {
	case slots <- struct{}{}:
		return slots, true, nil
	case <-ctx.Done():
		return nil, true, fmt.Errorf("all %d %s calls in flight were still running: %w", cap(slots), budgetName(s), context.Cause(ctx))
	}
}

// tryEnter takes a slot of s's budget if one is free, and reports whether
// it did; the caller gives it back with exit. A nil limiter takes none and
// reports true.
func (l *limiter) tryEnter(s *Script) (slots chan struct{}, ok bool) {
	if l == nil {
		return nil, true
	}
	slots = l.budget(s)
	select {
	case slots <- struct{}{}:
		return slots, true
	default:
		return nil, false
	}
}

// budget returns the slots of s's budget.
func (l *limiter) budget(s *Script) chan struct{} {
	if s.op == opExtend {
		return l.extends
	}
	return l.others
}

// exit gives back the slot enter took in slots.
func exit(slots chan struct{}) {
	if slots != nil {
		<-slots
	}
}

func budgetName(s *Script) string {
	if s.op == opExtend {
		return "extend"
	}
	return "non-extend"
}
