package netlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

// sharesWrite reports whether this process's readers read under its write
// lock while one of its writers holds or waits for it (see enterShared),
// rather than on a read lease of their own: when its read sections are
// short beside a round trip to Redis. Then sharing the write lock costs
// nothing and saves the round trips of a lease taken and given back around
// each writer; readers of other processes wait meanwhile, as for a
// NetMutex within its hand-off bound. Longer sections gain more from
// reading alongside other processes, on a lease. The caller holds rw.mu.
func (rw *NetRWMutex) sharesWrite() bool {
	rtt := rw.w.rtt.Load()
	if r := rw.r.rtt.Load(); r > 0 && (rtt == 0 || r < rtt) {
		rtt = r
	}
	return rtt == 0 || rw.sections.mean() < shareWriteRTTs*time.Duration(rtt)
}

// shareWriteRTTs: read sections shorter on average than this many round
// trips share the write lock (see sharesWrite).
const shareWriteRTTs = 2

// A leaseWatch listens on a NetRWMutex's channel p{name}:rw:joined, where
// lua/rw_acquire.lua tells of a writer taking its place, on every node with a Hub,
// while its process holds a read lease, to hear at once of a writer taking
// its place: from then on no more readers of the process share the lease.
// Where the channel is subscribed already (a lease of this process held a
// moment ago) it costs no I/O; otherwise it subscribes in the background, each node's subscription bounded by the node timeout. A
// writer missed (one that took its place as the lease was being taken,
// before the subscription was confirmed, or a burst of messages beyond the
// buffer) is learned from the lease's next extend.
type leaseWatch struct {
	wake    chan string
	mu      sync.Mutex
	watches []*watch
	stopped bool
}

// leaseWatchBuffer: messages the lease watch keeps between two looks.
const leaseWatchBuffer = 16

func (rw *NetRWMutex) newLeaseWatch() *leaseWatch {
	r := rw.r
	lw := &leaseWatch{wake: make(chan string, leaseWatchBuffer)}
	for i, h := range r.hubs {
		if h == nil {
			continue
		}
		if wt := h.join(rw.joined, lw.wake); wt != nil {
			lw.mu.Lock() // a node's subscription made in the background appends too
			lw.watches = append(lw.watches, wt)
			lw.mu.Unlock()
			continue
		}
		go func() {
			wt, _ := r.watchChannel(context.Background(), i, rw.joined, lw.wake)
			if wt == nil {
				return
			}
			lw.mu.Lock()
			defer lw.mu.Unlock()
			if lw.stopped {
				wt.stop()
				return
			}
			lw.watches = append(lw.watches, wt)
		}()
	}
	return lw
}

// heard reports whether a writer took its place since the last look, and
// whether one gave its place up (or a connection failed, which may have
// lost a message).
func (lw *leaseWatch) heard() (joined, left bool) {
	for {
		select {
		case p := <-lw.wake:
			joined = joined || p == rwJoined
			left = left || p != rwJoined
		default:
			return joined, left
		}
	}
}

// What lua/rw_acquire.lua and lua/rw_leave.lua publish on p{name}:rw:joined.
const (
	rwJoined = "j" // a writer took its place
	rwLeft   = "l" // a writer gave its place up
)

func (lw *leaseWatch) stop() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.stopped = true
	for _, wt := range lw.watches {
		wt.stop()
	}
}

// placeExpiries: a waiter of a NetRWMutex keeps its place in Redis for
// three expiries after the attempt that last renewed it (an attempt renews
// a place with less than half of that left; a waiter attempts at least
// every expiry): a waiter whose process died keeps others out for at most
// that long.
const placeExpiries = 3

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

// rwKeys are the Redis keys of a NetRWMutex (see lua/rw_acquire.lua).
type rwKeys = keyspace.RWKeys

// rwSide is the kind of a NetRWMutex's read lease (mode 'r') or write lock
// ('w'): lua/rw_acquire.lua, rw_release.lua, rw_extend.lua, rw_leave.lua,
// whose argument starts with the mode.
type rwSide struct {
	m       *engine
	mode    byte
	keys    rwKeys
	placeMS string // how long a waiter's place lasts: placeExpiries
}

func (s *rwSide) observed() Kind {
	if s.mode == 'r' {
		return KindRead
	}
	return KindWrite
}

func (s *rwSide) acquireCall(value, tomb, proposal string, q ask) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writer, tomb, k.Writers, k.Readers, k.Leases}
	if s.mode == 'w' && k.Fence != "" {
		keys = append(keys, k.Fence)
	}
	flags := ""
	if strings.Contains(q.flags, "q") {
		flags = "q"
	}
	return rwAcquireScript, keys, []string{string(s.mode) + ":" + value + ":" + s.m.expiryMS + ":" + proposal + ":" + q.member + ":" + flags + ":" + s.placeMS + ":" + strconv.FormatInt(q.arrival, 10) + ":" + s.m.holder}
}

