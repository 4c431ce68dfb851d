// Package otelnetlock provides an OpenTelemetry adapter for netlock: a
// netlock.Observer that turns what a NetMutex does into metrics and spans.
//
//	obs, err := otelnetlock.NewObserver() // the global providers
//	if err != nil { ... }
//	mu, err := netlock.New("orders", backends, netlock.WithObserver(obs))
//
// It is a module of its own, so that netlock itself does not depend on
// OpenTelemetry. One Observer may serve any number of NetMutexes.
//
// # Metrics
//
// Names follow the OpenTelemetry semantic conventions' style, after the
// database connection pool's db.client.connection.wait_time and use_time.
// Durations are float64 histograms in seconds, with bucket boundaries given
// as advice (a View of your own overrides them). Every instrument carries
// netlock.lock.name, unless WithMetricLockName leaves it out; and, for a
// netlock.NetRWMutex, netlock.lock.kind: "read" (the process's read lease)
// or "write" (the write lock). The acquire span carries both too.
//
//	name                        kind       unit    attributes
//	netlock.lock.wait_time      histogram  s       netlock.lock.name, netlock.acquire.try,
//	                                               netlock.acquire.outcome, netlock.acquire.contended,
//	                                               netlock.acquire.handed_over, error.type
//	netlock.lock.hold_time      histogram  s       netlock.lock.name, netlock.unlock.handed_over, error.type
//	netlock.lock.extend_time    histogram  s       netlock.lock.name, error.type
//	netlock.lock.lost_holds     counter    {hold}  netlock.lock.name, netlock.lost.reason
//	netlock.lock.errors         counter    {error} netlock.lock.name, netlock.operation, error.type
//
// netlock.lock.wait_time records every LockCtx and TryLockCtx (and so Lock,
// TryLock and Do): the time from the call's start to its return, whatever
// it returned. Its attributes:
//
//   - netlock.acquire.try: true for TryLock and TryLockCtx.
//   - netlock.acquire.outcome: "acquired" (the call holds the lock), "busy"
//     (TryLock found it held, in this process or elsewhere) or "error" (the
//     call returned an error; error.type says which).
//   - netlock.acquire.contended: the lock was held when the call began (a
//     TryLock that found it held, or a LockCtx that waited).
//   - netlock.acquire.handed_over: the hold came from a goroutine of this
//     process, without a round trip to Redis (netlock.WithLocalHandoffs).
//   - error.type: set only when the outcome is "error"; see below.
//
// Acquisitions and contention are not counters of their own: they are the
// count of this histogram, the way the semantic conventions count requests
// by the count of their duration histogram. Acquisitions are the count with
// outcome "acquired"; contended acquisitions, those with contended true as
// well; TryLocks that found the lock held, outcome "busy".
//
// netlock.lock.hold_time records every UnlockCtx (and so Unlock and Do) of a
// hold: the time from the acquire's return to the unlock. With
// netlock.unlock.handed_over true, the unlock passed the hold to a goroutine
// of this process waiting for it, whose own hold time starts then. error.type
// is set when UnlockCtx returned an error: "lock_lost" (the hold had been
// lost) or "quorum" (the release did not reach enough nodes; netlock
// delivers it later, in the background).
//
// netlock.lock.extend_time records every extend round, the watchdog's and
// ExtendCtx's: the time it took, and error.type when it failed.
//
// netlock.lock.lost_holds counts holds that were lost: their local deadline
// passed without a successful extend, or an extend or the release found
// their key gone or taken. Each lost hold counts once, when netlock learns
// of it; netlock.lost.reason says how (netlock.LostReason: "deadline",
// "extend", "late_extend", "release").
//
// netlock.lock.errors counts every error that an acquire, unlock or extend
// ended with, by netlock.operation ("acquire", "unlock", "extend") and
// error.type. A TryLock that finds the lock held is not an error.
//
// # Error types
//
// error.type classifies an error with errors.Is against netlock's sentinels
// and the context errors, in this order, the first match winning:
//
//	quorum             ErrQuorum: too few Redis nodes answered. A LockCtx whose
//	                   context ended while Redis was not answering counts here,
//	                   not as the context's end: Redis is what to look at.
//	lock_lost          ErrLockLost: the hold had been lost.
//	not_held           ErrNotHeld.
//	deadline_exceeded  context.DeadlineExceeded: the caller's deadline passed
//	                   while it waited (ErrNotObtained).
//	canceled           context.Canceled: the caller's context was cancelled
//	                   (ErrNotObtained).
//	not_obtained       ErrNotObtained otherwise: a context that ended with a
//	                   cause of its own (context.WithCancelCause).
//	_OTHER             anything else, the semantic conventions' fallback value.
//
// # Cardinality
//
// netlock.lock.name is the lock's name by default. An application that locks
// one name per user or per order would make a time series per name: give
// WithMetricLockName a function that maps a name to its kind ("order:42" to
// "order"), or that returns "" to leave the attribute out. Spans always
// carry the full name.
//
// # Traces
//
// Each LockCtx and TryLockCtx (and so Lock, TryLock and Do) makes one span,
// "netlock.acquire", of kind internal, started with the caller's context
// (so it is a child of the caller's span) and ended as the call returns. It
// carries netlock.lock.name and netlock.acquire.try from its start and, at
// its end, netlock.acquire.outcome, netlock.acquire.contended,
// netlock.acquire.handed_over, netlock.lock.token (the hold's fencing token;
// only when acquired with fencing on) and, on error, error.type. A call that
// returns an error records it (an "exception" event) and sets the span's
// status to Error; a TryLock that finds the lock held leaves the status
// unset. netlock.lock.wait_time is recorded with the span's context, so a
// metrics SDK that keeps exemplars links a slow wait to its trace.
//
// Unlocks, extends and lost holds make no spans: netlock tells the Observer
// of them without a context to parent them to.
package otelnetlock
