package netlock

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/netlock-go/netlock/internal/keyspace"
)

// A NetRWMutex is a reader/writer mutual exclusion lock shared across
// processes and machines through Redis: any number of readers, or one
// writer, among every client of the name. Its methods are sync.RWMutex's,
// with a ctx layer (LockCtx, RLockCtx, TryLockCtx, TryRLockCtx, UnlockCtx,
// RUnlockCtx) that returns errors instead of panicking, as NetMutex's does.
//
// The rules are sync.RWMutex's, across processes: a writer waiting keeps
// new readers out, so a stream of readers cannot starve it; readers that
// were waiting when a writer leaves all get in before any writer that came
// after them; writers get in in order of arrival (between processes, as
// for NetMutex, apart from the local hand-offs below). A waiter whose
// process died keeps its place for at most three expiries.
//
// The readers of one process share one read lease in Redis: a thousand
// reading goroutines cost one lease, one extend per interval and one
// release. A reader that arrives while the lease is held joins it without a
// round trip, unless a writer (of this process or another) waits: then it
// waits for the lease to end and queues in Redis behind that writer. The
// process learns that a writer waits from the lease's acquire and extends
// (at least every expiry/3) and at once when the writer is of this process;
// a writer of another process can thus wait up to an extend interval, plus
// the read sections under way, for the lease to end.
//
// While a writer of this process holds or waits for the write lock, the
// process serves its own goroutines under it by sync.RWMutex's rule (other
// processes are kept out already): Unlock hands the write lock to the
// goroutines of this process that wait next, the readers among them
// together, and a reader that arrives while readers hold it joins them,
// all without a round trip, up to WithLocalHandoffs times in a row (as
// NetMutex's Unlock); then it is released in Redis. The readers do so
// when the process's read sections are short beside a round trip to Redis
// (on average under twice the shortest release it measured): sharing the
// write lock then saves the lease taken and given back around each
// writer. Longer read sections take a read lease, to read alongside the
// readers of other processes. A write lock handed to another writer keeps
// its fencing token, as NetMutex's does.
//
// Over one backend (as for NetMutex: see WithSyncReplicas), a release
// lets the waiters in itself, in its script: the last read lease's release
// (or a writer's leave) grants the first writer the write lock, and a
// writer's release grants the processes whose readers wait ahead of the
// next writer their leases; each is told by a message on a channel of its
// own and holds without a round trip. A grant that nobody hears (its
// process died) is undone at once; one heard but never taken up expires
// with its lease, or is released when its waiter gives up. Over a quorum,
// the waiters are told to attempt instead.
//
// Leases and the write lock expire when their process dies and are
// extended while it lives (WithAutoExtend); a hold that lapses is told by
// the local clock, on Lost (the writer) and RLost (the readers). The
// writer's fencing tokens (Token) come from the counter NetMutex uses, and
// strictly increase with every write lock.
//
// A NetRWMutex must be created with NewRW and must not be copied after first
// use.
type NetRWMutex struct {
	w    *engine // the write lock; readers may share it (see sharesWrite)
	r    *engine // the read lease, shared by this process's readers
	keys rwKeys
	// joined is the channel where a writer taking its place is told:
	// p{name}:rw:joined.
	joined string

	// mu guards what follows. Lock order: mu before w.mu (enterShared,
	// readHold), never the other way.
	mu sync.Mutex
	// writers counts the goroutines of this process between LockCtx and
	// UnlockCtx (waiting or holding): while there are any, readers do not
	// join the lease.
	writers int
	readers int   // goroutines holding a read lock, on lease
	lease   *hold // the read lease they share; nil when none
	// leaseEnd is closed when lease is released (its last reader left).
	leaseEnd chan struct{}
	// leasing is non-nil while a reader acquires a lease in Redis; it is
	// closed when that attempt ends. leaseFrom is the leasing of the
	// attempt that acquired lease: the readers that waited for it may join.
	leasing   chan struct{}
	leaseFrom chan struct{}
	// listen hears, while the lease is held (or being acquired), of
	// writers of other processes taking their places.
	listen *leaseWatch
	// changed, while readers wait for the lease to become joinable, is
	// closed when they should look again (see awaitJoinable). recheckDue:
	// a writer gave its place up; the next reader that may not join asks
	// the nodes whether one still waits (see lookLocked).
	changed    chan struct{}
	recheckDue bool

	// sections measures this process's read sections, for sharesWrite.
	sections sectionMeter
}