// acquireReply reads rw_acquire.lua's reply: acquire.lua's, except that a
// reader's third integer says whether a writer waits, and a fourth that a
// release granted its lease.
func (s *rwSide) acquireReply(vals []int64) acquireReply {
	r := readAcquire(vals)
	if s.mode == 'r' && r.status == acquireHeld {
		r.granted, r.writerWaits = 0, vals[2] == 1
		if len(vals) > 3 {
			r.granted = vals[3]
		}
	}
	return r
}

func (s *rwSide) releaseCall(value, tomb string) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writer, tomb, k.Writers, k.Readers, k.Leases}
	if k.Fence != "" {
		keys = append(keys, k.Fence) // a writer granted the lock takes its token
	}
	return rwReleaseScript, keys, []string{string(s.mode) + ":" + value + ":" + s.m.tombMS}
}

func (s *rwSide) extendCall(value string) (*Script, []string, []string) {
	k := s.keys
	return rwExtendScript, []string{k.Writer, k.Leases, k.Writers}, []string{string(s.mode) + ":" + value + ":" + s.m.expiryMS}
}

func (s *rwSide) keepCall(value string, ms int64) (*Script, []string, []string) {
	k := s.keys
	return rwExtendScript, []string{k.Writer, k.Leases, k.Writers}, []string{string(s.mode) + ":" + value + ":" + strconv.FormatInt(ms, 10)}
}

// extended: what the nodes say now of a read lease: a writer that gave up
// no longer keeps this process's readers out.
func (s *rwSide) extended(h *hold, replies []nodeReply) {
	if s.mode == 'r' {
		h.writerWaits.Store(writerWaits(replies))
	}
}

func (s *rwSide) leaveCall(member string) (*Script, []string, []string) {
	k := s.keys
	keys := []string{k.Writers, k.Readers, k.Leases, k.Writer, k.Fence}
	if k.Fence == "" {
		keys = keys[:4]
	}
	return rwLeaveScript, keys, []string{member}
}

// waitFlags: a NetRWMutex's waiter always takes its place, even when it
// polls: the place is what keeps later readers (or writers) out.
func (s *rwSide) waitFlags(_, _, queued bool) string {
	if queued {
		return "jq"
	}
	return "j"
}

func (s *rwSide) ordered() bool { return true }

// messageGrant: a read lease has no token; the message's last number says
// whether a writer waits (see lua/rw_wake.lua).
func (s *rwSide) messageGrant(g *grant) {
	if s.mode == 'r' {
		g.token, g.writerWaits = 0, g.token == 1
	}
}

func (*rwSide) rule() localRule { return rwRule{} }

// rwRule is a NetRWMutex's local admission rule, sync.RWMutex's among the
// goroutines of its process under its write lock: a hold given back goes
// to the first in line, a writer alone or a reader with every reader
// waiting next to it (see enterShared); the readers waiting when a writer
// leaves all get in before a later writer.
type rwRule struct{ exclusiveRule }

func (rwRule) admitLocked(m *engine, h *hold, n int64) (rest int64, handed int) {
	rest, handed = exclusiveRule{}.admitLocked(m, h, n)
	if handed > 0 && m.shared > 0 { // a reader got it: the readers next to it too
		handed += m.admitSharedLocked(h)
	}
	return rest, handed
}

