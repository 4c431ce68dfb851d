package netlock

import (
	"context"
	"errors"
	"strconv"
	"sync"
)

// A NetMutex is a mutual exclusion lock shared across processes and machines
// through Redis. Its Lock and Unlock methods make it a drop-in sync.Locker;
// the ctx methods (LockCtx, TryLockCtx, UnlockCtx, ExtendCtx) return errors
// instead of panicking and honour deadlines and cancellation.
//
// A NetMutex is safe for concurrent use by many goroutines, like sync.Mutex:
// goroutines of one process that share a NetMutex exclude each other locally,
// in order of arrival, and only one of them at a time talks to Redis to
// acquire. Unlock may be called from a goroutine other than the one that
// locked.
//
// After a failed acquire or an Unlock that could not reach every node, a
// NetMutex keeps one goroutine that delivers the release to those nodes when
// they answer again. It ends when all have answered, when their clients are
// closed, or after ten expiries.
//
// While goroutines of this process wait on a NetMutex, Unlock passes the
// hold straight to the first of them, without a round trip to Redis, a
// bounded number of times in a row (WithLocalHandoffs).
//
// A NetMutex must be created with New or Client.Mutex and must not be copied
// after first use.
type NetMutex struct {
	*engine // nil for a NetMutex not made by New or Client.Mutex
}

var _ sync.Locker = (*NetMutex)(nil)

// New returns a NetMutex for the lock called name on backends: one backend is
// a plain lock; several independent deployments make a quorum lock, held
// when a majority (len(backends)/2+1) of them grant it with the same fencing
// token. It validates name, backends and options and returns an error naming
// what is wrong; it does not contact Redis.
//
// For a quorum the backends must be independent deployments (not replicas of
// one another, not the same server twice), and their fence counters must
// survive restarts (appendonly yes, appendfsync always), or a node that lost
// them must be re-seeded before it rejoins.
//
// Every NetMutex with the same name, prefix and backends, in any process,
// excludes every other.
func New(name string, backends []Backend, opts ...Option) (*NetMutex, error) {
	m, err := newMutexEngine(name, backends, opts)
	if err != nil {
		return nil, err
	}
	return &NetMutex{m}, nil
}

// newMutexEngine returns the engine of a NetMutex: New's, which Inspect
// uses too.
func newMutexEngine(name string, backends []Backend, opts []Option) (*engine, error) {
	cfg, err := newCheckedConfig(name, backends, opts)
	if err != nil {
		return nil, err
	}
	return newEngine(name, backends, cfg, spec{
		keys: newKeys(cfg.prefix, name, cfg.fencing),
		kind: func(m *engine) kind { return mutexKind{m} },
	})
}

// Name returns the lock's name, as given to New.
func (m *NetMutex) Name() string {
	if m.check() != nil {
		return ""
	}
	return m.name
}

// Lock locks m, blocking until the lock is acquired, however long that takes.
// It panics with the error if acquiring fails for any other reason than
// contention: Redis unreachable, a quorum not answering, a key of the wrong
// type. Use LockCtx to bound the wait and get the error instead.
func (m *NetMutex) Lock() {
	if err := m.LockCtx(context.Background()); err != nil {
		panic(err)
	}
}

// TryLock tries to lock m once, without waiting, and reports whether it
// succeeded, like sync.Mutex.TryLock. It returns false if another goroutine
// of this process holds m or another client holds the lock. It panics with
// the error if Redis could not be asked.
func (m *NetMutex) TryLock() bool {
	ok, err := m.TryLockCtx(context.Background())
	if err != nil {
		panic(err)
	}
	return ok
}

// Unlock unlocks m. Like sync.Mutex.Unlock, it panics only on misuse: if m
// is not locked (a panic whose value matches ErrNotHeld), or was not made by
// New or Client.Mutex. Whatever Redis does, it returns, with m unlocked in
// this process: a hold that had been lost is logged at Warn (and Lost was
// closed when it was found lost); a release that could not reach every node
// is logged at Warn and delivered in the background when the nodes answer.
// Use UnlockCtx to get these as errors.
func (m *NetMutex) Unlock() {
	err := m.UnlockCtx(context.Background())
	switch {
	case errors.Is(err, ErrNotHeld):
		panic(errUnlockUnlocked)
	case errors.Is(err, errZero):
		panic(err)
	}
}

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
func (m *NetMutex) LockCtx(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	return m.lockCtx(ctx)
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
	return m.tryLockCtx(ctx)
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
	return m.unlockCtx(ctx)
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
	return m.extendCtx(ctx)
}