// NewRW returns a NetRWMutex for the lock called name on backends, with the
// options of New (a quorum over several backends grants each read lease and
// the write lock by majority, the writer's fencing ballot as NetMutex's). It
// validates its input as New does and does not contact Redis. A NetRWMutex
// and a NetMutex of the same name are different locks.
func NewRW(name string, backends []Backend, opts ...Option) (*NetRWMutex, error) {
	cfg, err := newCheckedConfig(name, backends, opts)
	if err != nil {
		return nil, err
	}
	k := keyspace.RW(cfg.prefix, name, cfg.fencing)
	placeMS := strconv.FormatInt(placeExpiries*cfg.expiry.Milliseconds(), 10)
	side := func(mode byte) func(m *engine) kind {
		return func(m *engine) kind { return &rwSide{m: m, mode: mode, keys: k, placeMS: placeMS} }
	}
	tomb := keyspace.Tomb(k.Writer, "")
	w, err := newEngine(name, backends, cfg, spec{
		keys:       newKeys(cfg.prefix, name, cfg.fencing),
		tombPrefix: tomb,
		waitChan:   func(id string, _ bool) string { return k.Channel + ":w:" + id },
		kind:       side('w'),
	})
	if err != nil {
		return nil, err
	}
	// WithMinHold bounds the write lock; a read lease, shared by readers
	// that come and go, ends when the last one leaves.
	cfg.minHold = 0
	r, err := newEngine(name, backends, cfg, spec{
		keys:       newKeys(cfg.prefix, name, cfg.fencing),
		tombPrefix: tomb,
		// A release grants a waiter its hold in its own script where it
		// would grant a NetMutex's (engine.grants: one backend, whose
		// PUBLISH counts the listeners, without WithSyncReplicas), and
		// tells the waiter alone: a writer, or a process's reader, on a
		// channel of its own. Otherwise readers are told together, to
		// attempt; a writer alone (see lua/rw_wake.lua).
		waitChan: func(id string, grants bool) string {
			if grants {
				return k.Channel + ":r:" + id
			}
			return k.Channel + ":r"
		},
		// A read lease is a member of a sorted set: its value carries the
		// holder (see lua/rw_acquire.lua).
		leases: true,
		kind:   side('r'),
	})
	if err != nil {
		return nil, err
	}
	return &NetRWMutex{w: w, r: r, keys: k, joined: k.Joined}, nil
}

// Name returns the lock's name, as given to NewRW.
func (rw *NetRWMutex) Name() string {
	if rw == nil || rw.w == nil {
		return ""
	}
	return rw.w.name
}

func (rw *NetRWMutex) check() error {
	if rw == nil || rw.w == nil {
		return errZeroRW
	}
	return nil
}

// errZeroRW is returned by a NetRWMutex that was not made by NewRW.
var errZeroRW = errors.New("netlock: NetRWMutex not created by NewRW (the zero value is not usable)")

// Lock locks rw for writing, blocking until no reader or writer holds it,
// however long that takes. It panics with the error if Redis cannot be
// asked, as NetMutex.Lock does.
func (rw *NetRWMutex) Lock() {
	if err := rw.LockCtx(context.Background()); err != nil {
		panic(err)
	}
}

// Unlock unlocks rw for writing. Like sync.RWMutex.Unlock, it panics only if
// rw is not locked for writing (a panic whose value matches ErrNotHeld);
// whatever Redis does, it returns with rw unlocked in this process.
func (rw *NetRWMutex) Unlock() {
	err := rw.UnlockCtx(context.Background())
	switch {
	case errors.Is(err, ErrNotHeld):
		panic(errUnlockUnlocked)
	case errors.Is(err, errZeroRW):
		panic(err)
	}
}

// RLock locks rw for reading, blocking while a writer holds it or waits for
// it. It panics with the error if Redis cannot be asked.
func (rw *NetRWMutex) RLock() {
	if err := rw.RLockCtx(context.Background()); err != nil {
		panic(err)
	}
}

// RUnlock undoes a single RLock. Like sync.RWMutex.RUnlock, it panics if rw
// is not locked for reading (a panic whose value matches ErrNotHeld).
func (rw *NetRWMutex) RUnlock() {
	err := rw.RUnlockCtx(context.Background())
	switch {
	case errors.Is(err, ErrNotHeld):
		panic(errRUnlockUnlocked)
	case errors.Is(err, errZeroRW):
		panic(err)
	}
}

// errRUnlockUnlocked is RUnlock's panic value when rw is not read-locked,
// in the words sync.RWMutex uses.
var errRUnlockUnlocked = &wrapError{msg: "netlock: RUnlock of unlocked RWMutex", err: ErrNotHeld}

// TryLock tries to lock rw for writing once, without waiting, and reports
// whether it succeeded. It panics with the error if Redis could not be
// asked.
func (rw *NetRWMutex) TryLock() bool {
	ok, err := rw.TryLockCtx(context.Background())
	if err != nil {
		panic(err)
	}
	return ok
}