// writerWaits reports whether a node's reply to a read lease's extend says
// that a writer waits (see lua/rw_extend.lua).
func writerWaits(replies []nodeReply) bool {
	for _, r := range replies {
		if r.err == nil && r.vals[0] == releaseDone && len(r.vals) > 1 && r.vals[1] == 1 {
			return true
		}
	}
	return false
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

// rlock is RLockCtx: on the lease, or under the write lock (see
// sharesWrite).
func (rw *NetRWMutex) rlock(ctx context.Context) error {
	for {
		rw.mu.Lock()
		var in bool
		var err error
		switch {
		case rw.lease != nil:
			in, err = rw.joinLease(ctx)
		case rw.leasing != nil:
			in, err = rw.awaitLeasing(ctx, rw.leasing)
		default:
			h, w, shared, drained := rw.w.enterShared(true, rw.sharesWrite())
			switch {
			case shared:
				rw.mu.Unlock()
				if h != nil {
					return nil
				}
				return rw.w.awaitShared(ctx, w)
			case drained != nil:
				// Readers under the write lock: the lease waits for them.
				rw.mu.Unlock()
				err = awaitClose(ctx, drained)
			default:
				return rw.newLease(ctx)
			}
		}
		if in || err != nil {
			return err
		}
	}
}

// joinLease lets a reader join the lease this process holds if no writer
// waits; otherwise it waits until it may look again. The caller holds
// rw.mu, and rw.lease is set; joinLease returns without rw.mu.
func (rw *NetRWMutex) joinLease(ctx context.Context) (joined bool, err error) {
	if rw.joinable() {
		rw.readers++
		rw.mu.Unlock()
		return true, nil
	}
	if rw.recheckDue {
		rw.recheckDue = false
		lease := rw.lease
		rw.mu.Unlock()
		rw.recheck(lease)
		return false, nil
	}
	return false, rw.awaitJoinable(ctx)
}

// awaitLeasing waits for the lease another reader of this process is
// acquiring (leasing), and joins it. The caller holds rw.mu; awaitLeasing
// returns without it.
func (rw *NetRWMutex) awaitLeasing(ctx context.Context, leasing chan struct{}) (joined bool, err error) {
	rw.mu.Unlock()
	if err := awaitClose(ctx, leasing); err != nil {
		return false, err
	}
	// The readers that waited for a lease being acquired came before any
	// writer its acquire found waiting (that writer came after the
	// acquire, in Redis's order): they share it, as sync.RWMutex lets in
	// every reader waiting when a writer leaves.
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.lease != nil && rw.leaseFrom == leasing && ctx.Err() == nil {
		if _, held := rw.lease.deadline(); held {
			rw.readers++
			return true, nil
		}
	}
	return false, nil
}

// newLease acquires a read lease in Redis for this process's readers. The
// caller holds rw.mu; newLease returns without it.
func (rw *NetRWMutex) newLease(ctx context.Context) error {
	leasing := make(chan struct{})
	rw.leasing = leasing
	rw.mu.Unlock()

	listen := rw.newLeaseWatch()
	err := rw.r.lockCtx(ctx)

	rw.mu.Lock()
	rw.leasing = nil
	close(leasing)
	if err == nil {
		rw.leased(listen, leasing)
	}
	rw.mu.Unlock()
	if err != nil {
		listen.stop()
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

// leased records the read lease just acquired (or handed over) for the
// calling reader, and the watch that listens while it is held. The caller
// holds rw.mu.
func (rw *NetRWMutex) leased(listen *leaseWatch, from chan struct{}) {
	rw.leaseFrom = from
	rw.lease = rw.r.current()
	rw.readers = 1
	rw.leaseEnd = make(chan struct{})
	rw.listen = listen
}

// joinable reports whether a reader may join the lease: no writer of this
// process waits, none of another process is known to, and the lease is
// still held. The caller holds rw.mu, and rw.lease is set.
func (rw *NetRWMutex) joinable() bool {
	rw.lookLocked()
	if rw.writers > 0 || rw.lease.writerWaits.Load() {
		return false
	}
	_, held := rw.lease.deadline()
	return held
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

// runlock is RUnlockCtx: of a reader on the lease, or under the write lock.
func (rw *NetRWMutex) runlock(ctx context.Context) error {
	now := rw.w.clk.Now()
	rw.mu.Lock()
	if rw.readers == 0 {
		rw.mu.Unlock()
		// Not on a lease: on the write lock, or not read-locked.
		if rw.w.sharedHeld() {
			rw.sections.leave(now)
		}
		return rw.w.unlock(ctx, true)
	}
	rw.sections.leave(now)
	rw.readers--
	if rw.readers > 0 {
		rw.mu.Unlock()
		return nil
	}
	rw.lookLocked()
	lease, end, listen := rw.lease, rw.leaseEnd, rw.listen
	rw.lease, rw.leaseEnd, rw.listen = nil, nil, nil
	rw.recheckDue = false
	writerWaits := rw.writers > 0 || lease.writerWaits.Load()
	rw.mu.Unlock()
	listen.stop()
	if writerWaits {
		// A reader of this process waiting for the lease must not be
		// handed it: it queues in Redis, behind the writer.
		rw.r.noHandOff()
	}
	err := rw.r.unlockCtx(ctx)
	close(end)
	return err
}

// awaitClose waits until ch is closed or ctx ends; then it returns an error
// matching ErrNotObtained and ctx's cause.
func awaitClose(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return notObtained(context.Cause(ctx))
	}
}

// A sectionMeter measures the mean length of a process's read sections
// without pairing an RLock with its RUnlock (any goroutine may undo a read
// lock): by Little's law, as the time integral of the number of readers
// inside over the number of sections that ended.
type sectionMeter struct {
	mu     sync.Mutex
	inside int
	last   time.Time
	area   time.Duration // Σ readers inside × time, since the last sample
	ended  int           // sections ended since the last sample
	avg    atomic.Int64  // the mean, in ns, over the recent samples; 0 until measured
}

// sectionSample: sections per sample of a sectionMeter's mean.
const sectionSample = 16

func (s *sectionMeter) enter(now time.Time) {
	s.mu.Lock()
	s.addLocked(now)
	s.inside++
	s.mu.Unlock()
}

func (s *sectionMeter) leave(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(now)
	s.inside = max(s.inside-1, 0)
	if s.ended++; s.ended < sectionSample {
		return
	}
	sample := int64(s.area) / int64(s.ended)
	if old := s.avg.Load(); old > 0 {
		sample = (3*old + sample) / 4
	}
	s.avg.Store(max(sample, 1))
	s.area, s.ended = 0, 0
}

func (s *sectionMeter) addLocked(now time.Time) {
	if s.inside > 0 {
		s.area += time.Duration(s.inside) * now.Sub(s.last)
	}
	s.last = now
}

// mean returns the mean read section; 0 until measured.
func (s *sectionMeter) mean() time.Duration { return time.Duration(s.avg.Load()) }