// Token returns the fencing token of the current hold: a number that strictly
// increases with every acquisition of this lock name, across all clients.
// Pass it to the resource the lock protects, which must reject a write whose
// token is below the highest it has seen. It returns 0 when m is not locked
// or fencing is off. After the hold is lost, it returns the lost hold's token
// until Unlock.
func (m *NetMutex) Token() uint64 {
	if m.check() != nil {
		return 0
	}
	return m.token()
}

// Lost returns a channel that is closed when the current hold ends without
// this client's say: its local deadline passed without a successful extend,
// or an extend found the key gone or taken. The channel is also closed when
// the hold is released by Unlock, so a goroutine watching it never outlives
// the hold. When m is not locked, Lost returns a closed channel.
func (m *NetMutex) Lost() <-chan struct{} {
	if m.check() != nil {
		return closedChan
	}
	return m.lostChan()
}

// check returns errZero for a NetMutex not made by New or Client.Mutex.
func (m *NetMutex) check() error {
	if m == nil || m.engine == nil {
		return errZero
	}
	return nil
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
	return runLocked(ctx, m.engine, fn)
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
	result, err = runLocked(ctx, m.engine, fn)
	return result, true, err
}

// mutexKind is the kind of a NetMutex: one key, one owner (lua/acquire.lua,
// release.lua, extend.lua, leave.lua).
type mutexKind struct {
	m *engine
}

func (mutexKind) observed() Kind { return KindMutex }

func (k mutexKind) acquireCall(value, tomb, proposal string, q ask) (*Script, []string, []string) {
	m := k.m
	arg := m.freeArg // an uncontended attempt on one node
	if proposal != "0" || q != (ask{}) {
		arg = m.acquireArg(proposal, q)
	}
	keys, args := m.keys.lockCall(tomb, value, m.expiryMS, arg)
	return acquireScript, keys, args
}

func (k mutexKind) releaseCall(value, tomb string) (*Script, []string, []string) {
	m := k.m
	keys, args := m.keys.lockCall(tomb, value, m.tombMS, m.wakeTries)
	return releaseScript, keys, args
}

func (k mutexKind) extendCall(value string) (*Script, []string, []string) {
	m := k.m
	return extendScript, m.extendKeys, []string{value, m.expiryMS, m.queueMS}
}

// keepCall returns the extend script, keys and arguments that set the key
// of value to expire in ms (WithMinHold: a hold released early keeps
// excluding until then).
func (k mutexKind) keepCall(value string, ms int64) (*Script, []string, []string) {
	m := k.m
	return extendScript, m.extendKeys, []string{value, strconv.FormatInt(ms, 10), m.queueMS}
}

func (k mutexKind) leaveCall(member string) (*Script, []string, []string) {
	m := k.m
	keys := []string{m.keys.waiters, m.keys.lock, m.keys.fence}
	if m.keys.fence == "" {
		keys = keys[:2]
	}
	return leaveScript, keys, []string{member, m.wakeTries}
}

// waitFlags: join the queue while listening (at its head if a turn was
// lost), leave it on success if we may be in it. A waiter that cannot
// listen polls without a place.
func (mutexKind) waitFlags(listening, turn, queued bool) string {
	switch {
	case listening && turn && queued:
		return "jtq"
	case listening && turn:
		return "jt"
	case listening && queued:
		return "jq"
	case listening:
		return "j"
	case queued:
		return "q"
	}
	return ""
}

// exclusiveRule is the local admission rule of a lock with one owner (a
// NetMutex; an Election's and a MultiMutex's kinds): a hold given back goes
// to the first goroutine in line, within the hand-off budget.
type exclusiveRule struct{}

func (exclusiveRule) admitLocked(m *engine, h *hold, n int64) (rest int64, handed int) {
	if len(m.waiters) == 0 || !m.mayHandOffLocked(h) {
		return n, 0
	}
	m.handOffLocked(m.waiters[0], h)
	return n - 1, 1
}

// leftLocked: nothing is left to do; another goroutine's place is this
// process's only.
func (exclusiveRule) leftLocked(*engine, *localWaiter, int) func(context.Context) { return nil }

// unwanted unlocks the hold handed to w, which goes to the next in line or
// back to Redis.
func (exclusiveRule) unwanted(ctx context.Context, m *engine, w *localWaiter) {
	m.unlock(ctx, w.shared)
}