// TryRLock tries to lock rw for reading once, without waiting, and reports
// whether it succeeded. It panics with the error if Redis could not be
// asked.
func (rw *NetRWMutex) TryRLock() bool {
	ok, err := rw.TryRLockCtx(context.Background())
	if err != nil {
		panic(err)
	}
	return ok
}

// RLocker returns a sync.Locker whose Lock and Unlock call rw.RLock and
// rw.RUnlock.
func (rw *NetRWMutex) RLocker() sync.Locker { return (*rlocker)(rw) }

type rlocker NetRWMutex

func (r *rlocker) Lock()   { (*NetRWMutex)(r).RLock() }
func (r *rlocker) Unlock() { (*NetRWMutex)(r).RUnlock() }

// Token returns the fencing token of the current write lock: strictly
// increasing with every write lock of this name, across all clients (the
// counter NetMutex uses). 0 when rw is not locked for writing or fencing is
// off. Readers have no token: they do not write.
func (rw *NetRWMutex) Token() uint64 {
	if h := rw.writeHold(); h != nil {
		return h.token
	}
	return 0
}

// writeHold returns the hold of this process's writer, nil when no writer
// holds.
func (rw *NetRWMutex) writeHold() *hold {
	if rw == nil || rw.w == nil {
		return nil
	}
	return rw.w.exclusiveHold()
}

// readHold returns the hold this process's readers share, and how many
// read: the read lease, or the write lock they read under; nil when none.
func (rw *NetRWMutex) readHold() (*hold, int) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.lease != nil {
		return rw.lease, rw.readers
	}
	rw.w.mu.Lock()
	defer rw.w.mu.Unlock()
	if rw.w.shared > 0 && rw.w.hold != nil {
		return rw.w.hold, rw.w.shared
	}
	return nil, 0
}

// Lost returns a channel closed when the current write lock ends without
// this client's say (as NetMutex.Lost), or when it is released. A closed
// channel when rw is not locked for writing.
func (rw *NetRWMutex) Lost() <-chan struct{} {
	if h := rw.writeHold(); h != nil {
		return h.lostChan()
	}
	return closedChan
}

// RLost returns a channel closed when this process's read lease ends without
// its say: its local deadline passed without a successful extend, or an
// extend found it gone. Every reader of the process shares the lease, so
// every one of them should stop reading then. It is also closed when the
// lease is released (the last reader's RUnlock). A closed channel when rw is
// not locked for reading.
func (rw *NetRWMutex) RLost() <-chan struct{} {
	if rw == nil || rw.w == nil {
		return closedChan
	}
	if h, _ := rw.readHold(); h != nil {
		return h.lostChan()
	}
	return closedChan
}

// LockCtx locks rw for writing, waiting until no reader or writer of any
// process holds it, until ctx ends. Its errors are NetMutex.LockCtx's: an
// error matching ctx's error and ErrNotObtained (or ErrQuorum if Redis did
// not answer the last attempt) if ctx ends first, with nothing left held or
// queued; an error matching ErrQuorum if Redis could not be asked for the
// outage window.
func (rw *NetRWMutex) LockCtx(ctx context.Context) error {
	if err := rw.check(); err != nil {
		return err
	}
	rw.mu.Lock()
	rw.writers++
	rw.mu.Unlock()
	if err := rw.w.lockCtx(ctx); err != nil {
		rw.writerLeft()
		return err
	}
	return nil
}

// TryLockCtx tries to lock rw for writing once, without waiting. It returns
// (false, nil) when a reader or writer holds rw or a waiter came first, and
// (false, err) when Redis could not be asked.
func (rw *NetRWMutex) TryLockCtx(ctx context.Context) (bool, error) {
	if err := rw.check(); err != nil {
		return false, err
	}
	rw.mu.Lock()
	if rw.lease != nil || rw.leasing != nil {
		rw.mu.Unlock()
		return false, nil // our own readers hold rw, or are about to
	}
	rw.writers++
	rw.mu.Unlock()
	ok, err := rw.w.tryLockCtx(ctx)
	if !ok {
		rw.writerLeft()
	}
	return ok, err
}

// UnlockCtx unlocks rw for writing. It returns ErrNotHeld if rw is not
// locked for writing, ErrLockLost if the write lock had been lost; rw is
// unlocked in this process afterwards whatever it returns.
func (rw *NetRWMutex) UnlockCtx(ctx context.Context) error {
	if err := rw.check(); err != nil {
		return err
	}
	err := rw.w.unlockCtx(ctx)
	if errors.Is(err, ErrNotHeld) {
		return err
	}
	rw.writerLeft()
	return err
}

func (rw *NetRWMutex) writerLeft() {
	rw.mu.Lock()
	rw.writers--
	if rw.writers == 0 {
		rw.changedLocked()
	}
	rw.mu.Unlock()
}

