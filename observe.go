package netlock

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// An Observer is told what a NetMutex does, for metrics and traces: give it
// with WithObserver. Every field is optional. netlock calls them
// synchronously, from the goroutine doing the work and never while holding
// a lock of its own, so they must return quickly and be safe for concurrent
// use. Package netlock/otelnetlock turns them into OpenTelemetry metrics and
// spans.
type Observer struct {
	// Acquire is called as LockCtx or TryLockCtx (and so Lock, TryLock and
	// Do) begins, with the caller's context, in which a tracer may start a
	// span. The context it returns, if not nil, is the one the call then
	// uses for its calls to the Backends (so that a client library's spans
	// nest under the acquire's); it must be ctx or derived from it. The
	// function it returns, if not nil, is called once, as the call returns.
	Acquire func(ctx context.Context, a AcquireStart) (context.Context, func(AcquireDone))

	// Unlock is called as UnlockCtx (and so Unlock and Do) returns, once
	// for each LockCtx or TryLockCtx that acquired, with UnlockCtx's
	// context (context.Background() for Unlock).
	Unlock func(ctx context.Context, u UnlockDone)

	// Extend is called after each extend round, with ExtendCtx's context,
	// or context.Background() for the watchdog's.
	Extend func(ctx context.Context, x ExtendDone)

	// Lost is called once per hold that is lost: its local deadline passed
	// without a successful extend, or an extend or the release found its
	// key gone or taken. It runs when netlock learns it, which may be at
	// Unlock.
	Lost func(LostHold)
}

// AcquireStart describes a LockCtx or TryLockCtx that begins.
type AcquireStart struct {
	Name string // the lock's name
	Kind Kind   // what the lock is: a NetMutex, a NetRWMutex's read lease or write lock, or a Semaphore's lease
	Try  bool   // TryLockCtx (TryLock): one attempt, no waiting
}

// AcquireDone describes how a LockCtx or TryLockCtx ended.
type AcquireDone struct {
	Name     string
	Kind     Kind // what the lock is: a NetMutex, a NetRWMutex's read lease or write lock, or a Semaphore's lease
	Try      bool
	Acquired bool          // m is held
	Token    uint64        // the hold's fencing token, if acquired (0 with fencing off)
	Wait     time.Duration // from the call's start to its return
	// Contended: the lock was held when the call began, in this process
	// or elsewhere (a TryLock that found it held, or a LockCtx that waited).
	Contended bool
	// HandedOver: the hold came from a goroutine of this process, without
	// a round trip to Redis (WithLocalHandoffs).
	HandedOver bool
	// Err is what the call returned: nil when acquired, and when TryLock
	// found the lock held.
	Err error
}

// UnlockDone describes an UnlockCtx of a hold.
type UnlockDone struct {
	Name  string
	Kind  Kind // what the lock is: a NetMutex, a NetRWMutex's read lease or write lock, or a Semaphore's lease
	Token uint64
	Held  time.Duration // from the acquire's return to the unlock
	// HandedOver: the hold went to a goroutine of this process waiting
	// for it, which holds it now; nothing was sent to Redis.
	HandedOver bool
	// Err is what UnlockCtx returned: nil, ErrLockLost (the hold had been
	// lost), or an error matching ErrQuorum (the release did not reach
	// enough nodes: it is delivered in the background when they answer).
	Err error
}

// ExtendDone describes one extend round of a hold.
type ExtendDone struct {
	Name  string
	Kind  Kind // what the lock is: a NetMutex, a NetRWMutex's read lease or write lock, or a Semaphore's lease
	Token uint64
	Took  time.Duration
	// Err is nil when the hold's local deadline moved; ErrLockLost when its
	// key was gone or taken; another error (nodes not answering) leaves
	// the hold as it was, to be extended again before its deadline.
	Err error
}

// LostHold describes a hold that was lost.
type LostHold struct {
	Name   string
	Kind   Kind // what the lock is: a NetMutex, a NetRWMutex's read lease or write lock, or a Semaphore's lease
	Token  uint64
	Reason LostReason
}

// A LostReason says how a hold was found lost.
type LostReason string

// The reasons a hold is lost.
const (
	// LostDeadline: its local deadline passed without a successful extend
	// (Redis down, slow or partitioned for longer than the validity).
	LostDeadline LostReason = "deadline"
	// LostExtend: an extend found the key gone or taken (it expired,
	// was deleted, evicted, or lost in a failover).
	LostExtend LostReason = "extend"
	// LostLateExtend: an extend succeeded in Redis, but its reply came
	// after the local deadline had passed.
	LostLateExtend LostReason = "late_extend"
	// LostRelease: the release at Unlock found the key gone or taken.
	LostRelease LostReason = "release"
	// LostMaxHold: the hold lasted the bound WithMaxHold sets.
	LostMaxHold LostReason = "max_hold"
)

// log returns m's logger if it logs at level, nil otherwise. Without
// WithLogger, netlock logs to slog.Default() at Warn and above.
func (m *engine) log(ctx context.Context, level slog.Level) *slog.Logger {
	l := m.cfg.logger
	if l == nil {
		if level < slog.LevelWarn {
			return nil
		}
		l = slog.Default()
	}
	if !l.Enabled(ctx, level) {
		return nil
	}
	return l
}