// changedLocked wakes the readers waiting for the lease to become joinable
// (awaitJoinable) to look again. The caller holds rw.mu.
func (rw *NetRWMutex) changedLocked() {
	if rw.changed != nil {
		close(rw.changed)
		rw.changed = nil
	}
}

// lookLocked takes in what the lease's watch heard: a writer taking its
// place keeps readers from joining; one giving it up (or a message maybe
// lost) makes a reader that may not join ask the nodes again (recheck).
// The caller holds rw.mu, and rw.lease is set.
func (rw *NetRWMutex) lookLocked() {
	joined, left := rw.listen.heard()
	if joined {
		rw.lease.writerWaits.Store(true)
	}
	if left && rw.lease.writerWaits.Load() {
		rw.recheckDue = true // the nodes know which came last
	}
}

// recheck asks the nodes, with an extend of lease, whether a writer still
// waits, and wakes the readers waiting to join it to look again.
func (rw *NetRWMutex) recheck(lease *hold) {
	rw.r.extendRound(context.Background(), lease)
	rw.mu.Lock()
	rw.changedLocked()
	rw.mu.Unlock()
}

// awaitJoinable waits, for a reader that may not join the lease (a writer
// waits), until the lease ends or may be joined again: no writer of this
// process waits any more (writerLeft), or a writer of another process gave
// its place up ("l" on the lease's watch: the lease's extend then asks the
// nodes whether any writer still waits). The caller holds rw.mu, and
// rw.lease is set; awaitJoinable returns without it.
func (rw *NetRWMutex) awaitJoinable(ctx context.Context) error {
	if rw.changed == nil {
		rw.changed = make(chan struct{})
	}
	end, changed, lease, listen := rw.leaseEnd, rw.changed, rw.lease, rw.listen
	rw.mu.Unlock()
	select {
	case <-end:
	case <-changed:
	case p := <-listen.wake:
		switch p {
		case rwJoined:
			lease.writerWaits.Store(true)
		default: // a writer left; "": a connection failed, a message may be lost
			if lease.writerWaits.Load() {
				rw.recheck(lease)
			}
		}
	case <-ctx.Done():
		return notObtained(context.Cause(ctx))
	}
	return nil
}

// RLockCtx locks rw for reading, waiting while a writer holds it or waits
// for it, until ctx ends. A reader of this process joins the read lease its
// process holds, without a round trip, if no writer waits. Its errors are
// LockCtx's.
func (rw *NetRWMutex) RLockCtx(ctx context.Context) error {
	if err := rw.check(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		// Even where joining the lease needs no round trip: a caller
		// whose ctx has ended never holds rw.
		return notObtained(context.Cause(ctx))
	}
	err := rw.rlock(ctx)
	if err == nil {
		rw.sections.enter(rw.w.clk.Now())
	}
	return err
}

// TryRLockCtx tries to lock rw for reading once, without waiting. It
// returns (false, nil) when a writer holds rw or waits for it (or another
// goroutine of this process is acquiring the read lease), and (false, err)
// when Redis could not be asked.
func (rw *NetRWMutex) TryRLockCtx(ctx context.Context) (bool, error) {
	if err := rw.check(); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		// Even where joining the lease needs no round trip: a caller
		// whose ctx has ended never holds rw.
		return false, notObtained(context.Cause(ctx))
	}
	rw.mu.Lock()
	switch {
	case rw.lease != nil && rw.joinable():
		rw.readers++
		rw.mu.Unlock()
		rw.sections.enter(rw.w.clk.Now())
		return true, nil
	case rw.lease != nil || rw.leasing != nil:
		rw.mu.Unlock()
		return false, nil
	}
	if h, _, in, drained := rw.w.enterShared(false, rw.sharesWrite()); in || drained != nil || rw.writers > 0 {
		rw.mu.Unlock()
		if h == nil {
			return false, nil // a writer holds or waits
		}
		rw.sections.enter(rw.w.clk.Now())
		return true, nil // joined the readers under the write lock
	}
	leasing := make(chan struct{})
	rw.leasing = leasing
	rw.mu.Unlock()

	listen := rw.newLeaseWatch()
	ok, err := rw.r.tryLockCtx(ctx)

	rw.mu.Lock()
	rw.leasing = nil
	close(leasing)
	if ok {
		rw.leased(listen, leasing)
	}
	rw.mu.Unlock()
	if !ok {
		listen.stop()
		return false, err
	}
	rw.sections.enter(rw.w.clk.Now())
	return true, err
}

// RUnlockCtx undoes a single RLockCtx. It returns ErrNotHeld if rw is not
// locked for reading. The last reader of the process releases the lease:
// then it returns ErrLockLost if the lease had been lost.
func (rw *NetRWMutex) RUnlockCtx(ctx context.Context) error {
	if err := rw.check(); err != nil {
		return err
	}
	return rw.runlock(ctx)
}