// startAcquire tells the observer and the debug log that an acquire call
// begins, and returns the function to call as it returns.
func (m *engine) startAcquire(ctx context.Context, try bool) (context.Context, func(acquired, contended, handedOver bool, err error)) {
	o := m.cfg.observer.Acquire
	debug := m.log(ctx, slog.LevelDebug)
	if o == nil && debug == nil {
		return ctx, nil
	}
	start := m.clk.Now()
	var done func(AcquireDone)
	if o != nil {
		var octx context.Context
		if octx, done = o(ctx, AcquireStart{Name: m.name, Kind: m.leaseKind.observed(), Try: try}); octx != nil {
			ctx = octx
		}
	}
	return ctx, func(acquired, contended, handedOver bool, err error) {
		d := AcquireDone{Name: m.name, Kind: m.leaseKind.observed(), Try: try, Acquired: acquired, Wait: m.clk.Since(start), Contended: contended, HandedOver: handedOver, Err: err}
		if acquired {
			d.Token = m.token()
		}
		if debug != nil {
			debug.LogAttrs(ctx, slog.LevelDebug, "netlock: acquire", m.lockAttr(), slog.Bool("acquired", acquired),
				slog.Uint64("token", d.Token), slog.Duration("wait", d.Wait), slog.Bool("contended", contended), slog.Bool("handed_over", handedOver), errAttr(err))
		}
		if done != nil {
			done(d)
		}
	}
}

// unlocked tells the observer, and the log, how an UnlockCtx of h ended.
func (m *engine) unlocked(ctx context.Context, h *hold, held time.Duration, handedOver bool, err error) {
	if err != nil {
		// A lost hold was logged when it was found lost.
		if l := m.log(ctx, slog.LevelWarn); l != nil && !errors.Is(err, ErrLockLost) {
			msg := "netlock: release not delivered to every node; nothing will send it again (the key expires with its TTL)"
			if m.resending(h.value) {
				msg = "netlock: release not delivered to every node; it is sent again in the background until delivered"
			}
			l.LogAttrs(ctx, slog.LevelWarn, msg, m.lockAttr(), slog.Uint64("token", h.token), errAttr(err))
		}
	} else if l := m.log(ctx, slog.LevelDebug); l != nil {
		l.LogAttrs(ctx, slog.LevelDebug, "netlock: unlock", m.lockAttr(), slog.Uint64("token", h.token), slog.Duration("held", held), slog.Bool("handed_over", handedOver))
	}
	if o := m.cfg.observer.Unlock; o != nil {
		o(ctx, UnlockDone{Name: m.name, Kind: m.leaseKind.observed(), Token: h.token, Held: held, HandedOver: handedOver, Err: err})
	}
}

// extended tells the observer, and the debug log, how an extend round of h
// ended.
func (m *engine) extended(ctx context.Context, h *hold, took time.Duration, err error) {
	if l := m.log(ctx, slog.LevelDebug); l != nil {
		l.LogAttrs(ctx, slog.LevelDebug, "netlock: extend", m.lockAttr(), slog.Uint64("token", h.token), slog.Duration("took", took), errAttr(err))
	}
	if o := m.cfg.observer.Extend; o != nil {
		o(ctx, ExtendDone{Name: m.name, Kind: m.leaseKind.observed(), Token: h.token, Took: took, Err: err})
	}
}

// lostHold tells the observer, and the log at Warn, that h was lost.
func (m *engine) lostHold(h *hold, reason LostReason) {
	level := slog.LevelWarn
	if reason == LostMaxHold {
		level = slog.LevelInfo // the end WithMaxHold asked for
	}
	if l := m.log(context.Background(), level); l != nil {
		l.LogAttrs(context.Background(), level, "netlock: lock lost", m.lockAttr(), slog.Uint64("token", h.token), slog.String("reason", string(reason)))
	}
	if o := m.cfg.observer.Lost; o != nil {
		o(LostHold{Name: m.name, Kind: m.leaseKind.observed(), Token: h.token, Reason: reason})
	}
}

// reapGaveUp logs that the reaper stopped delivering release p: at Warn for
// the release of a hold, at Debug for that of an acquire no node granted
// (its call may have reached the node; nothing was held).
func (m *engine) reapGaveUp(p pendingRelease, why string, err error) {
	level := slog.LevelWarn
	if !p.held {
		level = slog.LevelDebug
	}
	if l := m.log(context.Background(), level); l != nil {
		l.LogAttrs(context.Background(), level, "netlock: gave up delivering a release", m.lockAttr(), slog.Int("node", p.node), slog.String("reason", why), errAttr(err))
	}
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

// Kind tells what an Observer's event is about.
type Kind string

const (
	KindMutex Kind = "mutex" // a NetMutex
	KindRead  Kind = "read"  // a NetRWMutex's read lease
	KindWrite Kind = "write" // a NetRWMutex's write lock
	// KindSemaphore: a Semaphore's lease (its process's permits); its
	// acquires and extends, and its loss.
	KindSemaphore Kind = "semaphore"
	// KindMulti: a MultiMutex's hold of all its names.
	KindMulti Kind = "multi"
	// KindElection: an Election's leadership; its campaign (an acquire),
	// extends, Resign (an unlock) and loss.
	KindElection Kind = "election"
	// KindOnce: a Once's lock; a Do's wait for it (an acquire), the run's
	// extends, its release (an unlock) and loss.
	KindOnce Kind = "once"
)

// lockAttr names the lock in a log record: its name, and for a NetRWMutex
// which side ("lock", "name (read)").
func (m *engine) lockAttr() slog.Attr {
	if k := m.leaseKind.observed(); k != KindMutex {
		return slog.String("lock", m.name+" ("+string(k)+")")
	}
	return slog.String("lock", m.name)
}
